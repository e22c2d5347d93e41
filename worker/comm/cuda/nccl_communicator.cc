#include "worker/comm/cuda/nccl_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kernels/status_macros.h"
#include "worker/comm/comm_handle_state.h"

namespace zt {
namespace {

// The watcher's sleep between polls of an unfinished operation grows to this, so a long
// collective costs little CPU while a short one completes within microseconds.
constexpr absl::Duration kMaxPollInterval = absl::Microseconds(500);
constexpr absl::Duration kMinPollInterval = absl::Microseconds(5);

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    default:
      return ncclFloat32;
  }
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kAvg ? ncclAvg : ncclSum; }

std::string OpName(CommKind kind, const std::string& label) {
  return absl::StrCat(CommKindName(kind), " '", label, "'");
}

// Clears CUDA's last error so that a later, unrelated call does not report it again.
absl::Status CudaStatus(cudaError_t e, const std::string& context) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string msg = absl::StrCat(context, ": CUDA error ", static_cast<int>(e), " ",
                                       cudaGetErrorName(e), ": ", cudaGetErrorString(e));
  switch (e) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// System and remote errors are a peer or the network going away: the caller may retry the
// step on a new communicator. Argument and usage errors come from the buffers we were given.
absl::StatusCode NcclCode(ncclResult_t r) {
  switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::Status CheckBuffer(CommKind kind, const std::string& label, const char* arg, const Tensor& t,
                         const Device& device) {
  if (t.empty() && t.numel() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(OpName(kind, label), ": ", arg, " has no data pointer"));
  }
  if (t.device() != device) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(kind, label), ": ", arg, " is on ", DeviceName(t.device()), ", expected ",
        DeviceName(device), "; NCCL moves buffers of this communicator's device only"));
  }
  // An all-gather and a broadcast move bytes and add nothing, so i32 data (token ids: the
  // vocabulary-sharded embedding's) goes too.
  const bool moves_only = kind == CommKind::kAllGather || kind == CommKind::kBroadcast;
  if (moves_only && t.dtype() == DType::kI32) return absl::OkStatus();
  if (!IsFloat(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        OpName(kind, label), ": ", arg, " has dtype ", DTypeName(t.dtype()),
        moves_only ? ", expected f32, bf16, f16 or i32" : ", expected f32, bf16 or f16"));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(CommKind kind, const std::string& label, const char* arg, int r, int n) {
  if (r < 0 || r >= n) {
    return absl::InvalidArgumentError(absl::StrCat(OpName(kind, label), ": invalid ", arg, " ", r,
                                                   " (", arg, " should be in the 0..", n - 1,
                                                   " range)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions& options) {
  if (absl::Status s = CheckRankAndSize("NcclCommunicatorOptions", options.rank, options.size);
      !s.ok()) {
    return s;
  }
  if (options.store == nullptr && options.size > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "NcclCommunicatorOptions.store is null, required when size (", options.size, ") > 1"));
  }
  if (!(options.timeout_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicatorOptions.timeout_seconds is ",
                                                   options.timeout_seconds, ", must be > 0"));
  }
  if (options.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NcclCommunicatorOptions.device is ", options.device, ", must be >= 0"));
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("NcclCommunicator needs a CUDA device: cudaGetDeviceCount failed with error ",
                     static_cast<int>(e), " ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "NcclCommunicator needs a CUDA device: cudaGetDeviceCount found none");
  }
  if (options.device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("NcclCommunicatorOptions.device is ",
                                                   options.device, ", must be in 0..", count - 1,
                                                   " (the CUDA devices this process sees)"));
  }
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator(options));
  ZT_RETURN_IF_ERROR(comm->Init());
  comm->watcher_ = std::thread([c = comm.get()] { c->WatcherLoop(); });
  return comm;
}

NcclCommunicator::NcclCommunicator(const NcclCommunicatorOptions& options)
    : options_(options), timeout_(absl::Seconds(options.timeout_seconds)) {}

absl::Status NcclCommunicator::Init() {
  const std::string where = absl::StrCat("NcclCommunicator '", options_.prefix, "' (rank ",
                                         options_.rank, " of ", options_.size, ")");
  ZT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options_.device),
                                absl::StrCat(where, ": cudaSetDevice(", options_.device, ")")));
  ncclUniqueId id;
  const std::string key = absl::StrCat(options_.prefix, "/nccl_unique_id");
  if (options_.rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::Status(NcclCode(r),
                          absl::StrCat(where, ": ncclGetUniqueId: NCCL error ", static_cast<int>(r),
                                       " (", ncclGetErrorString(r), ")"));
    }
    if (options_.store != nullptr) {
      // Hex, because a store may carry text only (the coordinator's, say).
      const absl::Status set = options_.store->Set(
          key, absl::BytesToHexString(absl::string_view(id.internal, sizeof(id.internal))));
      if (!set.ok()) {
        return absl::Status(set.code(), absl::StrCat(where, ": publishing the NCCL id as '", key,
                                                     "': ", set.message()));
      }
    }
  } else {
    const absl::Status waited = options_.store->Wait({key}, timeout_);
    if (!waited.ok()) {
      return absl::Status(
          waited.code(), absl::StrCat(where, ": waiting for rank 0's NCCL id: ", waited.message()));
    }
    absl::StatusOr<std::string> hex = options_.store->Get(key);
    if (!hex.ok()) {
      return absl::Status(hex.status().code(),
                          absl::StrCat(where, ": reading '", key, "': ", hex.status().message()));
    }
    const bool well_formed =
        hex->size() == 2 * sizeof(id.internal) && std::all_of(hex->begin(), hex->end(), [](char c) {
          return absl::ascii_isxdigit(static_cast<unsigned char>(c));
        });
    if (!well_formed) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, ": store key '", key, "' holds ", hex->size(), " characters, not the ",
          2 * sizeof(id.internal), " hex digits of an ncclUniqueId"));
    }
    const std::string bytes = absl::HexStringToBytes(*hex);
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }

  if (options_.stream == nullptr) {
    ZT_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                                  absl::StrCat(where, ": creating the communication stream")));
    owns_stream_ = true;
  } else {
    stream_ = options_.stream;
  }
  void* scratch = nullptr;
  ZT_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&scratch, sizeof(float)),
                                absl::StrCat(where, ": allocating the barrier's scratch word")));
  barrier_scratch_ = static_cast<float*>(scratch);

  // Non-blocking, so that neither creation nor an enqueue can hang beyond the timeout: a
  // blocking communicator would wait inside NCCL for a peer that never comes.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::lock_guard<std::mutex> lock(comm_mu_);
  ncclResult_t r = ncclCommInitRankConfig(&comm_, options_.size, id, options_.rank, &config);
  r = AwaitNccl(r, absl::Now() + timeout_);
  if (r == ncclSuccess) return absl::OkStatus();
  const absl::Status status =
      r == ncclInProgress
          ? absl::DeadlineExceededError(absl::StrCat(
                where, ": ncclCommInitRankConfig not complete within ", options_.timeout_seconds,
                " s; did every rank of the group call Create with this prefix?"))
          : absl::Status(NcclCode(r),
                         absl::StrCat(where, ": ncclCommInitRankConfig: ", NcclErrorText(r)));
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return status;
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  pending_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_ != nullptr) {
      cudaSetDevice(options_.device);
      const ncclResult_t r = AwaitNccl(ncclCommFinalize(comm_), absl::Now() + timeout_);
      if (r == ncclSuccess) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  if (barrier_scratch_ != nullptr) cudaFree(barrier_scratch_);
  if (owns_stream_) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

CommStats NcclCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

ncclResult_t NcclCommunicator::AwaitNccl(ncclResult_t result, absl::Time deadline) {
  while (result == ncclInProgress && comm_ != nullptr) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
    result = queried != ncclSuccess ? queried : state;
    if (result != ncclInProgress || absl::Now() > deadline) break;
    absl::SleepFor(kMinPollInterval);
  }
  return result;
}

std::string NcclCommunicator::NcclErrorText(ncclResult_t result) {
  std::string text =
      absl::StrCat("NCCL error ", static_cast<int>(result), " (", ncclGetErrorString(result), ")");
  const char* last = ncclGetLastError(comm_);
  if (last != nullptr && last[0] != '\0') absl::StrAppend(&text, ": ", last);
  return text;
}

CommHandle NcclCommunicator::Failed(CommKind kind, const std::string& label,
                                    const std::string& cause) {
  auto state = std::make_shared<CommHandle::State>();
  state->Complete(absl::FailedPreconditionError(absl::StrCat(
      OpName(kind, label), ": an earlier operation of this communicator failed (", cause, ")")));
  return CommHandle(std::move(state));
}

std::vector<cudaEvent_t*> NcclCommunicator::OpEvents(Op& op) const {
  if (ordered_after_compute()) return {&op.ready, &op.start, &op.end};
  return {&op.start, &op.end};
}

void NcclCommunicator::Release(Op& op) {
  std::lock_guard<std::mutex> lock(mu_);
  for (cudaEvent_t* e : OpEvents(op)) {
    if (*e != nullptr) free_events_.push_back(*e);
    *e = nullptr;
  }
}

void NcclCommunicator::Break(const Op* op, const absl::Status& status) {
  if (comm_ != nullptr) {
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  std::deque<std::shared_ptr<Op>> failed;
  std::string cause;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_) broken_cause_ = std::string(status.message());
    broken_ = true;
    cause = broken_cause_;
    failed.swap(pending_);
  }
  for (const std::shared_ptr<Op>& f : failed) {
    f->state->Complete(f.get() == op ? status
                                     : absl::FailedPreconditionError(absl::StrCat(
                                           OpName(f->kind, f->label),
                                           ": the communicator was aborted before this operation "
                                           "completed (",
                                           cause, ")")));
  }
  pending_cv_.notify_all();
}

absl::StatusOr<CommHandle> NcclCommunicator::Issue(CommKind kind, const std::string& label,
                                                   int64_t bytes_sent, int64_t bytes_received,
                                                   const Launch& launch) {
  std::lock_guard<std::mutex> comm_lock(comm_mu_);
  auto op = std::make_shared<Op>();
  op->kind = kind;
  op->label = label;
  op->bytes_sent = bytes_sent;
  op->bytes_received = bytes_received;
  op->state = std::make_shared<CommHandle::State>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return Failed(kind, label, broken_cause_);
    for (cudaEvent_t* e : OpEvents(*op)) {
      if (free_events_.empty()) break;
      *e = free_events_.back();
      free_events_.pop_back();
    }
  }
  absl::Cleanup release = [&] { Release(*op); };
  const std::string name = OpName(kind, label);
  ZT_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(options_.device), name + ": cudaSetDevice"));
  for (cudaEvent_t* e : OpEvents(*op)) {
    if (*e == nullptr)
      ZT_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(e), name + ": cudaEventCreate"));
  }
  // Nothing is enqueued yet: a failure here leaves the communicator usable. (A wait enqueued
  // on the communication stream alone delays nothing but this communicator's later work.)
  if (ordered_after_compute()) {
    ZT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(op->ready, options_.compute_stream),
                                  name + ": cudaEventRecord on the compute stream"));
    ZT_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(stream_, op->ready, 0),
                                  name + ": cudaStreamWaitEvent for the compute stream"));
  }
  ZT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(op->start, stream_), name + ": cudaEventRecord"));
  std::move(release).Cancel();

  const std::string where = absl::StrCat(name, " on rank ", options_.rank, " of ", options_.size);
  const ncclResult_t r = AwaitNccl(launch(comm_, stream_), absl::Now() + timeout_);
  if (r != ncclSuccess) {
    const absl::Status status =
        r == ncclInProgress
            ? absl::DeadlineExceededError(absl::StrCat(
                  where, ": NCCL did not finish enqueuing within ", options_.timeout_seconds, " s"))
            : absl::Status(NcclCode(r), absl::StrCat(where, ": ", NcclErrorText(r)));
    Break(nullptr, status);
    return status;
  }
  const absl::Status recorded =
      CudaStatus(cudaEventRecord(op->end, stream_), where + ": cudaEventRecord after the launch");
  if (!recorded.ok()) {
    Break(nullptr, recorded);
    return recorded;
  }
  op->issued = absl::Now();
  CommHandle handle(op->state);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(op));
  }
  pending_cv_.notify_all();
  return handle;
}

void NcclCommunicator::WatcherLoop() {
  cudaSetDevice(options_.device);
  // When the front operation could start: when it was issued, or when the one before it
  // completed, whichever is later. Its timeout counts from there.
  absl::Time last_completion = absl::InfinitePast();
  absl::Duration poll = kMinPollInterval;
  while (true) {
    std::shared_ptr<Op> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      pending_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;
      op = pending_.front();
    }
    const absl::Time started = std::max(op->issued, last_completion);
    const cudaError_t e = cudaEventQuery(op->end);
    if (e == cudaSuccess) {
      float ms = 0;
      const bool timed = cudaEventElapsedTime(&ms, op->start, op->end) == cudaSuccess;
      cudaGetLastError();
      {
        std::lock_guard<std::mutex> lock(mu_);
        // Break may have failed this operation meanwhile (an issue on another thread).
        if (pending_.empty() || pending_.front() != op) continue;
        pending_.pop_front();
        CommStats::Entry& entry = stats_[op->kind];
        entry.calls += 1;
        entry.bytes_sent += op->bytes_sent;
        entry.bytes_received += op->bytes_received;
        if (timed) entry.seconds += ms / 1000.0;
      }
      Release(*op);
      op->state->Complete(absl::OkStatus());
      last_completion = absl::Now();
      poll = kMinPollInterval;
      continue;
    }
    const std::string where = absl::StrCat(OpName(op->kind, op->label), " on rank ", options_.rank,
                                           " of ", options_.size);
    if (e != cudaErrorNotReady) {
      const absl::Status status = CudaStatus(e, where + ": cudaEventQuery");
      std::lock_guard<std::mutex> comm_lock(comm_mu_);
      Break(op.get(), status);
      continue;
    }
    // The issuing thread holds comm_mu_ while NCCL enqueues; polling the error can wait a
    // round then, not the completion of earlier operations.
    if (comm_mu_.try_lock()) {
      std::lock_guard<std::mutex> comm_lock(comm_mu_, std::adopt_lock);
      ncclResult_t state = ncclSuccess;
      if (comm_ != nullptr) {
        const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
        if (queried != ncclSuccess) state = queried;
      }
      if (state != ncclSuccess && state != ncclInProgress) {
        Break(op.get(), absl::Status(NcclCode(state),
                                     absl::StrCat(where, " failed: ", NcclErrorText(state))));
        continue;
      }
    }
    if (absl::Now() - started > timeout_) {
      std::lock_guard<std::mutex> comm_lock(comm_mu_);
      Break(op.get(), absl::DeadlineExceededError(absl::StrCat(
                          where, ": not complete within ", options_.timeout_seconds,
                          " s (a peer did not join, or is stuck in an earlier operation); the "
                          "communicator was aborted")));
      continue;
    }
    absl::SleepFor(poll);
    poll = std::min(poll * 2, kMaxPollInterval);
  }
}

absl::StatusOr<CommHandle> NcclCommunicator::AllReduce(Tensor data, ReduceOp reduce,
                                                       const std::string& label) {
  const Device device{DeviceKind::kCuda, options_.device};
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kAllReduce, label, "data", data, device));
  const int64_t N = options_.size;
  const int64_t bytes = 2 * (N - 1) * data.size_bytes() / N;
  return Issue(CommKind::kAllReduce, label, bytes, bytes,
               [data, reduce](ncclComm_t c, cudaStream_t s) {
                 if (data.numel() == 0) return ncclSuccess;
                 return ncclAllReduce(data.raw(), data.raw(), static_cast<size_t>(data.numel()),
                                      NcclType(data.dtype()), NcclOp(reduce), c, s);
               });
}

absl::StatusOr<CommHandle> NcclCommunicator::ReduceScatter(Tensor input, Tensor output,
                                                           ReduceOp reduce,
                                                           const std::string& label) {
  const Device device{DeviceKind::kCuda, options_.device};
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kReduceScatter, label, "input", input, device));
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kReduceScatter, label, "output", output, device));
  const int64_t N = options_.size;
  const int64_t n = output.numel();
  if (input.dtype() != output.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReduceScatter '", label, "': output dtype ", DTypeName(output.dtype()),
                     " differs from input dtype ", DTypeName(input.dtype())));
  }
  if (input.numel() != N * n) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceScatter '", label, "': input has ",
                                                   input.numel(), " elements, expected ranks (", N,
                                                   ") x output elements (", n, ") = ", N * n));
  }
  const int64_t bytes = (N - 1) * output.size_bytes();
  return Issue(CommKind::kReduceScatter, label, bytes, bytes,
               [input, output, reduce](ncclComm_t c, cudaStream_t s) {
                 if (output.numel() == 0) return ncclSuccess;
                 return ncclReduceScatter(input.raw(), output.raw(),
                                          static_cast<size_t>(output.numel()),
                                          NcclType(input.dtype()), NcclOp(reduce), c, s);
               });
}

absl::StatusOr<CommHandle> NcclCommunicator::AllGather(Tensor input, Tensor output,
                                                       const std::string& label) {
  const Device device{DeviceKind::kCuda, options_.device};
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kAllGather, label, "input", input, device));
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kAllGather, label, "output", output, device));
  const int64_t N = options_.size;
  if (input.dtype() != output.dtype() || output.numel() != N * input.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGather '", label, "': output is ", output.DebugString(), ", expected ranks (", N,
        ") x input elements (", input.numel(), ") of input's dtype ", DTypeName(input.dtype())));
  }
  const int64_t bytes = (N - 1) * input.size_bytes();
  return Issue(CommKind::kAllGather, label, bytes, bytes,
               [input, output](ncclComm_t c, cudaStream_t s) {
                 if (input.numel() == 0) return ncclSuccess;
                 return ncclAllGather(input.raw(), output.raw(), static_cast<size_t>(input.numel()),
                                      NcclType(input.dtype()), c, s);
               });
}

absl::StatusOr<CommHandle> NcclCommunicator::Broadcast(Tensor data, int root,
                                                       const std::string& label) {
  const Device device{DeviceKind::kCuda, options_.device};
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kBroadcast, label, "data", data, device));
  ZT_RETURN_IF_ERROR(CheckRank(CommKind::kBroadcast, label, "root", root, options_.size));
  const bool is_root = options_.rank == root;
  return Issue(CommKind::kBroadcast, label, is_root ? (options_.size - 1) * data.size_bytes() : 0,
               is_root ? 0 : data.size_bytes(), [data, root](ncclComm_t c, cudaStream_t s) {
                 if (data.numel() == 0) return ncclSuccess;
                 return ncclBroadcast(data.raw(), data.raw(), static_cast<size_t>(data.numel()),
                                      NcclType(data.dtype()), root, c, s);
               });
}

absl::StatusOr<CommHandle> NcclCommunicator::Send(Tensor data, int peer, const std::string& label) {
  const Device device{DeviceKind::kCuda, options_.device};
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kSend, label, "data", data, device));
  ZT_RETURN_IF_ERROR(CheckRank(CommKind::kSend, label, "peer", peer, options_.size));
  if (peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send '", label, "': peer ", peer, " is this rank"));
  }
  return Issue(CommKind::kSend, label, data.size_bytes(), 0,
               [data, peer](ncclComm_t c, cudaStream_t s) {
                 if (data.numel() == 0) return ncclSuccess;
                 return ncclSend(data.raw(), static_cast<size_t>(data.numel()),
                                 NcclType(data.dtype()), peer, c, s);
               });
}

absl::StatusOr<CommHandle> NcclCommunicator::Recv(Tensor data, int peer, const std::string& label) {
  const Device device{DeviceKind::kCuda, options_.device};
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kRecv, label, "data", data, device));
  ZT_RETURN_IF_ERROR(CheckRank(CommKind::kRecv, label, "peer", peer, options_.size));
  if (peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("Recv '", label, "': peer ", peer, " is this rank"));
  }
  return Issue(CommKind::kRecv, label, 0, data.size_bytes(),
               [data, peer](ncclComm_t c, cudaStream_t s) {
                 if (data.numel() == 0) return ncclSuccess;
                 return ncclRecv(data.raw(), static_cast<size_t>(data.numel()),
                                 NcclType(data.dtype()), peer, c, s);
               });
}

absl::StatusOr<CommHandle> NcclCommunicator::Barrier(const std::string& label) {
  float* scratch = barrier_scratch_;
  return Issue(CommKind::kBarrier, label, 0, 0, [scratch](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, c, s);
  });
}

}  // namespace zt
