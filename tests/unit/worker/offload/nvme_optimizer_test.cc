// Tests of worker/offload/nvme_optimizer.h's store roles and worker/offload/node_swap_store.h's
// store: every optimizer's state buffers get distinct roles in the store's index, and a process
// opens one store per directory with a file per rank, sized for two generations. (The step
// itself is tested where it trains: tests/unit/worker/trainer/offload_training_test.cc.)
#include "worker/offload/nvme_optimizer.h"

#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/small_sharded_job.h"
#include "worker/model/param_layout.h"
#include "worker/offload/node_swap_store.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using zerotrain::OptimizerConfig;

TEST(SwapRoleForTest, EveryOptimizersStatesHaveDistinctRolesInAUnit) {
  zerotrain::JobSpec job = testing::SmallShardedJob("/unused", 1, 1, 2);
  const ModelLayout layout = BuildModelLayout(job.model());
  for (OptimizerConfig::Type type : {OptimizerConfig::ADAMW, OptimizerConfig::ADAMW_8BIT,
                                     OptimizerConfig::ADAFACTOR, OptimizerConfig::SGD}) {
    OptimizerConfig config;
    config.set_type(type);
    config.set_momentum(0.9f);
    // 8-bit AdamW keeps small tensors in fp32: both kinds of state in one unit.
    config.set_min_quantized_numel(1000);
    config.set_quant_block_size(64);
    config.mutable_adafactor()->set_beta1(0.9f);
    for (const UnitLayout& u : layout.units) {
      std::set<offload::SwapRole> roles = {offload::SwapRole::kMaster};
      for (const UnitOptimizerState::Buffer& b : OptimizerStateFor(config, u).buffers) {
        absl::StatusOr<offload::SwapRole> role = SwapRoleFor(b.name);
        ASSERT_TRUE(role.ok()) << role.status();
        EXPECT_TRUE(roles.insert(*role).second)
            << OptimizerConfig::Type_Name(type) << " " << u.name << "." << b.name << " shares role "
            << offload::SwapRoleName(*role);
      }
    }
  }
  EXPECT_EQ(SwapRoleFor("master_low").value(), offload::SwapRole::kMaster);
  const absl::Status unknown = SwapRoleFor("lion_m").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("'lion_m'"));
}

class NodeSwapStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zt_node_swap_store_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A job of `world` ranks whose optimizer states live in a store under dir_ (the fields
  // the store's options read, as defaults would set them).
  zerotrain::JobSpec Job(int world) const {
    zerotrain::JobSpec job = testing::SmallShardedJob((dir_ / "train.bin").string(), world, 1, 2);
    job.mutable_offload()->set_optimizer(zerotrain::OffloadConfig::NVME);
    job.mutable_offload()->set_nvme_path(dir_.string());
    job.mutable_offload()->set_buffer_size(65536);
    job.mutable_offload()->mutable_aio()->set_block_size(1 << 20);
    job.mutable_offload()->mutable_aio()->set_queue_depth(8);
    return job;
  }
  std::filesystem::path dir_;
};

TEST_F(NodeSwapStoreTest, AFilePerRankSizedForTwoGenerations) {
  const zerotrain::JobSpec job = Job(2);
  const offload::SwapStoreOptions options = SwapStoreOptionsFor(job, {0, 1});
  EXPECT_EQ(options.path, (dir_ / "zerotrain-swap").string());
  EXPECT_EQ(options.file_count, 2u);
  EXPECT_EQ(options.file_size % 4096, 0u);
  for (int r : {0, 1}) {
    const int64_t generation = PlanMemory(job, r).CategoryBytes(MemoryCategory::kNvme);
    ASSERT_GT(generation, 0);
    EXPECT_GE(options.file_size, static_cast<uint64_t>(2 * generation + generation / 2));
  }
  EXPECT_EQ(options.queue_depth, 8u);
  EXPECT_EQ(options.block_size, 1u << 20);
}

TEST_F(NodeSwapStoreTest, OneStorePerDirectoryAndAnotherJobsGeometryIsReplaced) {
  NodeSwapStores stores;
  absl::StatusOr<std::shared_ptr<offload::SwapStore>> a = stores.Acquire(Job(2), {0, 1});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::shared_ptr<offload::SwapStore>> b = stores.Acquire(Job(1), {0});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get()) << "a second job on the directory shares the open store";
  a->reset();
  b->reset();
  // Closed, and opened for a job of another geometry: emptied and made anew.
  absl::StatusOr<std::shared_ptr<offload::SwapStore>> c = stores.Acquire(Job(1), {0});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->file_count(), 1u);
  EXPECT_TRUE((*c)->open_report().created);
}

}  // namespace
}  // namespace zt
