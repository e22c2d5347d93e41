// StagedCommunicator with the CUDA copy engine: 2 and 4 ranks on one GPU (NCCL refuses that),
// over Gloo. Each rank's buffer is written by an asynchronous host → device copy on the rank's
// compute stream and the collective is issued right after it, unsynchronized, so a copy engine
// that did not wait for the issue point would send stale data. Small integers: exact sums.
#if defined(ZT_HAVE_NCCL)

#include <cuda_runtime_api.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "worker/comm/cuda/cuda_copy_engine.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/staged_communicator.h"
#include "worker/comm/store.h"

namespace zt {
namespace {

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 3 + (i % 17) - 8); }

class StagedGpuTest : public ::testing::TestWithParam<int> {};

TEST_P(StagedGpuTest, AllReduceAndReduceScatterOfBuffersJustWrittenOnTheComputeStream) {
  ZT_SKIP_WITHOUT_GPU();
  const int N = GetParam();
  constexpr int64_t n = (int64_t{1} << 20) + 3;  // several 1 MiB staging chunks
  InProcessStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    threads.emplace_back([&, r] {
      gpu_test::GpuStream compute;
      auto host = GlooCommunicator::Create(
          {.rank = r, .size = N, .store = &store, .prefix = absl::StrCat("staged", N)});
      ASSERT_TRUE(host.ok()) << host.status();
      auto engine = CudaCopyEngine::Create(0, compute.get());
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto comm = StagedCommunicator::Create({.host = std::move(*host),
                                              .copies = std::move(*engine),
                                              .staging_bytes = int64_t{1} << 20});
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> values(n), back(n);
      for (int64_t i = 0; i < n; ++i) values[i] = Value(r, i);
      gpu_test::DeviceBuffer data(n * 4), scattered(n / N * 4 + 4);
      ZT_ASSERT_CUDA(cudaMemcpyAsync(data.data(), values.data(), n * 4, cudaMemcpyHostToDevice,
                                     compute.get()));
      auto h = (*comm)->AllReduce(Tensor(data.data(), DType::kF32, {n}, gpu_test::Gpu0()),
                                  ReduceOp::kSum, "grads");
      ASSERT_TRUE(h.ok()) << h.status();
      ASSERT_TRUE(h->Wait().ok()) << h->Wait();
      ZT_ASSERT_CUDA(cudaMemcpy(back.data(), data.data(), n * 4, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < n; ++i) {
        float ref = 0;
        for (int q = 0; q < N; ++q) ref += Value(q, i);
        ASSERT_EQ(back[i], ref) << "rank " << r << " i=" << i;
      }
      const int64_t m = n / N;
      auto rs = (*comm)->ReduceScatter(Tensor(data.data(), DType::kF32, {N * m}, gpu_test::Gpu0()),
                                       Tensor(scattered.data(), DType::kF32, {m}, gpu_test::Gpu0()),
                                       ReduceOp::kAvg, "rs");
      ASSERT_TRUE(rs.ok()) << rs.status();
      ASSERT_TRUE(rs->Wait().ok()) << rs->Wait();
      std::vector<float> mine(m);
      ZT_ASSERT_CUDA(cudaMemcpy(mine.data(), scattered.data(), m * 4, cudaMemcpyDeviceToHost));
      for (int64_t i = 0; i < m; i += 997) {
        // Every rank's input was the sum; their average is the sum again.
        ASSERT_EQ(mine[i], back[r * m + i]) << "rank " << r << " i=" << i;
      }
    });
  }
  for (auto& t : threads) t.join();
}

INSTANTIATE_TEST_SUITE_P(Ranks, StagedGpuTest, ::testing::Values(2, 4));

}  // namespace
}  // namespace zt

#else  // !ZT_HAVE_NCCL

#include "gtest/gtest.h"

TEST(StagedGpuTest, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (ZT_HAVE_NCCL is not defined)";
}

#endif  // ZT_HAVE_NCCL
