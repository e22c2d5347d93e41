#pragma once

// Secondary indexes over the coordinator's jobs, kept in step with every change of a job's
// state, so that admitting a job never walks all of them: the count of jobs per state (the
// metrics), the queued jobs (the scheduling pass) and the checkpoint directories of unfinished
// jobs (the overlap check). Each of those walked the whole job map inside SubmitJob, four
// walks per submission, and with thousands of jobs kept (a busy coordinator, the
// control-plane benchmark) the walks were the largest part of the time under the lock.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "proto/control.pb.h"

namespace zt {

// `dir` made absolute and lexically normal, without a trailing separator (the root stays
// "/"). Lexical: symlinks are not followed (docs/daemon.md).
std::filesystem::path NormalCheckpointDir(const std::string& dir);

class JobIndex {
 public:
  struct CheckpointOverlap {
    // How the asked directory relates to the job's.
    enum class Relation { kSame, kInside, kContains };
    std::string job_id;
    std::filesystem::path dir;  // that job's checkpoint directory, normal
    Relation relation;
  };

  // Tracks `job` as it is now (its state and checkpoint directory), replacing what was
  // tracked under its id. Called after every change of a job's state and when a job is added.
  void Put(const zerotrain::Job& job);
  // Stops tracking the job `id` (nothing happens for an id not tracked).
  void Remove(const std::string& id);

  const std::map<zerotrain::Job::State, int>& counts() const { return counts_; }
  // Ids of the PENDING and RESTARTING jobs.
  const std::set<std::string>& queued() const { return queued_; }
  // An unfinished job whose checkpoint directory is `mine` (normal), lies inside it or
  // contains it; nullopt when none does.
  std::optional<CheckpointOverlap> FindCheckpointOverlap(const std::filesystem::path& mine) const;

 private:
  struct Entry {
    zerotrain::Job::State state = zerotrain::Job::STATE_UNSPECIFIED;
    std::string dir_text;  // the spec's checkpoint.dir as written
    std::string dir;       // NormalCheckpointDir(dir_text); empty while finished or unset
  };
  void Untrack(const Entry& entry, const std::string& id);

  std::map<std::string, Entry> entries_;
  std::map<zerotrain::Job::State, int> counts_;
  std::set<std::string> queued_;
  // Normal checkpoint directory → ids of the unfinished jobs writing there (one, unless
  // recovered state or a takeover put two there).
  std::multimap<std::string, std::string> checkpoint_dirs_;
};

}  // namespace zt
