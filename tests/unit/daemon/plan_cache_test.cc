// Tests of daemon/plan_cache.h: a shape planned once is served from the cache with the
// planner's own answer; anything that changes what is trained, or the device, misses; the
// least recently used plan is evicted at capacity.
#include "daemon/plan_cache.h"

#include <string>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "worker/job/job_loading.h"
#include "worker/plan/sharding_planner.h"

namespace zt {
namespace {

using google::protobuf::util::MessageDifferencer;

// A small GPT-2 on 4 ranks, as the coordinator hands it to the planner (defaults applied, the
// stage and checkpointing left to choose).
zerotrain::JobSpec Job(const std::string& name, int d_model = 256) {
  zerotrain::JobSpec job;
  job.set_name(name);
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(4);
  m->set_n_head(4);
  m->set_d_model(d_model);
  m->set_vocab_size(256);
  m->set_max_seq_len(256);
  job.mutable_data()->add_train("/data/" + name + "/train.bin");
  job.mutable_data()->set_seq_len(256);
  job.mutable_train()->set_micro_batch_size(8);
  job.mutable_train()->set_max_steps(10);
  job.mutable_optimizer()->set_lr(1e-3);
  job.mutable_parallel()->set_world_size(4);
  job.mutable_checkpoint()->set_dir("/ckpt/" + name);
  absl::StatusOr<zerotrain::JobSpec> planned =
      JobForPlanning(job, {.check_paths = false, .check_engine_support = false});
  EXPECT_TRUE(planned.ok()) << planned.status();
  return *planned;
}

constexpr PlannerOptions kDevice{.device_memory_bytes = int64_t{64} << 20, .safety_margin = 0.1};

TEST(PlanCacheTest, AJobOfAPlannedShapeGetsThePlannersPlanFromTheCache) {
  PlanCache cache(8);
  absl::StatusOr<zerotrain::ShardingPlan> first = cache.Plan(Job("a"), kDevice);
  ASSERT_TRUE(first.ok()) << first.status();
  // Another name, other data and checkpoint paths, another priority: the same shape.
  zerotrain::JobSpec other = Job("b");
  other.mutable_scheduling()->set_priority(7);
  absl::StatusOr<zerotrain::ShardingPlan> second = cache.Plan(other, kDevice);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 1);
  absl::StatusOr<zerotrain::ShardingPlan> direct = PlanSharding(other, kDevice);
  ASSERT_TRUE(direct.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(*second, *direct));
}

TEST(PlanCacheTest, WhatIsTrainedOrTheDeviceSplitsTheKey) {
  PlanCache cache(8);
  ASSERT_TRUE(cache.Plan(Job("a"), kDevice).ok());
  ASSERT_TRUE(cache.Plan(Job("a", /*d_model=*/512), kDevice).ok());
  PlannerOptions bigger = kDevice;
  bigger.device_memory_bytes *= 2;
  ASSERT_TRUE(cache.Plan(Job("a"), bigger).ok());
  PlannerOptions looser = kDevice;
  looser.safety_margin = 0.2;
  ASSERT_TRUE(cache.Plan(Job("a"), looser).ok());
  zerotrain::JobSpec pinned = Job("a");
  pinned.mutable_parallel()->set_zero_stage(3);
  ASSERT_TRUE(cache.Plan(pinned, kDevice).ok());
  // A checkpoint directory set or not, and validation data present or not, may change the
  // plan (staging buffers, evaluation): only their text is ignored.
  zerotrain::JobSpec no_checkpoints = Job("a");
  no_checkpoints.mutable_checkpoint()->clear_dir();
  zerotrain::JobSpec with_val = Job("a");
  with_val.mutable_data()->add_val("/data/val.bin");
  EXPECT_NE(PlanCache::KeyOf(no_checkpoints, kDevice), PlanCache::KeyOf(Job("a"), kDevice));
  EXPECT_NE(PlanCache::KeyOf(with_val, kDevice), PlanCache::KeyOf(Job("a"), kDevice));
  EXPECT_EQ(cache.hits(), 0);
  EXPECT_EQ(cache.misses(), 5);
}

TEST(PlanCacheTest, TheLeastRecentlyUsedShapeIsEvicted) {
  PlanCache cache(2);
  ASSERT_TRUE(cache.Plan(Job("a", 128), kDevice).ok());
  ASSERT_TRUE(cache.Plan(Job("a", 256), kDevice).ok());
  ASSERT_TRUE(cache.Plan(Job("a", 128), kDevice).ok());  // hit: 128 is now the most recent
  ASSERT_TRUE(cache.Plan(Job("a", 512), kDevice).ok());  // evicts 256
  EXPECT_EQ(cache.hits(), 1);
  ASSERT_TRUE(cache.Plan(Job("a", 128), kDevice).ok());  // still there
  EXPECT_EQ(cache.hits(), 2);
  ASSERT_TRUE(cache.Plan(Job("a", 256), kDevice).ok());  // planned again
  EXPECT_EQ(cache.misses(), 4);
}

TEST(PlanCacheTest, PlannerErrorsAreReturnedAndNotCached) {
  PlanCache cache(8);
  const PlannerOptions no_memory{.device_memory_bytes = 0, .safety_margin = 0.1};
  EXPECT_EQ(cache.Plan(Job("a"), no_memory).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.Plan(Job("a"), no_memory).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.misses(), 2);
  EXPECT_EQ(cache.hits(), 0);
}

}  // namespace
}  // namespace zt
