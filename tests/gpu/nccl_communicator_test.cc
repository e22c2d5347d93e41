// NcclCommunicator on CUDA devices. Without a GPU every test skips with the reason, except the
// one that checks Create's FailedPrecondition there. Data are small integers (|v| < 64), so
// sums over two ranks and power-of-two means are exact in f32, bf16 and f16: results are
// compared for equality with a float64 reference.
#if defined(ZT_HAVE_NCCL)

#include "worker/comm/cuda/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "tests/gpu/gpu_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

using gpu_test::SkipReason;

std::string UniquePrefix() {
  static int counter = 0;
  return absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "#",
                      counter++);
}

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 3 + (i % 17) - 8); }

// A device allocation holding `n` elements of `dtype`.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, DType dtype, int64_t n) : device_(device), dtype_(dtype), n_(n) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&ptr_, static_cast<size_t>(std::max<int64_t>(n, 1) * DTypeSize(dtype))),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Tensor tensor() const { return Tensor(ptr_, dtype_, {n_}, Device{DeviceKind::kCuda, device_}); }

  void Upload(const std::vector<double>& values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), n_);
    std::vector<uint8_t> bytes(static_cast<size_t>(n_ * DTypeSize(dtype_)));
    for (int64_t i = 0; i < n_; ++i) {
      const float f = static_cast<float>(values[i]);
      if (dtype_ == DType::kF32) {
        std::memcpy(bytes.data() + 4 * i, &f, 4);
      } else {
        const uint16_t h = dtype_ == DType::kBF16 ? FloatToBf16(f) : FloatToHalf(f);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    ASSERT_EQ(cudaMemcpy(ptr_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }

  // A NaN in every element, so that an element the operation did not write fails the test.
  void FillNaN() {
    ASSERT_EQ(cudaMemset(ptr_, 0xff, static_cast<size_t>(n_ * DTypeSize(dtype_))), cudaSuccess);
  }

  std::vector<double> Download() const {
    std::vector<uint8_t> bytes(static_cast<size_t>(n_ * DTypeSize(dtype_)));
    EXPECT_EQ(cudaMemcpy(bytes.data(), ptr_, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    std::vector<double> out(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) {
      if (dtype_ == DType::kF32) {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        out[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = dtype_ == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
      }
    }
    return out;
  }

 private:
  int device_;
  DType dtype_;
  int64_t n_;
  void* ptr_ = nullptr;
};

std::vector<double> Values(int rank, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = Value(rank, i);
  return v;
}

void WaitOk(const absl::StatusOr<CommHandle>& h) {
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Status s = h->Wait();
  ASSERT_TRUE(s.ok()) << s;
}

std::unique_ptr<NcclCommunicator> SingleRank(double timeout_seconds = 60) {
  auto comm = NcclCommunicator::Create({.rank = 0,
                                        .size = 1,
                                        .device = 0,
                                        .prefix = UniquePrefix(),
                                        .timeout_seconds = timeout_seconds});
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

TEST(NcclCommunicatorTest, CreateWithoutGpuIsFailedPrecondition) {
  if (!SkipReason(1).has_value()) GTEST_SKIP() << "a CUDA device is present";
  auto comm = NcclCommunicator::Create({});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(comm.status().message(), HasSubstr("cudaGetDeviceCount"));
}

struct OptionsCase {
  NcclCommunicatorOptions options;
  std::string message;
};

void ExpectInvalidOptions(const std::vector<OptionsCase>& cases) {
  for (const OptionsCase& c : cases) {
    auto comm = NcclCommunicator::Create(c.options);
    ASSERT_FALSE(comm.ok()) << c.message;
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument) << comm.status();
    EXPECT_THAT(comm.status().message(), HasSubstr(c.message));
  }
}

// Options are checked before any device is touched, so this runs without a GPU too.
TEST(NcclCommunicatorTest, BadOptionsNameTheField) {
  ExpectInvalidOptions({
      {{.size = 0}, "NcclCommunicatorOptions.size is 0"},
      {{.rank = 2, .size = 2}, "NcclCommunicatorOptions.rank is 2, must be in 0..1"},
      {{.rank = 1, .size = 2}, "NcclCommunicatorOptions.store is null"},
      {{.device = -1}, "NcclCommunicatorOptions.device is -1, must be >= 0"},
      {{.timeout_seconds = 0}, "NcclCommunicatorOptions.timeout_seconds is 0"},
  });
}

TEST(NcclCommunicatorTest, DeviceBeyondTheVisibleOnesIsInvalidArgument) {
  if (auto reason = SkipReason(1)) GTEST_SKIP() << *reason;
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ExpectInvalidOptions(
      {{{.device = count},
        absl::StrCat("NcclCommunicatorOptions.device is ", count, ", must be in 0..", count - 1)}});
}

TEST(NcclCommunicatorTest, BadBuffersAndRanksAreInvalidArgument) {
  if (auto reason = SkipReason(1)) GTEST_SKIP() << *reason;
  auto comm = SingleRank();
  ASSERT_NE(comm, nullptr);
  DeviceBuffer dev(0, DType::kF32, 8);
  std::vector<float> host(8);
  const Tensor on_host(host.data(), DType::kF32, {8});
  const Tensor as_i32(dev.tensor().raw(), DType::kI32, {8}, Device{DeviceKind::kCuda, 0});
  const Tensor other_device(dev.tensor().raw(), DType::kF32, {8}, Device{DeviceKind::kCuda, 1});
  struct Case {
    absl::StatusOr<CommHandle> result;
    std::string message;
  };
  const std::vector<Case> cases = {
      {comm->AllReduce(on_host, ReduceOp::kSum, "host"),
       "AllReduce 'host': data is on cpu:0, expected cuda:0"},
      {comm->AllReduce(other_device, ReduceOp::kSum, "other"),
       "AllReduce 'other': data is on cuda:1, expected cuda:0"},
      {comm->Broadcast(as_i32, 0, "ints"), "data has dtype i32, expected f32, bf16 or f16"},
      {comm->ReduceScatter(dev.tensor(), dev.tensor().Reshape({2, 4}).Slice(0, 1), ReduceOp::kSum,
                           "rs"),
       "ReduceScatter 'rs': input has 8 elements, expected ranks (1) x output elements (4) = 4"},
      {comm->AllGather(dev.tensor(), dev.tensor().Reshape({2, 4}).Slice(0, 1), "ag"),
       "AllGather 'ag': output is f32[1, 4], expected ranks (1) x input elements (8)"},
      {comm->Broadcast(dev.tensor(), 1, "bc"),
       "Broadcast 'bc': invalid root 1 (root should be in the 0..0 range)"},
      {comm->Send(dev.tensor(), 0, "self"), "Send 'self': peer 0 is this rank"},
      {comm->Recv(dev.tensor(), -1, "neg"), "Recv 'neg': invalid peer -1"},
  };
  for (const Case& c : cases) {
    ASSERT_FALSE(c.result.ok()) << c.message;
    EXPECT_EQ(c.result.status().code(), absl::StatusCode::kInvalidArgument) << c.result.status();
    EXPECT_THAT(c.result.status().message(), HasSubstr(c.message));
  }
  // Validation failures enqueue nothing and leave the communicator usable.
  WaitOk(comm->Barrier("after bad arguments"));
}

// With a compute stream, an operation starts only once the compute stream reached the point
// where it was issued: the compute stream is held for 200 ms by a host function, then writes
// the input; the gather, issued at once, must carry the written values (without the ordering
// the communication stream would copy the old ones long before). And the communication stream
// is not the compute stream: work the compute stream queues after the operation does not hold
// the operation's completion back.
TEST(NcclCommunicatorTest, OperationsWaitForTheComputeStreamIssuedBeforeThem) {
  if (auto reason = SkipReason(1)) GTEST_SKIP() << *reason;
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  {
    auto comm = NcclCommunicator::Create({.rank = 0,
                                          .size = 1,
                                          .device = 0,
                                          .prefix = UniquePrefix(),
                                          .timeout_seconds = 60,
                                          .compute_stream = compute});
    ASSERT_TRUE(comm.ok()) << comm.status();
    ASSERT_NE((*comm)->stream(), compute);
    constexpr int64_t n = 4096;
    DeviceBuffer input(0, DType::kF32, n), output(0, DType::kF32, n);
    input.Upload(std::vector<double>(n, 0.0));
    output.FillNaN();
    std::atomic<bool> released{false};
    auto hold = [](void* flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      static_cast<std::atomic<bool>*>(flag)->store(true);
    };
    ASSERT_EQ(cudaLaunchHostFunc(compute, hold, &released), cudaSuccess);
    // From page-locked memory, so the copy is queued behind the host function, not run now.
    float* ones = nullptr;
    ASSERT_EQ(cudaMallocHost(&ones, n * sizeof(float)), cudaSuccess);
    std::fill(ones, ones + n, 1.0f);
    ASSERT_EQ(cudaMemcpyAsync(input.tensor().raw(), ones, n * sizeof(float),
                              cudaMemcpyHostToDevice, compute),
              cudaSuccess);
    auto gathered = (*comm)->AllGather(input.tensor(), output.tensor(), "ordered gather");
    WaitOk(gathered);
    EXPECT_TRUE(released.load()) << "the gather completed before the compute stream got there";
    for (double v : output.Download()) ASSERT_EQ(v, 1.0);

    // The compute stream now queues 200 ms of work after a second gather: the gather's handle
    // completes long before that work ends.
    released = false;
    auto overlapped = (*comm)->AllGather(input.tensor(), output.tensor(), "overlapped gather");
    ASSERT_EQ(cudaLaunchHostFunc(compute, hold, &released), cudaSuccess);
    WaitOk(overlapped);
    EXPECT_FALSE(released.load()) << "the gather waited for compute issued after it";
    ASSERT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
    cudaFreeHost(ones);
  }
  cudaStreamDestroy(compute);
}

class SingleGpuTest : public ::testing::TestWithParam<DType> {};

TEST_P(SingleGpuTest, CollectivesEqualTheirDefinitions) {
  if (auto reason = SkipReason(1)) GTEST_SKIP() << *reason;
  const DType dtype = GetParam();
  auto comm = SingleRank();
  ASSERT_NE(comm, nullptr);
  constexpr int64_t n = 1000;
  const std::vector<double> x = Values(0, n);  // with one rank, every definition returns x

  DeviceBuffer sum(0, dtype, n), avg(0, dtype, n), rs_out(0, dtype, n), ag_out(0, dtype, n),
      bcast(0, dtype, n), input(0, dtype, n);
  sum.Upload(x);
  avg.Upload(x);
  bcast.Upload(x);
  input.Upload(x);
  // Out of place, over NaNs: an element a wrong dtype or count misses stays NaN.
  rs_out.FillNaN();
  ag_out.FillNaN();

  auto h_sum = comm->AllReduce(sum.tensor(), ReduceOp::kSum, "sum");
  auto h_avg = comm->AllReduce(avg.tensor(), ReduceOp::kAvg, "avg");
  auto h_rs = comm->ReduceScatter(input.tensor(), rs_out.tensor(), ReduceOp::kSum, "rs");
  auto h_ag = comm->AllGather(input.tensor(), ag_out.tensor(), "ag");
  auto h_bc = comm->Broadcast(bcast.tensor(), 0, "bc");
  auto h_barrier = comm->Barrier("barrier");
  WaitOk(h_barrier);
  // Handles complete in issue order: the last one done means all are.
  for (const auto* h : {&h_sum, &h_avg, &h_rs, &h_ag, &h_bc}) {
    ASSERT_TRUE(h->ok()) << h->status();
    EXPECT_TRUE((*h)->Done());
    WaitOk(*h);
  }
  for (const DeviceBuffer* b : {&sum, &avg, &rs_out, &ag_out, &bcast}) {
    const std::vector<double> got = b->Download();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], x[i]) << "i=" << i;
  }

  const CommStats stats = comm->stats();
  EXPECT_EQ(stats[CommKind::kAllReduce].calls, 2);
  EXPECT_EQ(stats[CommKind::kReduceScatter].calls, 1);
  EXPECT_EQ(stats[CommKind::kAllGather].calls, 1);
  EXPECT_EQ(stats[CommKind::kBroadcast].calls, 1);
  EXPECT_EQ(stats[CommKind::kBarrier].calls, 1);
  EXPECT_EQ(stats[CommKind::kSend].calls, 0);
  for (const CommStats::Entry& e : stats.by_kind) {
    // One rank moves nothing: every nominal volume has the factor N − 1 = 0.
    EXPECT_EQ(e.bytes_sent, 0);
    EXPECT_EQ(e.bytes_received, 0);
    EXPECT_GE(e.seconds, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SingleGpuTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Holds the communication stream in a host callback until opened: the only way one rank can
// make an operation outlast the timeout.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;

  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
  static void CUDART_CB Hold(void* self) {
    Gate* g = static_cast<Gate*>(self);
    std::unique_lock<std::mutex> lock(g->mu);
    g->cv.wait(lock, [&] { return g->open; });
  }
};

TEST(NcclCommunicatorTest, TimeoutAbortsAndBreaksTheCommunicator) {
  if (auto reason = SkipReason(1)) GTEST_SKIP() << *reason;
  // Long enough for NCCL's initialisation, short for a test.
  constexpr double kTimeout = 3;
  auto comm = SingleRank(kTimeout);
  ASSERT_NE(comm, nullptr);
  DeviceBuffer buf(0, DType::kF32, 256);
  buf.Upload(Values(0, 256));
  WaitOk(comm->AllReduce(buf.tensor(), ReduceOp::kSum, "warm-up"));

  Gate gate;
  // Should ncclCommAbort wait for the stream, the gate opens by itself and the test still
  // sees the deadline it checks, only later.
  std::thread opener([&] {
    std::unique_lock<std::mutex> lock(gate.mu);
    gate.cv.wait_for(lock, std::chrono::seconds(30), [&] { return gate.open; });
    lock.unlock();
    gate.Open();
  });
  ASSERT_EQ(cudaLaunchHostFunc(comm->stream(), &Gate::Hold, &gate), cudaSuccess);
  auto stalled = comm->AllReduce(buf.tensor(), ReduceOp::kSum, "stalled");
  auto queued = comm->AllGather(buf.tensor(), buf.tensor(), "queued");
  ASSERT_TRUE(stalled.ok()) << stalled.status();
  ASSERT_TRUE(queued.ok()) << queued.status();
  const absl::Status s1 = stalled->Wait();
  const absl::Status s2 = queued->Wait();
  gate.Open();
  opener.join();
  // Drains the callback before the buffers go; what the aborted work reports is not checked.
  cudaStreamSynchronize(comm->stream());
  cudaGetLastError();

  EXPECT_EQ(s1.code(), absl::StatusCode::kDeadlineExceeded) << s1;
  EXPECT_THAT(s1.message(),
              HasSubstr("AllReduce 'stalled' on rank 0 of 1: not complete within 3 s"));
  EXPECT_EQ(s2.code(), absl::StatusCode::kFailedPrecondition) << s2;
  EXPECT_THAT(s2.message(), HasSubstr("AllGather 'queued': the communicator was aborted"));

  auto later = comm->Barrier("later");
  ASSERT_TRUE(later.ok()) << later.status();
  const absl::Status s3 = later->Wait();
  EXPECT_EQ(s3.code(), absl::StatusCode::kFailedPrecondition) << s3;
  EXPECT_THAT(s3.message(),
              HasSubstr("Barrier 'later': an earlier operation of this communicator failed"));
  EXPECT_THAT(s3.message(), HasSubstr("AllReduce 'stalled'"));
  // Only the warm-up succeeded.
  EXPECT_EQ(comm->stats()[CommKind::kAllReduce].calls, 1);
}

class TwoGpuTest : public ::testing::TestWithParam<DType> {};

// Two ranks as threads of this process, rank r on device r, meeting in an InProcessStore.
TEST_P(TwoGpuTest, CollectivesMatchTheHostReference) {
  if (auto reason = SkipReason(2)) GTEST_SKIP() << *reason;
  const DType dtype = GetParam();
  constexpr int N = 2;
  constexpr int64_t n = 1000;  // elements per rank's chunk
  const int64_t b = n * DTypeSize(dtype);
  InProcessStore store;
  const std::string prefix = UniquePrefix();
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    threads.emplace_back([&, r] {
      auto created = NcclCommunicator::Create({.rank = r,
                                               .size = N,
                                               .device = r,
                                               .store = &store,
                                               .prefix = prefix,
                                               .timeout_seconds = 60});
      ASSERT_TRUE(created.ok()) << created.status();
      NcclCommunicator& comm = **created;

      DeviceBuffer sum(r, dtype, N * n), avg(r, dtype, N * n), rs_in(r, dtype, N * n),
          rs_out(r, dtype, n), ag_in(r, dtype, n), ag_out(r, dtype, N * n), bcast(r, dtype, n),
          p2p(r, dtype, n), rs_in_place(r, dtype, N * n), ag_in_place(r, dtype, N * n);
      sum.Upload(Values(r, N * n));
      avg.Upload(Values(r, N * n));
      rs_in.Upload(Values(r, N * n));
      rs_out.FillNaN();
      ag_in.Upload(Values(r, n));
      ag_out.FillNaN();
      bcast.Upload(Values(r, n));
      rs_in_place.Upload(Values(r, N * n));
      // In place: this rank's chunk holds its input, the others NaN until gathered.
      ag_in_place.FillNaN();
      {
        const std::vector<double> mine = Values(r, n);
        std::vector<double> chunk_r = ag_in_place.Download();
        std::copy(mine.begin(), mine.end(), chunk_r.begin() + r * n);
        ag_in_place.Upload(chunk_r);
      }
      const Tensor rs_chunk = rs_in_place.tensor().Reshape({N, n}).Slice(r, r + 1);
      const Tensor ag_chunk = ag_in_place.tensor().Reshape({N, n}).Slice(r, r + 1);
      if (r == 0) {
        p2p.Upload(Values(7, n));
      } else {
        p2p.FillNaN();
      }

      WaitOk(comm.AllReduce(sum.tensor(), ReduceOp::kSum, "sum"));
      WaitOk(comm.AllReduce(avg.tensor(), ReduceOp::kAvg, "avg"));
      WaitOk(comm.ReduceScatter(rs_in.tensor(), rs_out.tensor(), ReduceOp::kSum, "rs"));
      WaitOk(comm.AllGather(ag_in.tensor(), ag_out.tensor(), "ag"));
      WaitOk(comm.ReduceScatter(rs_in_place.tensor(), rs_chunk, ReduceOp::kSum, "rs in place"));
      WaitOk(comm.AllGather(ag_chunk, ag_in_place.tensor(), "ag in place"));
      WaitOk(comm.Broadcast(bcast.tensor(), 1, "bc"));
      WaitOk(r == 0 ? comm.Send(p2p.tensor(), 1, "p2p") : comm.Recv(p2p.tensor(), 0, "p2p"));
      WaitOk(comm.Barrier("end"));

      const std::vector<double> got_sum = sum.Download(), got_avg = avg.Download(),
                                got_rs = rs_out.Download(), got_ag = ag_out.Download(),
                                got_bc = bcast.Download(), got_p2p = p2p.Download(),
                                got_rs_in_place = rs_in_place.Download(),
                                got_ag_in_place = ag_in_place.Download();
      for (int64_t i = 0; i < N * n; ++i) {
        double ref = 0;
        for (int q = 0; q < N; ++q) ref += Value(q, i);
        ASSERT_EQ(got_sum[i], ref) << "rank " << r << " i=" << i;
        ASSERT_EQ(got_avg[i], ref / N) << "rank " << r << " i=" << i;
        ASSERT_EQ(got_ag[i], Value(static_cast<int>(i / n), i % n)) << "rank " << r << " i=" << i;
        ASSERT_EQ(got_ag_in_place[i], got_ag[i]) << "rank " << r << " i=" << i;
      }
      for (int64_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int q = 0; q < N; ++q) ref += Value(q, r * n + i);
        ASSERT_EQ(got_rs[i], ref) << "rank " << r << " i=" << i;
        ASSERT_EQ(got_rs_in_place[r * n + i], ref) << "rank " << r << " i=" << i;
        ASSERT_EQ(got_bc[i], Value(1, i)) << "rank " << r << " i=" << i;
        ASSERT_EQ(got_p2p[i], Value(7, i)) << "rank " << r << " i=" << i;
      }

      // The nominal ring volumes of the header, b = bytes of one n-element chunk.
      const CommStats st = comm.stats();
      EXPECT_EQ(st[CommKind::kAllReduce].calls, 2);
      EXPECT_EQ(st[CommKind::kAllReduce].bytes_sent, 2 * (2 * (N - 1) * (N * b) / N));
      EXPECT_EQ(st[CommKind::kReduceScatter].bytes_received, 2 * (N - 1) * b);
      EXPECT_EQ(st[CommKind::kAllGather].bytes_sent, 2 * (N - 1) * b);
      EXPECT_EQ(st[CommKind::kBroadcast].bytes_sent, r == 1 ? (N - 1) * b : 0);
      EXPECT_EQ(st[CommKind::kBroadcast].bytes_received, r == 1 ? 0 : b);
      EXPECT_EQ(st[r == 0 ? CommKind::kSend : CommKind::kRecv].calls, 1);
      EXPECT_EQ(st[CommKind::kSend].bytes_sent, r == 0 ? b : 0);
      EXPECT_EQ(st[CommKind::kRecv].bytes_received, r == 1 ? b : 0);
      EXPECT_EQ(st[CommKind::kBarrier].bytes_sent, 0);
      EXPECT_GT(st[CommKind::kAllReduce].seconds, 0);
    });
  }
  for (auto& t : threads) t.join();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TwoGpuTest,
                         ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace zt

#else  // !ZT_HAVE_NCCL

#include "gtest/gtest.h"

TEST(NcclCommunicatorTest, NeedsNccl) {
  GTEST_SKIP() << "built without CUDA and NCCL (ZT_HAVE_NCCL is not defined)";
}

#endif  // ZT_HAVE_NCCL
