// For the tests that run the independent PyTorch references under tests/reference/: whether
// Debian's python3-torch is importable (they skip, with that reason, where it is not), a
// scratch directory, and learnable token data.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/integration/zt_process.h"

namespace zt::testing {

inline constexpr char kSystemPython[] = "/usr/bin/python3";

inline bool SystemPythonHasTorch() {
  return RunCommand(std::string(kSystemPython) + " -c 'import torch'").exit_code == 0;
}

// An empty scratch directory for one test case, named after the process and `name`.
inline std::filesystem::path FreshScratchDir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("zt-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// `count` tokens below `vocab` that a model can learn: position i holds i mod `period`, except
// one in `noise_one_in` (seeded) which is a random token. Training on them moves the weights
// far from where they started.
inline std::vector<int32_t> StructuredTokens(size_t count, int vocab, int period, int noise_one_in,
                                             unsigned seed) {
  std::vector<int32_t> tokens(count);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    tokens[i] = rng() % noise_one_in == 0 ? static_cast<int32_t>(rng() % vocab)
                                          : static_cast<int32_t>(i % period);
  }
  return tokens;
}

}  // namespace zt::testing
