// Test data for the trainer's tests: a scratch directory per test and a corpus with
// structure — a repeating pattern (i·7 mod 32) with one token in eight random — so that
// training visibly learns (the pattern is 7/8 predictable) in a few dozen steps.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace zt::testing {

// A fresh directory named after the running test.
inline std::filesystem::path TestScratchDir(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "-" + std::to_string(::getpid()) + "-" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

// 20,000 tokens of vocabulary 32.
inline std::vector<int32_t> PatternTokens() {
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] =
        rng() % 8 == 0 ? static_cast<int32_t>(rng() % 32) : static_cast<int32_t>((i * 7) % 32);
  }
  return tokens;
}

}  // namespace zt::testing
