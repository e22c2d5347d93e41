// Ranks are threads of this process sharing an InProcessStore, talking over loopback TCP.
// Data are small integers, so f32 sums and power-of-two means are exact and results are
// compared for equality with a float64 reference.
#include "worker/comm/gloo_communicator.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"

namespace zt {
namespace {

using RankFn = std::function<void(Communicator& comm)>;

std::string UniquePrefix() {
  static int counter = 0;
  return absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "#",
                      counter++);
}

// Runs `fn` on `n` ranks, each on its own thread with its own communicator.
void RunRanks(int n, Store& store, const RankFn& fn, double timeout_seconds = 20) {
  const std::string prefix = UniquePrefix();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create({.rank = r,
                                            .size = n,
                                            .store = &store,
                                            .prefix = prefix,
                                            .timeout_seconds = timeout_seconds,
                                            .max_16bit_elements = 4096});
      ASSERT_TRUE(comm.ok()) << comm.status();
      fn(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

void WaitOk(const absl::StatusOr<CommHandle>& h) {
  ASSERT_TRUE(h.ok()) << h.status();
  absl::Status s = h->Wait();
  ASSERT_TRUE(s.ok()) << s;
}

// Rank-dependent small integers: exact in f32 and bf16 (|v| < 256).
float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 3 + (i % 17) - 8); }

class CollectiveTest : public ::testing::TestWithParam<int> {
 protected:
  InProcessStore store_;
};

TEST_P(CollectiveTest, AllReduceSumAndAverage) {
  const int N = GetParam();
  constexpr int64_t n = 1000;  // not a multiple of N: exercises uneven ring segments
  RunRanks(N, store_, [&](Communicator& comm) {
    std::vector<float> sum(n), avg(n);
    for (int64_t i = 0; i < n; ++i) sum[i] = avg[i] = Value(comm.rank(), i);
    auto h1 = comm.AllReduce(Tensor(sum.data(), DType::kF32, {n}), ReduceOp::kSum, "sum");
    auto h2 = comm.AllReduce(Tensor(avg.data(), DType::kF32, {n}), ReduceOp::kAvg, "avg");
    WaitOk(h1);
    WaitOk(h2);
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < N; ++r) ref += Value(r, i);
      ASSERT_EQ(sum[i], ref) << "i=" << i;
      ASSERT_EQ(avg[i], ref / N) << "i=" << i;  // N is a power of two: exact
    }
  });
}

TEST_P(CollectiveTest, ReduceScatterGivesEachRankItsChunkOfTheSum) {
  const int N = GetParam();
  constexpr int64_t n = 37;
  RunRanks(N, store_, [&](Communicator& comm) {
    std::vector<float> in(N * n), out(n, -1);
    for (int64_t j = 0; j < N * n; ++j) in[j] = Value(comm.rank(), j * 7);
    WaitOk(comm.ReduceScatter(Tensor(in.data(), DType::kF32, {N * n}),
                              Tensor(out.data(), DType::kF32, {n}), ReduceOp::kSum, "rs"));
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < N; ++r) ref += Value(r, (comm.rank() * n + i) * 7);
      ASSERT_EQ(out[i], ref) << "i=" << i;
    }
  });
}

TEST_P(CollectiveTest, ReduceScatterAverageOfF16) {
  const int N = GetParam();
  constexpr int64_t n = 64;
  RunRanks(N, store_, [&](Communicator& comm) {
    std::vector<uint16_t> in(N * n), out(n);
    for (int64_t j = 0; j < N * n; ++j) in[j] = FloatToHalf(Value(comm.rank(), j));
    WaitOk(comm.ReduceScatter(Tensor(in.data(), DType::kF16, {N * n}),
                              Tensor(out.data(), DType::kF16, {n}), ReduceOp::kAvg, "rs16"));
    for (int64_t i = 0; i < n; ++i) {
      double ref = 0;
      for (int r = 0; r < N; ++r) ref += Value(r, comm.rank() * n + i);
      // The mean of integers over a power-of-two N is a short binary fraction: exact in f16.
      ASSERT_EQ(HalfToFloat(out[i]), ref / N) << "i=" << i;
    }
  });
}

TEST_P(CollectiveTest, AllGatherAndBroadcast) {
  const int N = GetParam();
  constexpr int64_t n = 11;
  RunRanks(N, store_, [&](Communicator& comm) {
    std::vector<uint16_t> in(n), out(N * n);
    for (int64_t i = 0; i < n; ++i) in[i] = FloatToBf16(Value(comm.rank(), i));
    std::vector<float> b(n, static_cast<float>(comm.rank()));
    auto g = comm.AllGather(Tensor(in.data(), DType::kBF16, {n}),
                            Tensor(out.data(), DType::kBF16, {N, n}), "gather");
    auto bc = comm.Broadcast(Tensor(b.data(), DType::kF32, {n}), N - 1, "bcast");
    WaitOk(bc);
    WaitOk(g);
    for (int r = 0; r < N; ++r) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(Bf16ToFloat(out[r * n + i]), Value(r, i));
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], N - 1);
    WaitOk(comm.Barrier("end"));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveTest, ::testing::Values(1, 2, 4));

TEST(GlooCommunicatorTest, Bf16AllReduceEqualsF32AllReduceRounded) {
  InProcessStore store;
  constexpr int N = 4;
  constexpr int64_t n = 513;
  RunRanks(N, store, [&](Communicator& comm) {
    std::vector<uint16_t> h(n);
    std::vector<float> f(n);
    for (int64_t i = 0; i < n; ++i) {
      // Non-integers, so the f32 sum rounds and bf16 rounding of the result matters.
      h[i] = FloatToBf16(std::sin(0.37f * i + comm.rank()) * 3.3f);
      f[i] = Bf16ToFloat(h[i]);
    }
    WaitOk(comm.AllReduce(Tensor(h.data(), DType::kBF16, {n}), ReduceOp::kSum, "bf16"));
    WaitOk(comm.AllReduce(Tensor(f.data(), DType::kF32, {n}), ReduceOp::kSum, "f32"));
    for (int64_t i = 0; i < n; ++i) {
      // Same f32 reduction in the same order, then one rounding: bit-identical.
      ASSERT_EQ(h[i], FloatToBf16(f[i])) << "i=" << i;
      double ref = 0;
      for (int r = 0; r < N; ++r) {
        ref += Bf16ToFloat(FloatToBf16(std::sin(0.37f * i + r) * 3.3f));
      }
      // One bf16 rounding (2^-9 relative) plus f32 summation error (far below it).
      ASSERT_NEAR(Bf16ToFloat(h[i]), ref, std::abs(ref) * 0x1p-8 + 1e-6) << "i=" << i;
    }
  });
}

TEST(GlooCommunicatorTest, SendRecvPairInOrder) {
  InProcessStore store;
  RunRanks(2, store, [&](Communicator& comm) {
    std::vector<float> a(100), b(100);
    const int peer = 1 - comm.rank();
    if (comm.rank() == 0) {
      for (int i = 0; i < 100; ++i) a[i] = i, b[i] = -i;
      auto s1 = comm.Send(Tensor(a.data(), DType::kF32, {100}), peer, "p2p");
      auto s2 = comm.Send(Tensor(b.data(), DType::kF32, {100}), peer, "p2p");
      WaitOk(s1);
      WaitOk(s2);
    } else {
      auto r1 = comm.Recv(Tensor(a.data(), DType::kF32, {100}), peer, "p2p");
      auto r2 = comm.Recv(Tensor(b.data(), DType::kF32, {100}), peer, "p2p");
      WaitOk(r1);
      WaitOk(r2);
      for (int i = 0; i < 100; ++i) {
        ASSERT_EQ(a[i], i);
        ASSERT_EQ(b[i], -i);
      }
    }
    EXPECT_EQ(comm.stats()[CommKind::kSend].bytes_sent, comm.rank() == 0 ? 800 : 0);
    EXPECT_EQ(comm.stats()[CommKind::kRecv].bytes_received, comm.rank() == 1 ? 800 : 0);
  });
}

TEST(GlooCommunicatorTest, CountersReportTheDocumentedRingVolumes) {
  InProcessStore store;
  constexpr int N = 4;
  constexpr int64_t n = 1024;
  RunRanks(N, store, [&](Communicator& comm) {
    std::vector<float> x(N * n, 1.0f), y(n);
    WaitOk(comm.AllReduce(Tensor(x.data(), DType::kF32, {n}), ReduceOp::kSum, "ar"));
    WaitOk(comm.ReduceScatter(Tensor(x.data(), DType::kF32, {N * n}),
                              Tensor(y.data(), DType::kF32, {n}), ReduceOp::kSum, "rs"));
    WaitOk(comm.AllGather(Tensor(y.data(), DType::kF32, {n}),
                          Tensor(x.data(), DType::kF32, {N * n}), "ag"));
    const CommStats s = comm.stats();
    EXPECT_EQ(s[CommKind::kAllReduce].calls, 1);
    EXPECT_EQ(s[CommKind::kAllReduce].bytes_sent, 2 * (N - 1) * n * 4 / N);
    EXPECT_EQ(s[CommKind::kAllReduce].bytes_received, 2 * (N - 1) * n * 4 / N);
    EXPECT_EQ(s[CommKind::kReduceScatter].bytes_sent, (N - 1) * n * 4);
    EXPECT_EQ(s[CommKind::kAllGather].bytes_received, (N - 1) * n * 4);
    EXPECT_GT(s[CommKind::kAllReduce].seconds, 0);
    EXPECT_EQ(s[CommKind::kBroadcast].calls, 0);
  });
}

TEST(GlooCommunicatorTest, MissingPeerFailsWithinTimeoutNamingLabelAndRank) {
  InProcessStore store;
  const std::string prefix = UniquePrefix();
  std::atomic<bool> done{false};
  std::thread idle([&] {
    auto comm = GlooCommunicator::Create(
        {.rank = 1, .size = 2, .store = &store, .prefix = prefix, .timeout_seconds = 2});
    ASSERT_TRUE(comm.ok()) << comm.status();
    while (!done) absl::SleepFor(absl::Milliseconds(10));
  });
  auto comm = GlooCommunicator::Create(
      {.rank = 0, .size = 2, .store = &store, .prefix = prefix, .timeout_seconds = 2});
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> x(16, 1.0f);
  const absl::Time start = absl::Now();
  auto h = (*comm)->AllReduce(Tensor(x.data(), DType::kF32, {16}), ReduceOp::kSum, "unit 3 gather");
  ASSERT_TRUE(h.ok());
  absl::Status s = h->Wait();
  const absl::Duration took = absl::Now() - start;
  done = true;
  idle.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("AllReduce"), std::string::npos) << s;
  EXPECT_NE(s.message().find("unit 3 gather"), std::string::npos) << s;
  EXPECT_NE(s.message().find("ranks [1]"), std::string::npos) << s;
  // The 2 s timeout plus slack for a loaded 2-core machine; the point is that it returns.
  EXPECT_LT(took, absl::Seconds(6));
  EXPECT_GE(took, absl::Milliseconds(1900));
  // A failed communicator refuses further work instead of desynchronising from its peers,
  // and each refusal carries the first failure, so whichever handle is waited first names
  // the cause.
  auto next = (*comm)->Barrier("after");
  ASSERT_TRUE(next.ok());
  const absl::Status refused = next->Wait();
  EXPECT_TRUE(absl::IsDeadlineExceeded(refused)) << refused;
  EXPECT_NE(refused.message().find("'after' not run"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("unit 3 gather"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("ranks [1]"), std::string::npos) << refused;
}

TEST(GlooCommunicatorTest, RendezvousWithoutPeersTimesOut) {
  InProcessStore store;
  auto comm = GlooCommunicator::Create(
      {.rank = 0, .size = 2, .store = &store, .prefix = UniquePrefix(), .timeout_seconds = 0.5});
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
}

TEST(GlooCommunicatorTest, RanksRendezvousThroughAFileStore) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/zt_comm_filestore_", getpid());
  std::filesystem::remove_all(dir);
  auto store = FileStore::Create(dir, absl::Milliseconds(1));
  ASSERT_TRUE(store.ok()) << store.status();
  RunRanks(2, **store, [&](Communicator& comm) {
    std::vector<float> x(8, static_cast<float>(comm.rank() + 1));
    WaitOk(comm.AllReduce(Tensor(x.data(), DType::kF32, {8}), ReduceOp::kSum, "fs"));
    for (float v : x) ASSERT_EQ(v, 3.0f);
  });
  std::filesystem::remove_all(dir);
}

// A one-rank communicator reduces nothing, so it needs no conversion buffer: 16-bit data of
// any size comes back unchanged (the engine plans none at world size 1). With two ranks the
// same call beyond max_16bit_elements is refused.
TEST(GlooCommunicatorTest, OneRankReducesSixteenBitDataWithoutAConversionBuffer) {
  constexpr int64_t n = 10000;
  std::vector<uint16_t> data(n), out(n);
  for (int64_t i = 0; i < n; ++i) data[i] = FloatToBf16(std::sin(0.37f * i) * 3.3f);
  const std::vector<uint16_t> want = data;
  InProcessStore store;
  auto one = GlooCommunicator::Create(
      {.rank = 0, .size = 1, .store = &store, .prefix = "one", .max_16bit_elements = 0});
  ASSERT_TRUE(one.ok()) << one.status();
  WaitOk((*one)->AllReduce(Tensor(data.data(), DType::kBF16, {n}), ReduceOp::kAvg, "avg"));
  EXPECT_EQ(data, want);
  WaitOk((*one)->ReduceScatter(Tensor(data.data(), DType::kBF16, {n}),
                               Tensor(out.data(), DType::kBF16, {n}), ReduceOp::kAvg, "rs"));
  EXPECT_EQ(out, want);
  EXPECT_EQ(data, want);

  RunRanks(2, store, [&](Communicator& comm) {
    std::vector<uint16_t> big(8192);
    auto ar = comm.AllReduce(Tensor(big.data(), DType::kBF16, {8192}), ReduceOp::kSum, "big");
    EXPECT_TRUE(absl::IsInvalidArgument(ar.status())) << ar.status();
    EXPECT_NE(ar.status().message().find("max_16bit_elements = 4096"), std::string::npos)
        << ar.status();
  });
}

TEST(GlooCommunicatorTest, BadArgumentsNameTheArgumentAndRule) {
  InProcessStore store;
  RunRanks(2, store, [&](Communicator& comm) {
    std::vector<float> x(10), y(3);
    auto rs = comm.ReduceScatter(Tensor(x.data(), DType::kF32, {10}),
                                 Tensor(y.data(), DType::kF32, {3}), ReduceOp::kSum, "bad");
    EXPECT_TRUE(absl::IsInvalidArgument(rs.status()));
    EXPECT_NE(rs.status().message().find("input has 10 elements"), std::string::npos)
        << rs.status();
    auto bc = comm.Broadcast(Tensor(x.data(), DType::kF32, {10}), 5, "bad");
    EXPECT_NE(bc.status().message().find("invalid root 5"), std::string::npos) << bc.status();
    std::vector<int32_t> ids(4);
    auto ar = comm.AllReduce(Tensor(ids.data(), DType::kI32, {4}), ReduceOp::kSum, "ids");
    EXPECT_NE(ar.status().message().find("expected f32, bf16 or f16"), std::string::npos);
  });
}

// Token ids move between ranks (the vocabulary-sharded embedding gathers its group's): an
// all-gather and a broadcast of i32 data copy it bit for bit; ids are never reduced.
TEST(GlooCommunicatorTest, IdsAreGatheredAndBroadcastBitForBit) {
  InProcessStore store;
  RunRanks(3, store, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<int32_t> mine = {r, -r, 1 << (20 + r)}, all(9, 0);
    ASSERT_TRUE(comm.AllGather(Tensor(mine.data(), DType::kI32, {3}),
                               Tensor(all.data(), DType::kI32, {9}), "ids")
                    .value()
                    .Wait()
                    .ok());
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(all[3 * k], k);
      EXPECT_EQ(all[3 * k + 1], -k);
      EXPECT_EQ(all[3 * k + 2], 1 << (20 + k));
    }
    std::vector<int32_t> root = {r == 1 ? 7 : 0, r == 1 ? -9 : 0};
    ASSERT_TRUE(
        comm.Broadcast(Tensor(root.data(), DType::kI32, {2}), 1, "ids").value().Wait().ok());
    EXPECT_EQ(root, (std::vector<int32_t>{7, -9}));
  });
}

// A rank that leaves set-up and finishes at once (here: does nothing) must not close its
// pairs while a peer is still completing its side of the full mesh; that peer's Create failed
// with "Connection closed by peer" (seen once in CI under load, in the test above). Many
// rounds of ranks that do nothing after Create: the pattern of that failure (it did not
// reproduce here without the fix on a lightly loaded machine, so this is a stress test).
TEST(GlooCommunicatorTest, RanksThatFinishRightAfterSetUpNeverFailAPeersSetUp) {
  for (int round = 0; round < 40; ++round) {
    InProcessStore store;
    RunRanks(4, store, [](Communicator&) {});
    if (::testing::Test::HasFailure()) break;
  }
}

}  // namespace
}  // namespace zt
