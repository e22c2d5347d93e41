#include "worker/comm/staged_communicator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/comm/comm_handle_state.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

std::string OpName(CommKind kind, const std::string& label) {
  return absl::StrCat(CommKindName(kind), " '", label, "'");
}

// The buffer is in the engine's device memory and holds f32, bf16 or f16.
absl::Status CheckDeviceBuffer(CommKind kind, const std::string& label, const char* arg,
                               const Tensor& t, const Device& device) {
  if (t.empty() && t.numel() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(kind, label), ": ", arg, " has no data pointer"));
  }
  if (!(t.device() == device)) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(kind, label), ": ", arg, " is on ",
                                                   DeviceName(t.device()),
                                                   ", the staged communicator copies from ",
                                                   DeviceName(device)));
  }
  // An all-gather and a broadcast move bytes and add nothing, so i32 data (token ids: the
  // vocabulary-sharded embedding's) goes too, as through the host communicator.
  const bool moves_only = kind == CommKind::kAllGather || kind == CommKind::kBroadcast;
  if (moves_only && t.dtype() == DType::kI32) return absl::OkStatus();
  if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(kind, label), ": ", arg, " has dtype ", DTypeName(t.dtype()),
        moves_only ? ", expected f32, bf16, f16 or i32" : ", expected f32, bf16 or f16"));
  }
  return absl::OkStatus();
}

absl::Status CheckPeer(CommKind kind, const std::string& label, const char* arg, int peer,
                       int size) {
  if (peer >= 0 && peer < size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(OpName(kind, label), ": invalid ", arg, " ",
                                                 peer, " (", arg, " should be in the 0..",
                                                 size - 1, " range)"));
}

// Point-to-point: a valid rank other than this one.
absl::Status CheckOtherPeer(CommKind kind, const std::string& label, int peer, int rank,
                            int size) {
  ZT_RETURN_IF_ERROR(CheckPeer(kind, label, "peer", peer, size));
  if (peer != rank) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(OpName(kind, label), ": peer ", peer, " is this rank"));
}

absl::Status CheckSameDType(CommKind kind, const std::string& label, const Tensor& input,
                            const Tensor& output) {
  if (input.dtype() == output.dtype()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(OpName(kind, label), ": input is ",
                                                 DTypeName(input.dtype()), ", output is ",
                                                 DTypeName(output.dtype()),
                                                 "; they must be the same dtype"));
}

char* At(const Tensor& t, int64_t element) {
  return static_cast<char*>(t.raw()) + element * DTypeSize(t.dtype());
}

absl::Status WaitFor(absl::StatusOr<CommHandle> handle) {
  if (!handle.ok()) return handle.status();
  return handle->Wait();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagedCommunicator>> StagedCommunicator::Create(
    StagedCommunicatorOptions options) {
  if (options.host == nullptr) {
    return absl::InvalidArgumentError("StagedCommunicatorOptions.host is null");
  }
  if (options.copies == nullptr) {
    return absl::InvalidArgumentError("StagedCommunicatorOptions.copies is null");
  }
  const int64_t min_bytes = int64_t{64} * options.host->size();
  if (options.staging_bytes < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StagedCommunicatorOptions.staging_bytes is ", options.staging_bytes,
        ", must be at least 64 bytes per rank (", min_bytes, " for ", options.host->size(),
        " ranks)"));
  }
  std::unique_ptr<StagedCommunicator> comm(new StagedCommunicator());
  comm->host_ = std::move(options.host);
  comm->copies_ = std::move(options.copies);
  comm->staging_bytes_ = options.staging_bytes;
  for (void*& region : comm->staging_) {
    ZT_ASSIGN_OR_RETURN(region, comm->copies_->AllocateStaging(options.staging_bytes));
  }
  comm->worker_ = std::thread([c = comm.get()] { c->WorkerLoop(); });
  return comm;
}

StagedCommunicator::~StagedCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

int64_t StagedCommunicator::ChunkElements(DType dtype) const {
  return staging_bytes_ / DTypeSize(dtype);
}

Tensor StagedCommunicator::Staging(int region, DType dtype, int64_t n) const {
  return Tensor(staging_[region], dtype, {n}, Device{});
}

absl::Status StagedCommunicator::ToHost(const DeviceCopyEngine::IssueMark& mark,
                                        const Tensor& device, int64_t begin, int64_t n,
                                        const Tensor& staging, int64_t at) {
  return copies_->CopyToHost(mark, At(staging, at), At(device, begin),
                             n * DTypeSize(device.dtype()));
}

absl::Status StagedCommunicator::ToDevice(const DeviceCopyEngine::IssueMark& mark,
                                          const Tensor& device, int64_t begin, int64_t n,
                                          const Tensor& staging, int64_t at) {
  return copies_->CopyToDevice(mark, At(device, begin), At(staging, at),
                               n * DTypeSize(device.dtype()));
}

absl::StatusOr<CommHandle> StagedCommunicator::Enqueue(CommKind kind, const std::string& label,
                                                       Run run) {
  ZT_ASSIGN_OR_RETURN(DeviceCopyEngine::IssueMark mark, copies_->MarkIssue());
  auto state = std::make_shared<CommHandle::State>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Op{.kind = kind,
                        .label = label,
                        .mark = std::move(mark),
                        .run = std::move(run),
                        .state = state});
  }
  cv_.notify_all();
  return CommHandle(state);
}

void StagedCommunicator::WorkerLoop() {
  for (;;) {
    Op op;
    absl::Status broken;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        for (Op& left : queue_) {
          left.state->Complete(absl::CancelledError(
              absl::StrCat(OpName(left.kind, left.label), ": the communicator was destroyed")));
        }
        queue_.clear();
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    if (!broken.ok()) {
      op.state->Complete(absl::FailedPreconditionError(
          absl::StrCat(OpName(op.kind, op.label), ": the communicator is broken by an earlier "
                       "failure: ", broken.message())));
      continue;
    }
    absl::Status s = op.run(op.mark);
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("staged ", OpName(op.kind, op.label), ": ",
                                              s.message()));
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.ok()) broken_ = s;
    }
    op.state->Complete(std::move(s));
  }
}

absl::Status StagedCommunicator::RunAllReduce(const DeviceCopyEngine::IssueMark& mark,
                                              const Tensor& data, ReduceOp op,
                                              const std::string& label) {
  const int64_t n = data.numel(), chunk = ChunkElements(data.dtype());
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t k = std::min(chunk, n - begin);
    const Tensor stage = Staging(0, data.dtype(), k);
    ZT_RETURN_IF_ERROR(ToHost(mark, data, begin, k, stage, 0));
    ZT_RETURN_IF_ERROR(WaitFor(host_->AllReduce(stage, op, label)));
    ZT_RETURN_IF_ERROR(ToDevice(mark, data, begin, k, stage, 0));
  }
  return absl::OkStatus();
}

absl::Status StagedCommunicator::RunReduceScatter(const DeviceCopyEngine::IssueMark& mark,
                                                  const Tensor& input, const Tensor& output,
                                                  ReduceOp op, const std::string& label) {
  const int ranks = size();
  const int64_t n = output.numel(), chunk = ChunkElements(input.dtype()) / ranks;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t k = std::min(chunk, n - begin);
    // Staging 0 holds elements [begin, begin + k) of every rank's chunk, back to back.
    const Tensor in = Staging(0, input.dtype(), ranks * k);
    const Tensor out = Staging(1, output.dtype(), k);
    for (int r = 0; r < ranks; ++r) {
      ZT_RETURN_IF_ERROR(ToHost(mark, input, r * n + begin, k, in, r * k));
    }
    ZT_RETURN_IF_ERROR(WaitFor(host_->ReduceScatter(in, out, op, label)));
    ZT_RETURN_IF_ERROR(ToDevice(mark, output, begin, k, out, 0));
  }
  return absl::OkStatus();
}

absl::Status StagedCommunicator::RunAllGather(const DeviceCopyEngine::IssueMark& mark,
                                              const Tensor& input, const Tensor& output,
                                              const std::string& label) {
  const int ranks = size();
  const int64_t n = input.numel(), chunk = ChunkElements(input.dtype()) / ranks;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t k = std::min(chunk, n - begin);
    // Copied out before anything is written back, so an input that aliases output chunk r
    // (the in-place form) is read whole first.
    const Tensor in = Staging(0, input.dtype(), k);
    const Tensor out = Staging(1, output.dtype(), ranks * k);
    ZT_RETURN_IF_ERROR(ToHost(mark, input, begin, k, in, 0));
    ZT_RETURN_IF_ERROR(WaitFor(host_->AllGather(in, out, label)));
    for (int r = 0; r < ranks; ++r) {
      ZT_RETURN_IF_ERROR(ToDevice(mark, output, r * n + begin, k, out, r * k));
    }
  }
  return absl::OkStatus();
}

absl::Status StagedCommunicator::RunBroadcast(const DeviceCopyEngine::IssueMark& mark,
                                              const Tensor& data, int root,
                                              const std::string& label) {
  const int64_t n = data.numel(), chunk = ChunkElements(data.dtype());
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t k = std::min(chunk, n - begin);
    const Tensor stage = Staging(0, data.dtype(), k);
    if (rank() == root) ZT_RETURN_IF_ERROR(ToHost(mark, data, begin, k, stage, 0));
    ZT_RETURN_IF_ERROR(WaitFor(host_->Broadcast(stage, root, label)));
    if (rank() != root) ZT_RETURN_IF_ERROR(ToDevice(mark, data, begin, k, stage, 0));
  }
  return absl::OkStatus();
}

absl::Status StagedCommunicator::RunSend(const DeviceCopyEngine::IssueMark& mark,
                                         const Tensor& data, int peer, const std::string& label) {
  // An empty tensor is still one (empty) message, so it pairs with the peer's Recv.
  const int64_t n = data.numel(), chunk = ChunkElements(data.dtype());
  int64_t begin = 0;
  do {
    const int64_t k = std::min(chunk, n - begin);
    const Tensor stage = Staging(0, data.dtype(), k);
    ZT_RETURN_IF_ERROR(ToHost(mark, data, begin, k, stage, 0));
    ZT_RETURN_IF_ERROR(WaitFor(host_->Send(stage, peer, label)));
    begin += k;
  } while (begin < n);
  return absl::OkStatus();
}

absl::Status StagedCommunicator::RunRecv(const DeviceCopyEngine::IssueMark& mark,
                                         const Tensor& data, int peer, const std::string& label) {
  // Chunked as the sender chunks: the k-th piece sent pairs with the k-th piece received.
  const int64_t n = data.numel(), chunk = ChunkElements(data.dtype());
  int64_t begin = 0;
  do {
    const int64_t k = std::min(chunk, n - begin);
    const Tensor stage = Staging(1, data.dtype(), k);
    ZT_RETURN_IF_ERROR(WaitFor(host_->Recv(stage, peer, label)));
    ZT_RETURN_IF_ERROR(ToDevice(mark, data, begin, k, stage, 0));
    begin += k;
  } while (begin < n);
  return absl::OkStatus();
}

absl::StatusOr<CommHandle> StagedCommunicator::AllReduce(Tensor data, ReduceOp op,
                                                         const std::string& label) {
  ZT_RETURN_IF_ERROR(
      CheckDeviceBuffer(CommKind::kAllReduce, label, "data", data, copies_->device()));
  return Enqueue(CommKind::kAllReduce, label, [this, data, op, label](const auto& mark) {
    return RunAllReduce(mark, data, op, label);
  });
}

absl::StatusOr<CommHandle> StagedCommunicator::ReduceScatter(Tensor input, Tensor output,
                                                             ReduceOp op,
                                                             const std::string& label) {
  constexpr CommKind kKind = CommKind::kReduceScatter;
  ZT_RETURN_IF_ERROR(CheckDeviceBuffer(kKind, label, "input", input, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckDeviceBuffer(kKind, label, "output", output, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckSameDType(kKind, label, input, output));
  if (input.numel() != size() * output.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(kKind, label), ": input has ", input.numel(), " elements, expected ", size(),
        " ranks × output's ", output.numel()));
  }
  return Enqueue(kKind, label, [this, input, output, op, label](const auto& mark) {
    return RunReduceScatter(mark, input, output, op, label);
  });
}

absl::StatusOr<CommHandle> StagedCommunicator::AllGather(Tensor input, Tensor output,
                                                         const std::string& label) {
  constexpr CommKind kKind = CommKind::kAllGather;
  ZT_RETURN_IF_ERROR(CheckDeviceBuffer(kKind, label, "input", input, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckDeviceBuffer(kKind, label, "output", output, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckSameDType(kKind, label, input, output));
  if (output.numel() != size() * input.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(kKind, label), ": output has ", output.numel(), " elements, expected ", size(),
        " ranks × input's ", input.numel()));
  }
  return Enqueue(kKind, label, [this, input, output, label](const auto& mark) {
    return RunAllGather(mark, input, output, label);
  });
}

absl::StatusOr<CommHandle> StagedCommunicator::Broadcast(Tensor data, int root,
                                                         const std::string& label) {
  ZT_RETURN_IF_ERROR(
      CheckDeviceBuffer(CommKind::kBroadcast, label, "data", data, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckPeer(CommKind::kBroadcast, label, "root", root, size()));
  return Enqueue(CommKind::kBroadcast, label, [this, data, root, label](const auto& mark) {
    return RunBroadcast(mark, data, root, label);
  });
}

absl::StatusOr<CommHandle> StagedCommunicator::Send(Tensor data, int peer,
                                                    const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckDeviceBuffer(CommKind::kSend, label, "data", data, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckOtherPeer(CommKind::kSend, label, peer, rank(), size()));
  return Enqueue(CommKind::kSend, label, [this, data, peer, label](const auto& mark) {
    return RunSend(mark, data, peer, label);
  });
}

absl::StatusOr<CommHandle> StagedCommunicator::Recv(Tensor data, int peer,
                                                    const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckDeviceBuffer(CommKind::kRecv, label, "data", data, copies_->device()));
  ZT_RETURN_IF_ERROR(CheckOtherPeer(CommKind::kRecv, label, peer, rank(), size()));
  return Enqueue(CommKind::kRecv, label, [this, data, peer, label](const auto& mark) {
    return RunRecv(mark, data, peer, label);
  });
}

absl::StatusOr<CommHandle> StagedCommunicator::Barrier(const std::string& label) {
  return Enqueue(CommKind::kBarrier, label, [this, label](const auto&) {
    return WaitFor(host_->Barrier(label));
  });
}

}  // namespace zt
