#include "worker/data/sampler.h"

#include <algorithm>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

// A stream of n tokens where token i has id i (shards of u32 so any n works): the
// reference for every micro-batch is index arithmetic. All comparisons are exact.
class SamplerTest : public ::testing::Test {
 protected:
  TokenStream MakeStream(int64_t n, int shards = 3) {
    std::vector<std::string> paths;
    for (int s = 0; s < shards; ++s) {
      std::vector<int32_t> tokens;
      for (int64_t i = n * s / shards; i < n * (s + 1) / shards; ++i) {
        tokens.push_back(static_cast<int32_t>(i));
      }
      paths.push_back(dir_.File("s" + std::to_string(s) + ".bin"));
      EXPECT_TRUE(WriteTokenShard(paths.back(), tokens, 1 << 20).ok());
    }
    auto stream = TokenStream::Open(paths, "data.train");
    EXPECT_TRUE(stream.ok()) << stream.status();
    return *std::move(stream);
  }

  ScratchDir dir_;
};

TEST_F(SamplerTest, SequentialIsLlmcsLoaderWithWrap) {
  const int64_t n = 103;
  TokenStream stream = MakeStream(n);
  const int B = 2, T = 5;
  Sampler sampler(&stream, B, T, /*shuffle=*/false, /*seed=*/0);
  ASSERT_TRUE(sampler.Check().ok());
  EXPECT_EQ(sampler.tokens_per_epoch(), n);
  std::vector<int32_t> in(B * T), tg(B * T);
  // k up to 60 wraps the 103-token stream several times, including a batch split by the end.
  for (int64_t k : std::vector<int64_t>{0, 1, 9, 10, 11, 20, 60, 1000000000000000LL}) {
    ASSERT_TRUE(sampler.Fill(k, in.data(), tg.data()).ok());
    const auto start = static_cast<int64_t>((static_cast<__int128>(k) * B * T) % n);
    for (int j = 0; j < B * T; ++j) {
      ASSERT_EQ(in[j], (start + j) % n) << "k " << k << " j " << j;
      ASSERT_EQ(tg[j], (start + j + 1) % n) << "k " << k << " j " << j;
    }
  }
}

TEST_F(SamplerTest, ShuffledTakesWindowsInEachEpochsPermutation) {
  const int B = 3, T = 4;
  const int64_t n = 1 + 10 * T + 2;  // W = 10 windows; the 2 spare tokens are never read
  TokenStream stream = MakeStream(n);
  const uint64_t seed = 1234;
  Sampler sampler(&stream, B, T, /*shuffle=*/true, seed);
  ASSERT_EQ(sampler.windows_per_epoch(), 10);
  EXPECT_EQ(sampler.tokens_per_epoch(), 40);
  std::vector<int32_t> in(B * T), tg(B * T);
  std::map<int64_t, std::vector<int64_t>> seen;  // epoch -> windows read
  // B = 3 does not divide W = 10, so micro-batches 3, 6 and 9 straddle two epochs.
  for (int64_t k = 0; k < 10; ++k) {
    ASSERT_TRUE(sampler.Fill(k, in.data(), tg.data()).ok());
    for (int b = 0; b < B; ++b) {
      const int64_t position = k * B + b;
      const int64_t epoch = position / 10;
      const int64_t window = ShuffledOrder(10, EpochSeed(seed, epoch))[position % 10];
      seen[epoch].push_back(window);
      for (int t = 0; t < T; ++t) {
        ASSERT_EQ(in[b * T + t], window * T + t) << "k " << k << " b " << b;
        ASSERT_EQ(tg[b * T + t], window * T + t + 1) << "k " << k << " b " << b;
      }
    }
  }
  // Each complete epoch reads every window exactly once, and consecutive epochs differ.
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> sorted = seen[e];
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})) << "epoch " << e;
  }
  EXPECT_NE(seen[0], seen[1]);
}

TEST_F(SamplerTest, FillIsAPureFunctionOfK) {
  TokenStream stream = MakeStream(1 + 7 * 8);
  Sampler sampler(&stream, 2, 8, /*shuffle=*/true, 99);
  const int n = 2 * 8;
  std::vector<std::vector<int32_t>> forward(30, std::vector<int32_t>(n));
  std::vector<int32_t> tg(n);
  for (int k = 0; k < 30; ++k) ASSERT_TRUE(sampler.Fill(k, forward[k].data(), tg.data()).ok());
  // Out of order, across more epochs than the permutation cache holds, and from threads.
  Sampler fresh(&stream, 2, 8, /*shuffle=*/true, 99);
  std::vector<int32_t> in(n);
  for (int k : {29, 0, 15, 3, 28, 1, 14}) {
    ASSERT_TRUE(fresh.Fill(k, in.data(), tg.data()).ok());
    EXPECT_EQ(in, forward[k]) << k;
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      std::vector<int32_t> a(n), b(n);
      for (int k = r; k < 30; k += 4) {
        if (!fresh.Fill(k, a.data(), b.data()).ok() || a != forward[k]) ++mismatches[r];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// The permutation is part of the resume contract: a job resumed on another machine or
// after a rebuild must read the same windows. The expected values come from an independent
// Python transcription of MT19937-64 (checked against the C++ standard's 10000th output,
// 9981545732273789042), SplitMix64 and this Fisher-Yates with rejection sampling.
TEST(ShuffledOrderTest, MatchesAnIndependentReference) {
  EXPECT_EQ(EpochSeed(0, 0), 12035550249420947055ULL);
  EXPECT_EQ(EpochSeed(1234, 7), 12302495093396609055ULL);
  EXPECT_EQ(ShuffledOrder(10, 42), (std::vector<int64_t>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6}));
  EXPECT_EQ(ShuffledOrder(12, EpochSeed(1234, 7)),
            (std::vector<int64_t>{11, 0, 6, 4, 7, 10, 5, 8, 3, 1, 2, 9}));
}

TEST(ShuffledOrderTest, IsAPermutationAndDependsOnTheSeed) {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    std::vector<int64_t> order = ShuffledOrder(n, 7);
    std::sort(order.begin(), order.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(order[i], i);
  }
  EXPECT_NE(ShuffledOrder(1000, 7), ShuffledOrder(1000, 8));
  EXPECT_EQ(ShuffledOrder(1000, 7), ShuffledOrder(1000, 7));
}

// Fisher-Yates with an off-by-one (j drawn from [0, n) instead of [0, i]) or a biased
// bounded draw makes some permutations of 3 items more likely than others.
TEST(ShuffledOrderTest, AllPermutationsOfThreeAreEquallyLikely) {
  const int draws = 60000;
  std::map<std::vector<int64_t>, int> counts;
  for (int s = 0; s < draws; ++s) ++counts[ShuffledOrder(3, EpochSeed(5, s))];
  ASSERT_EQ(counts.size(), 6u);
  // Each count is Binomial(60000, 1/6): mean 10000, standard deviation ~91. Five standard
  // deviations (~456) bounds a false failure at ~1e-6 per permutation; the off-by-one bug
  // shifts counts by ~1100 (probabilities 4/27 and 5/27 instead of 1/6).
  for (const auto& [perm, count] : counts) EXPECT_NEAR(count, 10000, 460);
}

TEST_F(SamplerTest, TooShortStreamNamesFieldAndCounts) {
  TokenStream stream = MakeStream(10, 1);
  Sampler sampler(&stream, 2, 5, /*shuffle=*/false, 0);
  absl::Status s = sampler.Check();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.train: 10 tokens"));
  EXPECT_THAT(s.message(), HasSubstr("B*T + 1 = 2*5 + 1 = 11"));
  std::vector<int32_t> in(10), tg(10);
  EXPECT_EQ(sampler.Fill(0, in.data(), tg.data()).code(), absl::StatusCode::kInvalidArgument);

  TokenStream exact = MakeStream(11, 1);
  Sampler fits(&exact, 2, 5, /*shuffle=*/true, 0);
  EXPECT_TRUE(fits.Fill(0, in.data(), tg.data()).ok());
  EXPECT_EQ(fits.Fill(-1, in.data(), tg.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Sampler(&exact, 0, 5, false, 0).Check().message(), HasSubstr("B = 0"));
}

}  // namespace
}  // namespace zt
