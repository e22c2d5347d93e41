// Running the independent PyTorch references under tests/reference/ from a test: a shell
// command's output and exit status, and whether Debian's python3-torch is importable (the
// reference tests skip, with that reason, where it is not).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace zt::testing_util {

inline constexpr char kSystemPython[] = "/usr/bin/python3";

// Runs `cmd` through the shell; its stdout and stderr together. *exit_code is its exit status,
// or −1 where it did not exit normally.
inline std::string RunCommand(const std::string& cmd, int* exit_code) {
  std::string out;
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *exit_code = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

inline bool SystemPythonHasTorch() {
  int rc = -1;
  RunCommand(std::string(kSystemPython) + " -c 'import torch'", &rc);
  return rc == 0;
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

}  // namespace zt::testing_util
