// The shared completion record behind a CommHandle: the worker thread completes it once.
#pragma once

#include <condition_variable>
#include <mutex>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"

namespace zt {

struct CommHandle::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;

  void Complete(absl::Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
    }
    cv.notify_all();
  }
};

}  // namespace zt
