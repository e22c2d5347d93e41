// Issue 20: a corpus of 20,000 shards failed with "Too many open files" (every shard was
// opened at once). The stream now reads headers one file at a time and maps a bounded number
// of shards; under a lowered RLIMIT_NOFILE it yields the same micro-batches as without it.
#include <stdlib.h>
#include <sys/resource.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/sampler.h"
#include "worker/data/token_shard.h"
#include "worker/data/token_stream.h"
#include "worker/job/data_paths.h"

namespace zt {
namespace {

namespace fs = std::filesystem;

constexpr int kShards = 20000;
constexpr int kTokensPerShard = 3;
// Far below kShards, as a node's default soft limit (1024) is below a large corpus.
constexpr rlim_t kLowFileLimit = 128;

int OpenDescriptors() {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Token of shard s, position j: distinct across neighbouring shards, so a shard read out of
// order shows.
int32_t TokenAt(int s, int j) { return (s * kTokensPerShard + j) % 50000; }

// Many tiny files: on tmpfs when there is one, since the writer syncs every file.
class ManyShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string base = fs::is_directory("/dev/shm") ? "/dev/shm/" : ::testing::TempDir();
    std::string pattern = base + "zt_many_shards_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
    for (int s = 0; s < kShards; ++s) {
      std::vector<int32_t> tokens(kTokensPerShard);
      for (int j = 0; j < kTokensPerShard; ++j) tokens[j] = TokenAt(s, j);
      // Unpadded numbers: the pattern's byte order (shard_0, shard_1, shard_10, ...) is not
      // the numeric one, which the reference below follows.
      ASSERT_TRUE(WriteTokenShard(absl::StrCat(dir_, "/shard_", s, ".bin"), tokens, 50000).ok());
    }
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Every micro-batch k in [0, count) of a sampler over the pattern's shards, concatenated.
  std::vector<int32_t> Batches(bool shuffle, int count, int* max_fds) {
    absl::StatusOr<std::vector<std::string>> paths =
        ExpandDataPaths(std::vector<std::string>{dir_ + "/shard_*.bin"}, "data.train");
    EXPECT_TRUE(paths.ok()) << paths.status();
    if (!paths.ok()) return {};
    EXPECT_EQ(paths->size(), static_cast<size_t>(kShards));
    absl::StatusOr<TokenStream> stream = TokenStream::Open(*paths, "data.train");
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return {};
    constexpr int B = 4, T = 16;
    Sampler sampler(&*stream, B, T, shuffle, /*seed=*/7);
    EXPECT_TRUE(sampler.Check().ok());
    std::vector<int32_t> out, inputs(B * T), targets(B * T);
    for (int k = 0; k < count; ++k) {
      absl::Status filled = sampler.Fill(k, inputs.data(), targets.data());
      EXPECT_TRUE(filled.ok()) << filled;
      if (!filled.ok()) return {};
      out.insert(out.end(), inputs.begin(), inputs.end());
      out.insert(out.end(), targets.begin(), targets.end());
      *max_fds = std::max(*max_fds, OpenDescriptors());
      EXPECT_LE(stream->mapped_shards(), kMaxMappedShards);
    }
    return out;
  }

  std::string dir_;
};

TEST_F(ManyShardsTest, StreamsUnderALowOpenFileLimitAsWithoutIt) {
  // Enough batches to pass every shard once sequentially (20,000 x 3 tokens / (4 x 16)).
  constexpr int kBatches = kShards * kTokensPerShard / 64 + 2;
  int unlimited_fds = 0;
  const std::vector<int32_t> sequential = Batches(/*shuffle=*/false, kBatches, &unlimited_fds);
  const std::vector<int32_t> shuffled = Batches(/*shuffle=*/true, 200, &unlimited_fds);
  ASSERT_FALSE(sequential.empty());

  // The first batch against the shards' contents in the pattern's byte order.
  std::vector<std::string> names;
  for (int s = 0; s < kShards; ++s) names.push_back(absl::StrCat("shard_", s, ".bin"));
  std::sort(names.begin(), names.end());
  std::vector<int32_t> expected;
  for (size_t i = 0; expected.size() < 64; ++i) {
    const int s = std::stoi(names[i].substr(6));
    for (int j = 0; j < kTokensPerShard; ++j) expected.push_back(TokenAt(s, j));
  }
  for (int i = 0; i < 64; ++i) ASSERT_EQ(sequential[i], expected[i]) << i;

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(kLowFileLimit, saved.rlim_cur);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  absl::Cleanup restore = [&saved] { setrlimit(RLIMIT_NOFILE, &saved); };
  const int before = OpenDescriptors();
  int limited_fds = 0;
  EXPECT_EQ(Batches(/*shuffle=*/false, kBatches, &limited_fds), sequential);
  EXPECT_EQ(Batches(/*shuffle=*/true, 200, &limited_fds), shuffled);
  // Mapped shards hold no descriptor; reading headers holds one at a time.
  EXPECT_LE(limited_fds, before + 2);
}

}  // namespace
}  // namespace zt
