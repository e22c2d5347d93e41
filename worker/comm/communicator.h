// Communicator: collectives and point-to-point transfers among the N ranks of a group.
//
// Buffers are flat Tensor views (any shape; only numel and dtype matter) of f32, bf16 or f16
// in host memory. Reductions of 16-bit data run in f32: the communicator converts into a
// conversion buffer it owns, sized at creation, reduces, and rounds back once, so a bf16
// all-reduce equals the f32 all-reduce of the same values rounded to bf16.
//
// Every call is asynchronous: it validates its arguments, queues the operation and returns a
// CommHandle. One worker thread per communicator runs the queue in issue order, so
// communication overlaps the caller's compute and every rank must issue the same collectives
// in the same order (as with NCCL). Buffers must stay valid and untouched until Wait returns.
//
// Every operation carries a caller-supplied label ("unit 3 gather") used in error messages.
// A collective that a peer never joins fails within the communicator's timeout with
// DeadlineExceeded naming the operation, the label and the ranks that did not arrive; other
// transport failures come back as Unavailable. After a failure the communicator is broken
// (peers may be mid-operation): later operations fail with the first failure's code and
// message (prefixed with their own kind and label), so whichever handle a caller waits on
// first names the cause.
//
// Thread-safety: the methods may be called from any one thread at a time; handles may be
// waited on from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace zt {

enum class ReduceOp { kSum, kAvg };

enum class CommKind { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kSend, kRecv, kBarrier };
inline constexpr int kNumCommKinds = 7;
const char* CommKindName(CommKind kind);

// Per-rank counters. Bytes are the payload the algorithm moves on this rank (documented per
// operation on the implementation), counted when an operation succeeds; seconds are the
// wall time the worker thread spent running operations of that kind.
struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    double seconds = 0;
  };
  std::array<Entry, kNumCommKinds> by_kind{};

  const Entry& operator[](CommKind k) const { return by_kind[static_cast<int>(k)]; }
  Entry& operator[](CommKind k) { return by_kind[static_cast<int>(k)]; }

  // Adds another communicator's counters, kind by kind (a rank's total over its groups).
  CommStats& operator+=(const CommStats& other) {
    for (int k = 0; k < kNumCommKinds; ++k) {
      by_kind[k].calls += other.by_kind[k].calls;
      by_kind[k].bytes_sent += other.by_kind[k].bytes_sent;
      by_kind[k].bytes_received += other.by_kind[k].bytes_received;
      by_kind[k].seconds += other.by_kind[k].seconds;
    }
    return *this;
  }
};

// The completion of one queued operation. Copyable; all copies see the same completion.
class CommHandle {
 public:
  struct State;  // defined in communicator.cc
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Blocks until the operation finished; returns its status. Waiting twice returns the same.
  absl::Status Wait() const;
  // Whether Wait would return without blocking.
  bool Done() const;

 private:
  std::shared_ptr<State> state_;
};

// InvalidArgument naming "<options_type>.size" or "<options_type>.rank" unless size ≥ 1 and
// 0 ≤ rank < size: what every implementation's Create checks first.
absl::Status CheckRankAndSize(const char* options_type, int rank, int size);

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data (n) on every rank becomes the element-wise sum (or mean) over ranks.
  virtual absl::StatusOr<CommHandle> AllReduce(Tensor data, ReduceOp op,
                                               const std::string& label) = 0;
  // input (N·n): output (n) on rank r = sum (or mean) over ranks of input chunk r.
  // The input is used as scratch: afterwards its contents are unspecified.
  virtual absl::StatusOr<CommHandle> ReduceScatter(Tensor input, Tensor output, ReduceOp op,
                                                   const std::string& label) = 0;
  // input (n): output (N·n) holds every rank's input, rank r's at chunk r. In place when
  // input is output's chunk r.
  virtual absl::StatusOr<CommHandle> AllGather(Tensor input, Tensor output,
                                               const std::string& label) = 0;
  // data on every rank becomes root's data.
  virtual absl::StatusOr<CommHandle> Broadcast(Tensor data, int root, const std::string& label) = 0;
  // Point-to-point: the k-th Send from a to b pairs with the k-th Recv on b from a.
  virtual absl::StatusOr<CommHandle> Send(Tensor data, int peer, const std::string& label) = 0;
  virtual absl::StatusOr<CommHandle> Recv(Tensor data, int peer, const std::string& label) = 0;
  virtual absl::StatusOr<CommHandle> Barrier(const std::string& label) = 0;

  // A snapshot of the counters of operations completed so far.
  virtual CommStats stats() const = 0;
};

}  // namespace zt
