// A test fixture with a scratch directory named after the test and a token shard of 5,000
// random ids below 64 at Path("train.bin"): what the `zt` binary tests train on.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/token_shard.h"

namespace zt::testing {

class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           (prefix_ + "-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<int32_t> tokens(5000);
    std::mt19937 rng(1);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 64);
    ASSERT_TRUE(WriteTokenShard(Path("train.bin"), tokens, 64).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace zt::testing
