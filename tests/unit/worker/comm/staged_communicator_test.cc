// StagedCommunicator over Gloo with the host copy engine: "device" buffers are host memory
// labelled cuda:0, so every staging path (chunking, the reduce-scatter and all-gather
// gathers, in-place all-gather, point-to-point pairing, the broken state) runs without a GPU.
// The CUDA copy engine's own test is tests/gpu/worker/comm/staged_communicator_gpu_test.cc.
// Ranks are threads sharing an InProcessStore; data are small integers, so f32 sums and
// power-of-two means are exact and results are compared for equality.
#include "worker/comm/staged_communicator.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

constexpr Device kGpu{.kind = DeviceKind::kCuda, .index = 0};
// 256 bytes of staging: 64 f32 or 128 16-bit elements a chunk, so the sizes below need several.
constexpr int64_t kStagingBytes = 256;

std::string UniquePrefix() {
  static int counter = 0;
  return absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "#",
                      counter++);
}

using RankFn = std::function<void(StagedCommunicator& comm)>;

// Runs `fn` on `n` ranks, each a thread with a staged communicator over its own Gloo one.
void RunRanks(int n, const RankFn& fn, int64_t staging_bytes = kStagingBytes,
              std::function<std::unique_ptr<DeviceCopyEngine>()> engine = nullptr) {
  InProcessStore store;
  const std::string prefix = UniquePrefix();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto host = GlooCommunicator::Create({.rank = r,
                                            .size = n,
                                            .store = &store,
                                            .prefix = prefix,
                                            .timeout_seconds = 20,
                                            .max_16bit_elements = 4096});
      ASSERT_TRUE(host.ok()) << host.status();
      auto comm = StagedCommunicator::Create(
          {.host = std::move(*host),
           .copies = engine ? engine() : MakeHostCopyEngine(kGpu),
           .staging_bytes = staging_bytes});
      ASSERT_TRUE(comm.ok()) << comm.status();
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

void WaitOk(const absl::StatusOr<CommHandle>& h) {
  ASSERT_TRUE(h.ok()) << h.status();
  const absl::Status s = h->Wait();
  ASSERT_TRUE(s.ok()) << s;
}

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 3 + (i % 17) - 8); }

Tensor OnGpu(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())}, kGpu);
}

class StagedCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(StagedCollectiveTest, AllReduceInSeveralChunks) {
  const int N = GetParam();
  constexpr int64_t n = 1000;  // 16 chunks of 64 f32, the last one short
  RunRanks(N, [&](StagedCommunicator& comm) {
    std::vector<float> sum(n), avg(n);
    for (int64_t i = 0; i < n; ++i) sum[i] = avg[i] = Value(comm.rank(), i);
    auto h1 = comm.AllReduce(OnGpu(sum), ReduceOp::kSum, "sum");
    auto h2 = comm.AllReduce(OnGpu(avg), ReduceOp::kAvg, "avg");
    WaitOk(h1);
    WaitOk(h2);
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < N; ++r) ref += Value(r, i);
      ASSERT_EQ(sum[i], ref) << "i=" << i;
      ASSERT_EQ(avg[i], ref / N) << "i=" << i;
    }
  });
}

TEST_P(StagedCollectiveTest, Bf16AllReduceRoundsOnceAsGlooDoes) {
  const int N = GetParam();
  constexpr int64_t n = 300;  // 3 chunks of 128
  RunRanks(N, [&](StagedCommunicator& comm) {
    std::vector<uint16_t> data(n);
    for (int64_t i = 0; i < n; ++i) data[i] = FloatToBf16(Value(comm.rank(), i));
    WaitOk(comm.AllReduce(Tensor(data.data(), DType::kBF16, {n}, kGpu), ReduceOp::kSum, "bf16"));
    for (int64_t i = 0; i < n; ++i) {
      float ref = 0;
      for (int r = 0; r < N; ++r) ref += Value(r, i);
      ASSERT_EQ(data[i], FloatToBf16(ref)) << "i=" << i;
    }
  });
}

TEST_P(StagedCollectiveTest, ReduceScatterGathersEachRanksChunkPieceByPiece) {
  const int N = GetParam();
  const int64_t n = 101;  // per-rank chunk; pieces of 64/N elements, the last one short
  RunRanks(N, [&](StagedCommunicator& comm) {
    std::vector<float> input(N * n), output(n, -1.0f);
    for (int64_t i = 0; i < N * n; ++i) input[i] = Value(comm.rank(), i);
    WaitOk(comm.ReduceScatter(OnGpu(input), OnGpu(output), ReduceOp::kSum, "rs"));
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < N; ++r) ref += Value(r, comm.rank() * n + i);
      ASSERT_EQ(output[i], ref) << "i=" << i;
    }
  });
}

TEST_P(StagedCollectiveTest, AllGatherOutOfPlaceAndInPlace) {
  const int N = GetParam();
  const int64_t n = 77;
  RunRanks(N, [&](StagedCommunicator& comm) {
    std::vector<float> input(n), output(N * n, -1.0f), in_place(N * n, -1.0f);
    for (int64_t i = 0; i < n; ++i) {
      input[i] = in_place[comm.rank() * n + i] = Value(comm.rank(), i);
    }
    WaitOk(comm.AllGather(OnGpu(input), OnGpu(output), "ag"));
    Tensor whole = OnGpu(in_place);
    Tensor mine(in_place.data() + comm.rank() * n, DType::kF32, {n}, kGpu);
    WaitOk(comm.AllGather(mine, whole, "ag in place"));
    for (int r = 0; r < N; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(output[r * n + i], Value(r, i)) << "r=" << r << " i=" << i;
        ASSERT_EQ(in_place[r * n + i], Value(r, i)) << "in place r=" << r << " i=" << i;
      }
    }
  });
}

TEST_P(StagedCollectiveTest, BroadcastFromTheLastRank) {
  const int N = GetParam();
  constexpr int64_t n = 200;
  RunRanks(N, [&](StagedCommunicator& comm) {
    std::vector<float> data(n);
    for (int64_t i = 0; i < n; ++i) data[i] = Value(comm.rank(), i);
    WaitOk(comm.Broadcast(OnGpu(data), N - 1, "bcast"));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], Value(N - 1, i)) << "i=" << i;
  });
}

TEST_P(StagedCollectiveTest, SendAndRecvAroundARingInChunksAndEmpty) {
  const int N = GetParam();
  if (N == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  constexpr int64_t n = 150;  // 3 chunks
  RunRanks(N, [&](StagedCommunicator& comm) {
    const int next = (comm.rank() + 1) % N, prev = (comm.rank() + N - 1) % N;
    std::vector<float> out(n), in(n, -1.0f), empty;
    for (int64_t i = 0; i < n; ++i) out[i] = Value(comm.rank(), i);
    // Operations run in issue order and a send completes when its peer receives (as with
    // Gloo's own), so even ranks send first and odd ranks receive first.
    const bool send_first = comm.rank() % 2 == 0;
    std::vector<absl::StatusOr<CommHandle>> handles;
    for (int step = 0; step < 2; ++step) {
      if ((step == 0) == send_first) {
        handles.push_back(comm.Send(OnGpu(out), next, "ring"));
        handles.push_back(comm.Send(OnGpu(empty), next, "empty"));
      } else {
        handles.push_back(comm.Recv(OnGpu(in), prev, "ring"));
        handles.push_back(comm.Recv(OnGpu(empty), prev, "empty"));
      }
    }
    for (const auto& h : handles) WaitOk(h);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(in[i], Value(prev, i)) << "i=" << i;
    WaitOk(comm.Barrier("end"));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, StagedCollectiveTest, ::testing::Values(1, 2, 4));

TEST(StagedCommunicatorTest, BadArgumentsNameTheArgumentAndRule) {
  RunRanks(2, [&](StagedCommunicator& comm) {
    std::vector<float> a(8), b(3);
    Tensor host_tensor(a.data(), DType::kF32, {8});
    auto s = comm.AllReduce(host_tensor, ReduceOp::kSum, "grads");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.status().message(),
                HasSubstr("AllReduce 'grads': data is on cpu:0, the staged communicator copies "
                          "from cuda:0"));
    s = comm.ReduceScatter(OnGpu(a), OnGpu(b), ReduceOp::kSum, "rs");
    EXPECT_THAT(s.status().message(), HasSubstr("input has 8 elements, expected 2 ranks"));
    s = comm.Send(OnGpu(a), comm.rank(), "self");
    EXPECT_THAT(s.status().message(), HasSubstr("is this rank"));
    s = comm.Broadcast(OnGpu(a), 2, "b");
    EXPECT_THAT(s.status().message(), HasSubstr("invalid root 2 (root should be in the 0..1"));
    // None of them broke the communicator.
    WaitOk(comm.Barrier("still fine"));
  });
}

TEST(StagedCommunicatorTest, CreateRefusesMissingPartsAndTooLittleStaging) {
  auto no_host = StagedCommunicator::Create({.copies = MakeHostCopyEngine(kGpu)});
  EXPECT_THAT(no_host.status().message(), HasSubstr("StagedCommunicatorOptions.host is null"));
  RunRanks(1, [](StagedCommunicator&) {});  // a group of one needs no peers
  InProcessStore store;
  auto host = GlooCommunicator::Create({.rank = 0, .size = 1, .store = &store});
  ASSERT_TRUE(host.ok()) << host.status();
  auto small = StagedCommunicator::Create(
      {.host = std::move(*host), .copies = MakeHostCopyEngine(kGpu), .staging_bytes = 32});
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("staging_bytes is 32, must be at least 64"));
}

// A host engine whose device → host copies fail after `good` of them.
class FailingCopyEngine : public DeviceCopyEngine {
 public:
  explicit FailingCopyEngine(int good) : inner_(MakeHostCopyEngine(kGpu)), good_(good) {}
  Device device() const override { return inner_->device(); }
  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    return inner_->AllocateStaging(bytes);
  }
  absl::StatusOr<IssueMark> MarkIssue() override { return inner_->MarkIssue(); }
  absl::Status CopyToHost(const IssueMark& m, void* h, const void* d, int64_t b) override {
    if (good_-- <= 0) return absl::InternalError("injected copy failure");
    return inner_->CopyToHost(m, h, d, b);
  }
  absl::Status CopyToDevice(const IssueMark& m, void* d, const void* h, int64_t b) override {
    return inner_->CopyToDevice(m, d, h, b);
  }

 private:
  std::unique_ptr<DeviceCopyEngine> inner_;
  int good_;
};

TEST(StagedCommunicatorTest, AFailedCopyBreaksTheCommunicatorAndLaterOperationsSaySo) {
  RunRanks(
      1,
      [&](StagedCommunicator& comm) {
        std::vector<float> a(8, 1.0f);
        const absl::Status first = comm.AllReduce(OnGpu(a), ReduceOp::kSum, "first")->Wait();
        EXPECT_EQ(first.code(), absl::StatusCode::kInternal);
        EXPECT_THAT(first.message(), HasSubstr("staged AllReduce 'first': injected copy failure"));
        const absl::Status later = comm.AllReduce(OnGpu(a), ReduceOp::kSum, "later")->Wait();
        EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_THAT(later.message(), HasSubstr("AllReduce 'later': the communicator is broken"));
        EXPECT_THAT(later.message(), HasSubstr("injected copy failure"));
      },
      kStagingBytes, [] { return std::make_unique<FailingCopyEngine>(0); });
}

}  // namespace
}  // namespace zt
