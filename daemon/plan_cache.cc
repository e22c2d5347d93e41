#include "daemon/plan_cache.h"

#include <algorithm>
#include <cstring>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace zt {
namespace {

// Replaces each entry's text by nothing, keeping how many there are.
void ForgetTexts(google::protobuf::RepeatedPtrField<std::string>* texts) {
  for (std::string& text : *texts) text.clear();
}

}  // namespace

PlanCache::PlanCache(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

std::string PlanCache::KeyOf(const zerotrain::JobSpec& job, const PlannerOptions& options) {
  zerotrain::JobSpec shape = job;
  shape.clear_name();
  shape.clear_scheduling();
  shape.mutable_model()->clear_init_from();
  ForgetTexts(shape.mutable_data()->mutable_train());
  ForgetTexts(shape.mutable_data()->mutable_val());
  if (!shape.checkpoint().dir().empty()) shape.mutable_checkpoint()->set_dir("set");
  std::string key;
  {
    google::protobuf::io::StringOutputStream stream(&key);
    google::protobuf::io::CodedOutputStream coded(&stream);
    // Deterministic: equal messages give equal bytes (map fields in key order).
    coded.SetSerializationDeterministic(true);
    shape.SerializeToCodedStream(&coded);
  }
  // The options as raw bytes after the message (fixed width, so no two keys run together).
  char raw[sizeof(options.device_memory_bytes) + sizeof(options.safety_margin)];
  std::memcpy(raw, &options.device_memory_bytes, sizeof(options.device_memory_bytes));
  std::memcpy(raw + sizeof(options.device_memory_bytes), &options.safety_margin,
              sizeof(options.safety_margin));
  key.append(raw, sizeof(raw));
  return key;
}

absl::StatusOr<zerotrain::ShardingPlan> PlanCache::Plan(const zerotrain::JobSpec& job,
                                                        const PlannerOptions& options) {
  const std::string key = KeyOf(job, options);
  {
    absl::MutexLock lock(&mu_);
    auto it = by_key_.find(key);
    if (it != by_key_.end()) {
      ++hits_;
      recent_.splice(recent_.begin(), recent_, it->second);
      return it->second->second;
    }
    ++misses_;
  }
  // Planned outside the lock: a large model takes a while, and other shapes should not wait.
  absl::StatusOr<zerotrain::ShardingPlan> plan = PlanSharding(job, options);
  if (!plan.ok()) return plan;
  absl::MutexLock lock(&mu_);
  if (by_key_.contains(key)) return plan;  // another caller planned the same shape meanwhile
  recent_.emplace_front(key, *plan);
  by_key_[key] = recent_.begin();
  if (recent_.size() > capacity_) {
    by_key_.erase(recent_.back().first);
    recent_.pop_back();
  }
  return plan;
}

int64_t PlanCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t PlanCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace zt
