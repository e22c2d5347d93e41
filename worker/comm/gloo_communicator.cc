#include "worker/comm/gloo_communicator.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "kernels/status_macros.h"
#include "worker/comm/comm_handle_state.h"

namespace zt {
namespace {

// Slot prefixes above Gloo's own (0x01..0x08), so our transfers never match theirs.
constexpr uint64_t kRingSlotPrefix = uint64_t{0x40} << 56;
constexpr uint64_t kP2pSlotPrefix = uint64_t{0x41} << 56;

bool Is16Bit(DType t) { return t == DType::kBF16 || t == DType::kF16; }

void ToF32(const Tensor& t, int64_t offset, int64_t n, float* out) {
  const uint16_t* src = t.data<uint16_t>() + offset;
  if (t.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(src[i]);
  }
}

void FromF32(const float* in, int64_t n, const Tensor& t) {
  uint16_t* dst = t.data<uint16_t>();
  if (t.dtype() == DType::kBF16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBf16(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(in[i]);
  }
}

void Scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

absl::Status CheckBuffer(CommKind kind, const std::string& label, const char* arg,
                         const Tensor& t) {
  if (t.empty() && t.numel() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(CommKindName(kind), " '", label, "': ", arg, " has no data pointer"));
  }
  if (t.device().kind != DeviceKind::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat(CommKindName(kind), " '", label, "': ", arg,
                                                   " is not in host memory; Gloo moves host "
                                                   "buffers only"));
  }
  // An all-gather and a broadcast move bytes and add nothing, so i32 data (token ids) goes
  // too; a reduction needs a dtype it can add.
  const bool moves_only = kind == CommKind::kAllGather || kind == CommKind::kBroadcast;
  if (moves_only && t.dtype() == DType::kI32) return absl::OkStatus();
  if (t.dtype() != DType::kF32 && !Is16Bit(t.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        CommKindName(kind), " '", label, "': ", arg, " has dtype ", DTypeName(t.dtype()),
        moves_only ? ", expected f32, bf16, f16 or i32" : ", expected f32, bf16 or f16"));
  }
  return absl::OkStatus();
}

absl::Status CheckRank(CommKind kind, const std::string& label, const char* arg, int r, int n) {
  if (r < 0 || r >= n) {
    return absl::InvalidArgumentError(absl::StrCat(CommKindName(kind), " '", label, "': invalid ",
                                                   arg, " ", r, " (", arg, " should be in the 0..",
                                                   n - 1, " range)"));
  }
  return absl::OkStatus();
}

void WaitSend(gloo::transport::UnboundBuffer& buf, std::chrono::milliseconds timeout) {
  if (!buf.waitSend(nullptr, timeout)) throw gloo::IoException("send aborted");
}
void WaitRecv(gloo::transport::UnboundBuffer& buf, std::chrono::milliseconds timeout) {
  if (!buf.waitRecv(nullptr, timeout)) throw gloo::IoException("receive aborted");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooCommunicatorOptions& options) {
  if (absl::Status s = CheckRankAndSize("GlooCommunicatorOptions", options.rank, options.size);
      !s.ok()) {
    return s;
  }
  if (options.store == nullptr) {
    return absl::InvalidArgumentError("GlooCommunicatorOptions.store is null");
  }
  if (!(options.timeout_seconds > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("GlooCommunicatorOptions.timeout_seconds is ",
                                                   options.timeout_seconds, ", must be > 0"));
  }
  if (options.max_16bit_elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("GlooCommunicatorOptions.max_16bit_elements is ",
                                                   options.max_16bit_elements, ", must be >= 0"));
  }
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(options));
  try {
    gloo::transport::tcp::attr attr;
    if (options.iface.empty()) {
      attr.hostname = options.hostname;
    } else {
      attr.iface = options.iface;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(comm->timeout_);
    context->connectFullMesh(*comm->adapter_, device);
    // connectFullMesh can return on one rank while a peer is still completing its side of a
    // pair; a rank that then finished or failed at once closed the pair under that peer, whose
    // set-up failed "Connection closed by peer" (once in CI, under load). Every rank leaves
    // set-up only when all are connected. The tag is one no collective's sequence reaches.
    if (options.size > 1) {
      gloo::BarrierOptions setup(context);
      setup.setTag(std::numeric_limits<uint32_t>::max());
      setup.setTimeout(comm->timeout_);
      gloo::barrier(setup);
    }
    comm->context_ = std::move(context);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    const std::string msg =
        absl::StrCat("GlooCommunicator rendezvous of '", options.prefix, "' (rank ", options.rank,
                     " of ", options.size, ") failed: ", what);
    if (what.find("not set within") != std::string::npos) {
      return absl::DeadlineExceededError(msg);
    }
    return absl::UnavailableError(msg);
  }
  comm->worker_ = std::thread([c = comm.get()] { c->WorkerLoop(); });
  comm->heartbeat_ = std::thread([c = comm.get()] { c->HeartbeatLoop(); });
  return comm;
}

GlooCommunicator::GlooCommunicator(const GlooCommunicatorOptions& options)
    : options_(options),
      timeout_(
          std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000.0 + 0.5))),
      // Often enough that a lost peer is told from a slow one well inside the timeout.
      heartbeat_interval_(absl::Seconds(std::clamp(options.timeout_seconds / 10, 0.1, 1.0))),
      adapter_(std::make_unique<GlooStoreAdapter>(options.store,
                                                  absl::StrCat(options.prefix, "/gloo/"),
                                                  absl::Seconds(options.timeout_seconds))),
      sends_to_(options.size, 0),
      recvs_from_(options.size, 0) {
  convert_ = options.conversion_buffers[0];
  recv_ = options.conversion_buffers[1];
  if (convert_ == nullptr || recv_ == nullptr) {
    for (std::vector<float>& b : owned_conversion_) {
      b.resize(static_cast<size_t>(options.max_16bit_elements));
    }
    convert_ = owned_conversion_[0].data();
    recv_ = owned_conversion_[1].data();
  }
}

GlooCommunicator::~GlooCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
}

CommStats GlooCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

GlooCommunicator::Op GlooCommunicator::MakeCollective(CommKind kind, const std::string& label) {
  const uint64_t seq = collective_seq_++;
  Op op;
  op.kind = kind;
  op.label = label;
  op.progress_prefix = absl::StrCat(options_.prefix, "/progress/");
  op.sequence = seq;
  for (int r = 0; r < options_.size; ++r) op.participants.push_back(r);
  op.tag = static_cast<uint32_t>(seq);
  return op;
}

GlooCommunicator::Op GlooCommunicator::MakePointToPoint(CommKind kind, const std::string& label,
                                                        int src, int dst, uint64_t index) {
  Op op;
  op.kind = kind;
  op.label = label;
  op.progress_prefix = absl::StrCat(options_.prefix, "/p2p/", src, "to", dst, "/progress/");
  op.sequence = index;
  op.participants = {src, dst};
  return op;
}

CommHandle GlooCommunicator::Enqueue(Op op) {
  op.state = std::make_shared<CommHandle::State>();
  CommHandle handle(op.state);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
  }
  queue_cv_.notify_all();
  return handle;
}

void GlooCommunicator::WorkerLoop() {
  while (true) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        for (Op& left : queue_) {
          left.state->Complete(absl::CancelledError(
              absl::StrCat(CommKindName(left.kind), " '", left.label,
                           "': the communicator was destroyed before it ran")));
        }
        queue_.clear();
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      if (!first_error_.ok()) {
        // Whichever handle the caller waits on first must tell the cause, so later operations
        // carry the first failure (its code, collective, label and ranks).
        op.state->Complete(absl::Status(
            first_error_.code(),
            absl::StrCat(CommKindName(op.kind), " '", op.label,
                         "' not run: an earlier operation of this communicator failed: ",
                         first_error_.message())));
        continue;
      }
    }
    const absl::Time start = absl::Now();
    absl::Status status = Run(op);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    {
      std::lock_guard<std::mutex> lock(mu_);
      CommStats::Entry& e = stats_[op.kind];
      e.seconds += seconds;
      if (status.ok()) {
        e.calls += 1;
        e.bytes_sent += op.bytes_sent;
        e.bytes_received += op.bytes_received;
      } else {
        first_error_ = status;
      }
    }
    op.state->Complete(std::move(status));
  }
}

std::vector<int> GlooCommunicator::MissingRanks(const Op& op) const {
  std::vector<int> missing;
  for (int r : op.participants) {
    if (r == options_.rank) continue;
    absl::StatusOr<std::string> entered = options_.store->Get(absl::StrCat(op.progress_prefix, r));
    int64_t seq = -1;
    if (entered.ok() && !absl::SimpleAtoi(*entered, &seq)) seq = -1;
    if (seq < static_cast<int64_t>(op.sequence)) missing.push_back(r);
  }
  return missing;
}

std::vector<int> GlooCommunicator::UnresponsiveRanks(const std::vector<int>& ranks) const {
  // A rank that entered the operation and then died or hung stops beating: read every
  // counter, give them a few beats to move, and report those that did not.
  auto beats = [&] {
    std::vector<std::string> values;
    for (int r : ranks) {
      absl::StatusOr<std::string> v =
          options_.store->Get(absl::StrCat(options_.prefix, "/alive/", r));
      values.push_back(v.ok() ? *v : "");
    }
    return values;
  };
  const std::vector<std::string> before = beats();
  std::vector<bool> moved(ranks.size(), false);
  const absl::Time deadline = absl::Now() + 3 * heartbeat_interval_;
  while (absl::Now() < deadline) {
    absl::SleepFor(heartbeat_interval_ / 2);
    const std::vector<std::string> now = beats();
    bool all_moved = true;
    for (size_t i = 0; i < ranks.size(); ++i) {
      moved[i] = moved[i] || now[i] != before[i];
      all_moved &= moved[i];
    }
    if (all_moved) break;
  }
  std::vector<int> silent;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (!moved[i]) silent.push_back(ranks[i]);
  }
  return silent;
}

void GlooCommunicator::HeartbeatLoop() {
  int64_t beat = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    // A store that cannot be written now may be reachable at the next beat; a rank whose
    // beats stop is what peers report, so there is nothing better to do with the error.
    options_.store
        ->Set(absl::StrCat(options_.prefix, "/alive/", options_.rank), absl::StrCat(++beat))
        .IgnoreError();
    lock.lock();
    queue_cv_.wait_for(lock, absl::ToChronoMilliseconds(heartbeat_interval_),
                       [&] { return stopping_; });
  }
}

absl::Status GlooCommunicator::Run(const Op& op) {
  absl::Status entered = options_.store->Set(absl::StrCat(op.progress_prefix, options_.rank),
                                             absl::StrCat(op.sequence));
  if (!entered.ok()) {
    return absl::UnavailableError(
        absl::StrCat(CommKindName(op.kind), " '", op.label,
                     "': cannot record progress in the store: ", entered.message()));
  }
  std::string what;
  try {
    op.body(op);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    what = e.what();
  }
  const std::string where = absl::StrCat(CommKindName(op.kind), " '", op.label, "' on rank ",
                                         options_.rank, " of ", options_.size);
  const std::vector<int> missing = MissingRanks(op);
  if (!missing.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat(where, ": ranks [", absl::StrJoin(missing, ", "), "] did not arrive within ",
                     options_.timeout_seconds, " s (", what, ")"));
  }
  std::vector<int> others;
  for (int r : op.participants) {
    if (r != options_.rank) others.push_back(r);
  }
  const std::vector<int> silent = UnresponsiveRanks(others);
  if (!silent.empty()) {
    return absl::UnavailableError(absl::StrCat(where, ": ranks [", absl::StrJoin(silent, ", "),
                                               "] stopped responding during it (no heartbeat for ",
                                               absl::FormatDuration(3 * heartbeat_interval_),
                                               ": the process died or hung) (", what, ")"));
  }
  return absl::UnavailableError(absl::StrCat(where, " failed: ", what));
}

absl::StatusOr<CommHandle> GlooCommunicator::AllReduce(Tensor data, ReduceOp reduce,
                                                       const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kAllReduce, label, "data", data));
  const int64_t n = data.numel();
  if (Is16Bit(data.dtype()) && options_.size > 1 && n > options_.max_16bit_elements) {
    return absl::InvalidArgumentError(absl::StrCat("AllReduce '", label, "': data has ", n,
                                                   " 16-bit elements, more than the conversion "
                                                   "buffer's max_16bit_elements = ",
                                                   options_.max_16bit_elements));
  }
  Op op = MakeCollective(CommKind::kAllReduce, label);
  const int64_t N = options_.size;
  op.bytes_sent = op.bytes_received = 2 * (N - 1) * n * 4 / N;
  op.body = [this, data, reduce, n](const Op& o) {
    // One rank: the sum, average, or any reduction of one value is that value.
    if (options_.size == 1) return;
    float* buf = Is16Bit(data.dtype()) ? convert_ : data.data<float>();
    if (Is16Bit(data.dtype())) ToF32(data, 0, n, buf);
    if (n > 0) {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput<float>(buf, static_cast<size_t>(n));
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTag(o.tag);
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    }
    if (reduce == ReduceOp::kAvg) Scale(buf, n, 1.0f / static_cast<float>(options_.size));
    if (Is16Bit(data.dtype())) FromF32(buf, n, data);
  };
  return Enqueue(std::move(op));
}

void GlooCommunicator::RingReduceScatter(float* work, float* scratch, float* out, int64_t n,
                                         uint32_t tag) {
  // Chunk c starts at rank c+1 and travels right, each rank adding its own chunk c, so after
  // N−1 steps it arrives complete at rank c. At step s rank r sends chunk r−s−1 and receives
  // chunk r−s−2 (mod N).
  const int N = options_.size;
  const int r = options_.rank;
  const int right = (r + 1) % N;
  const int left = (r + N - 1) % N;
  const size_t chunk_bytes = static_cast<size_t>(n) * sizeof(float);
  auto send_buf = context_->createUnboundBuffer(work, chunk_bytes * N);
  auto recv_buf = context_->createUnboundBuffer(scratch, chunk_bytes);
  for (int s = 0; s + 1 < N; ++s) {
    const int send_c = ((r - s - 1) % N + N) % N;
    const int recv_c = ((r - s - 2) % N + N) % N;
    const uint64_t slot = kRingSlotPrefix | (uint64_t{tag} << 16) | static_cast<uint64_t>(s);
    recv_buf->recv(left, slot);
    send_buf->send(right, slot, send_c * chunk_bytes, chunk_bytes);
    WaitRecv(*recv_buf, timeout_);
    WaitSend(*send_buf, timeout_);
    float* acc = work + static_cast<int64_t>(recv_c) * n;
    for (int64_t i = 0; i < n; ++i) acc[i] += scratch[i];
  }
  const float* mine = work + static_cast<int64_t>(r) * n;
  std::copy(mine, mine + n, out);
}

absl::StatusOr<CommHandle> GlooCommunicator::ReduceScatter(Tensor input, Tensor output,
                                                           ReduceOp reduce,
                                                           const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kReduceScatter, label, "input", input));
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kReduceScatter, label, "output", output));
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
  if (Is16Bit(input.dtype()) && N > 1 && N * n > options_.max_16bit_elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReduceScatter '", label, "': input has ", N * n,
                     " 16-bit elements, more than the conversion buffer's max_16bit_elements = ",
                     options_.max_16bit_elements));
  }
  Op op = MakeCollective(CommKind::kReduceScatter, label);
  op.bytes_sent = op.bytes_received = (N - 1) * n * 4;
  op.body = [this, input, output, reduce, n](const Op& o) {
    if (options_.size == 1) {  // the whole input is this rank's reduced chunk, unchanged
      if (input.raw() != output.raw()) {
        std::copy(input.data<uint8_t>(), input.data<uint8_t>() + input.size_bytes(),
                  output.data<uint8_t>());
      }
      return;
    }
    const bool half = Is16Bit(input.dtype());
    float* work = half ? convert_ : input.data<float>();
    if (half) ToF32(input, 0, n * options_.size, work);
    // The f32 result lands in place in work's chunk r, then moves to the output. Received
    // chunks land in the output itself when it is f32 (it is free until the last step), else
    // in the second conversion buffer.
    float* out = half ? work + static_cast<int64_t>(options_.rank) * n : output.data<float>();
    float* scratch = half ? recv_ : output.data<float>();
    RingReduceScatter(work, scratch, out, n, o.tag);
    if (reduce == ReduceOp::kAvg) Scale(out, n, 1.0f / static_cast<float>(options_.size));
    if (half) FromF32(out, n, output);
  };
  return Enqueue(std::move(op));
}

absl::StatusOr<CommHandle> GlooCommunicator::AllGather(Tensor input, Tensor output,
                                                       const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kAllGather, label, "input", input));
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kAllGather, label, "output", output));
  const int64_t N = options_.size;
  if (input.dtype() != output.dtype() || output.numel() != N * input.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllGather '", label, "': output is ", output.DebugString(), ", expected ranks (", N,
        ") x input elements (", input.numel(), ") of input's dtype ", DTypeName(input.dtype())));
  }
  Op op = MakeCollective(CommKind::kAllGather, label);
  op.bytes_sent = op.bytes_received = (N - 1) * input.size_bytes();
  op.body = [this, input, output](const Op& o) {
    const size_t bytes = static_cast<size_t>(input.size_bytes());
    // In place (as NCCL) when the input already is this rank's chunk of the output.
    const bool in_place = input.data<uint8_t>() == output.data<uint8_t>() + options_.rank * bytes;
    if (options_.size == 1) {
      if (!in_place) {
        std::copy(input.data<uint8_t>(), input.data<uint8_t>() + bytes, output.data<uint8_t>());
      }
      return;
    }
    gloo::AllgatherOptions opts(context_);
    if (!in_place) opts.setInput<uint8_t>(input.data<uint8_t>(), bytes);
    opts.setOutput<uint8_t>(output.data<uint8_t>(), bytes * options_.size);
    opts.setTag(o.tag);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  };
  return Enqueue(std::move(op));
}

absl::StatusOr<CommHandle> GlooCommunicator::Broadcast(Tensor data, int root,
                                                       const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kBroadcast, label, "data", data));
  ZT_RETURN_IF_ERROR(CheckRank(CommKind::kBroadcast, label, "root", root, options_.size));
  Op op = MakeCollective(CommKind::kBroadcast, label);
  if (options_.rank == root) {
    op.bytes_sent = (options_.size - 1) * data.size_bytes();
  } else {
    op.bytes_received = data.size_bytes();
  }
  op.body = [this, data, root](const Op& o) {
    if (options_.size == 1) return;
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<uint8_t>(data.data<uint8_t>(), static_cast<size_t>(data.size_bytes()));
    opts.setRoot(root);
    opts.setTag(o.tag);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  };
  return Enqueue(std::move(op));
}

absl::StatusOr<CommHandle> GlooCommunicator::Send(Tensor data, int peer, const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kSend, label, "data", data));
  ZT_RETURN_IF_ERROR(CheckRank(CommKind::kSend, label, "peer", peer, options_.size));
  if (peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("Send '", label, "': peer ", peer, " is this rank"));
  }
  const uint64_t index = sends_to_[peer]++;
  Op op = MakePointToPoint(CommKind::kSend, label, options_.rank, peer, index);
  op.bytes_sent = data.size_bytes();
  op.body = [this, data, peer, index](const Op&) {
    auto buf = context_->createUnboundBuffer(data.raw(), static_cast<size_t>(data.size_bytes()));
    buf->send(peer, kP2pSlotPrefix | index);
    WaitSend(*buf, timeout_);
  };
  return Enqueue(std::move(op));
}

absl::StatusOr<CommHandle> GlooCommunicator::Recv(Tensor data, int peer, const std::string& label) {
  ZT_RETURN_IF_ERROR(CheckBuffer(CommKind::kRecv, label, "data", data));
  ZT_RETURN_IF_ERROR(CheckRank(CommKind::kRecv, label, "peer", peer, options_.size));
  if (peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("Recv '", label, "': peer ", peer, " is this rank"));
  }
  const uint64_t index = recvs_from_[peer]++;
  Op op = MakePointToPoint(CommKind::kRecv, label, peer, options_.rank, index);
  op.bytes_received = data.size_bytes();
  op.body = [this, data, peer, index](const Op&) {
    auto buf = context_->createUnboundBuffer(data.raw(), static_cast<size_t>(data.size_bytes()));
    buf->recv(peer, kP2pSlotPrefix | index);
    WaitRecv(*buf, timeout_);
  };
  return Enqueue(std::move(op));
}

absl::StatusOr<CommHandle> GlooCommunicator::Barrier(const std::string& label) {
  Op op = MakeCollective(CommKind::kBarrier, label);
  op.body = [this](const Op& o) {
    if (options_.size == 1) return;
    gloo::BarrierOptions opts(context_);
    opts.setTag(o.tag);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  };
  return Enqueue(std::move(op));
}

}  // namespace zt
