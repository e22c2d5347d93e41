// Helpers of the offload tests: temporary directories, byte patterns, and a SwapEnv that
// injects faults (LevelDB's fault_injection_test in spirit): ENOSPC after a write budget,
// a "crash" at a stage of a commit, and the loss of unsynced writes a power cut causes.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "offload/swap_env.h"

namespace zt::offload::testing {

// A fresh directory under the test temp dir, removed with its content at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "offload-test-XXXXXX";
    path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Deterministic bytes that differ by `seed` and by position.
inline std::vector<std::byte> Pattern(size_t n, uint32_t seed) {
  std::vector<std::byte> out(n);
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<std::byte>(x >> 24);
  }
  return out;
}

// Thread-safe: the store runs a read lane and a write lane at once (its bookkeeping is under a
// lock; the I/O itself is not, so the lanes still overlap).
class FaultInjectionEnv : public SwapEnv {
 public:
  // The commit stage at which the "process dies": that call and every later one fail.
  std::optional<CommitStage> crash_at;
  // Bytes the filesystem still takes; a write past them fails with ENOSPC, writing nothing.
  std::optional<uint64_t> write_budget;
  // The same for preallocating swap files: one past them fails as posix_fallocate's ENOSPC.
  std::optional<uint64_t> preallocate_budget;

  absl::Status Preallocate(int fd, const std::string& path, uint64_t size) override {
    absl::MutexLock lock(&mu_);
    if (preallocate_budget) {
      if (size > *preallocate_budget) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot preallocate swap file '", path, "': No space left on device (needs ", size,
            " bytes)"));
      }
      *preallocate_budget -= size;
    }
    return SwapEnv::Preallocate(fd, path, size);
  }

  absl::StatusOr<OpenedFile> Open(const std::string& path, bool want_direct) override {
    auto opened = SwapEnv::Open(path, want_direct);
    absl::MutexLock lock(&mu_);
    if (opened.ok()) {
      if (paths_.size() <= static_cast<size_t>(opened->fd)) paths_.resize(opened->fd + 1);
      paths_[opened->fd] = path;
    }
    return opened;
  }

  absl::Status Run(IoEngine& engine, absl::Span<const IoOp> ops) override {
    {
      absl::MutexLock lock(&mu_);
      if (crashed_) return absl::AbortedError("simulated crash: the process is gone");
      for (const IoOp& op : ops) {
        if (op.kind != IoOp::Kind::kWrite || !write_budget) continue;
        if (op.length > *write_budget) {
          return IoErrnoStatus(ENOSPC, "write", op.path != nullptr ? *op.path : "");
        }
        *write_budget -= op.length;
      }
    }
    absl::Status s = SwapEnv::Run(engine, ops);
    absl::MutexLock lock(&mu_);
    for (const IoOp& op : ops) {
      if (op.kind == IoOp::Kind::kWrite) {
        unsynced_.push_back({paths_[op.fd], op.fd, op.offset, op.length});
      }
    }
    return s;
  }

  absl::Status SyncData(IoEngine& engine, int fd, const std::string& path) override {
    {
      absl::MutexLock lock(&mu_);
      if (crashed_) return absl::AbortedError("simulated crash: the process is gone");
    }
    absl::Status s = SwapEnv::SyncData(engine, fd, path);
    absl::MutexLock lock(&mu_);
    if (s.ok()) std::erase_if(unsynced_, [fd](const Range& r) { return r.fd == fd; });
    return s;
  }

  absl::Status AtCommitStage(CommitStage stage, absl::string_view job,
                             uint64_t generation) override {
    absl::MutexLock lock(&mu_);
    if (crashed_) return absl::AbortedError("simulated crash: the process is gone");
    if (crash_at == stage) {
      crashed_ = true;
      return absl::AbortedError(absl::StrCat("simulated crash at '", CommitStageName(stage),
                                             "' of job '", job, "' generation ", generation));
    }
    return absl::OkStatus();
  }

  // What a power cut does to writes never synced: they are lost, here overwritten with a byte
  // no test pattern is made of wholesale. Call after the store is closed.
  void DropUnsyncedData() {
    absl::MutexLock lock(&mu_);
    for (const Range& r : unsynced_) {
      const int fd = open(r.path.c_str(), O_WRONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0) << r.path;
      std::vector<char> junk(r.length, '\xA5');
      ASSERT_EQ(pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(r.offset)),
                static_cast<ssize_t>(junk.size()));
      close(fd);
    }
    unsynced_.clear();
  }
  size_t unsynced_ranges() const {
    absl::MutexLock lock(&mu_);
    return unsynced_.size();
  }

 private:
  struct Range {
    std::string path;
    int fd;
    uint64_t offset;
    uint64_t length;
  };
  mutable absl::Mutex mu_;
  bool crashed_ = false;
  std::vector<std::string> paths_;  // by descriptor
  std::vector<Range> unsynced_;
};

// Holds every transfer of one kind (reads or writes) at the start of Run, while armed, until
// Release() or `limit` passes (then the transfer fails with DeadlineExceeded, naming the
// gate): what else moves while one transfer is in flight, and what waits for it.
class GateEnv : public SwapEnv {
 public:
  GateEnv(IoOp::Kind held, absl::Duration limit) : held_(held), limit_(limit) {}
  void Arm() {
    absl::MutexLock lock(&mu_);
    armed_ = true;
    released_ = false;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Waits until a transfer is held at the gate; false after `timeout`.
  bool WaitUntilHeld(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&holding_), timeout);
  }

  absl::Status Run(IoEngine& engine, absl::Span<const IoOp> ops) override {
    const bool mine = !ops.empty() && ops.front().kind == held_;
    {
      absl::MutexLock lock(&mu_);
      if (mine && armed_ && !released_) {
        holding_ = true;
        const bool released = mu_.AwaitWithTimeout(absl::Condition(&released_), limit_);
        holding_ = false;
        if (!released) {
          return absl::DeadlineExceededError("the gate held this transfer past its limit");
        }
      }
    }
    return SwapEnv::Run(engine, ops);
  }

 private:
  const IoOp::Kind held_;
  const absl::Duration limit_;
  absl::Mutex mu_;
  bool armed_ = false, released_ = false, holding_ = false;
};

}  // namespace zt::offload::testing
