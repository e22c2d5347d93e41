// The ranks of a multi-rank test job as threads of the test process: each runs `body(rank)`,
// all are joined, and the first failing rank's status comes back naming it ("rank 2: …").
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zt::testing {

inline absl::Status RunRankThreads(int ranks, const std::function<absl::Status(int rank)>& body) {
  std::vector<absl::Status> status(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back([&, r] { status[r] = body(r); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    if (!status[r].ok()) {
      return absl::Status(status[r].code(), absl::StrCat("rank ", r, ": ", status[r].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace zt::testing
