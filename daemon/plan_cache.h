// A bounded cache of sharding plans, so SubmitJob does not re-run the planner for every job of
// a shape it has planned before (a sweep, a resubmission, a stream of alike jobs). The planner
// (worker/plan/sharding_planner.h) is a pure function of the job and the planner options; the
// key is both, serialized deterministically, with the fields that name *which* files and
// which job rather than *what* is trained left out: name, scheduling, model.init_from, and the
// text of data.train / data.val / checkpoint.dir (each kept as "set or not", so a field whose
// presence matters to the plan still splits the key). Every other field, including ones added
// to JobSpec later, is part of the key: an unknown field can cost a miss, never a wrong plan.
// Least recently used plans go first. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/control.pb.h"
#include "proto/job.pb.h"
#include "worker/plan/sharding_planner.h"

namespace zt {

class PlanCache {
 public:
  // Holds at most `capacity` plans (≥ 1).
  explicit PlanCache(size_t capacity);

  // PlanSharding(job, options), from the cache when an equal key was planned before. Errors
  // are PlanSharding's and are not cached.
  absl::StatusOr<zerotrain::ShardingPlan> Plan(const zerotrain::JobSpec& job,
                                               const PlannerOptions& options);

  int64_t hits() const;
  int64_t misses() const;

  // The cache key of (job, options) (exposed for tests).
  static std::string KeyOf(const zerotrain::JobSpec& job, const PlannerOptions& options);

 private:
  using Entry = std::pair<std::string, zerotrain::ShardingPlan>;
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::list<Entry> recent_ ABSL_GUARDED_BY(mu_);  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_key_ ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zt
