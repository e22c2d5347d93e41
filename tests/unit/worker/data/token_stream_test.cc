#include "worker/data/token_stream.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using ::testing::StartsWith;

// Shards of 10, 0 and 5 tokens (the last one 4 bytes wide), token = its stream index, so the
// reference for any read is plain modular arithmetic.
class TokenStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    paths_ = {dir_.File("a.bin"), dir_.File("empty.bin"), dir_.File("b.bin")};
    std::vector<int32_t> a(10), b(5);
    for (int i = 0; i < 10; ++i) a[i] = i;
    for (int i = 0; i < 5; ++i) b[i] = 10 + i;
    ASSERT_TRUE(WriteTokenShard(paths_[0], a, 256).ok());
    ASSERT_TRUE(WriteTokenShard(paths_[1], {}, 256).ok());
    ASSERT_TRUE(WriteTokenShard(paths_[2], b, 100000).ok());
  }

  ScratchDir dir_;
  std::vector<std::string> paths_;
};

TEST_F(TokenStreamTest, ReadsTheConcatenationWrappingAround) {
  auto stream = TokenStream::Open(paths_, "data.train");
  ASSERT_TRUE(stream.ok()) << stream.status();
  ASSERT_EQ(stream->size(), 15);
  EXPECT_EQ(stream->max_token(), 14);
  // Every start in several periods either side of zero, every length up to three periods:
  // covers reads inside a shard, across the empty shard, across the wrap, and multiple wraps.
  for (int64_t start = -40; start < 40; ++start) {
    for (int64_t n = 0; n <= 45; ++n) {
      std::vector<int32_t> out(n, -1);
      ASSERT_TRUE(stream->Read(start, n, out.data()).ok());
      for (int64_t i = 0; i < n; ++i) {
        const int64_t want = (((start + i) % 15) + 15) % 15;
        ASSERT_EQ(out[i], want) << "start " << start << " n " << n << " i " << i;
      }
    }
  }
}

TEST_F(TokenStreamTest, TrailingEmptyShardIsSkipped) {
  std::vector<std::string> paths = {paths_[0], paths_[1]};
  auto stream = TokenStream::Open(paths, "data.train");
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<int32_t> out(25);
  ASSERT_TRUE(stream->Read(7, 25, out.data()).ok());
  for (int i = 0; i < 25; ++i) ASSERT_EQ(out[i], (7 + i) % 10);
}

TEST_F(TokenStreamTest, ErrorsNameTheListElement) {
  std::vector<std::string> paths = {paths_[0], dir_.File("gone.bin")};
  auto stream = TokenStream::Open(paths, "data.train");
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(stream.status().message()), StartsWith("data.train[1]: "));
  EXPECT_THAT(stream.status().message(), HasSubstr("gone.bin"));

  stream = TokenStream::Open({}, "data.val");
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stream.status().message(), HasSubstr("data.val: the list of token shards is empty"));

  stream = TokenStream::Open({paths_[1]}, "data.val");
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(stream.status().message(), HasSubstr("hold no tokens"));
}

TEST_F(TokenStreamTest, CheckVocabNamesTheShard) {
  auto stream = TokenStream::Open(paths_, "data.train");
  ASSERT_TRUE(stream.ok());
  absl::Status s = stream->CheckVocab(12);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "data.train[2] '" + paths_[2] + "': token id 14 >= model.vocab_size 12");
  EXPECT_TRUE(stream->CheckVocab(15).ok());
}

}  // namespace
}  // namespace zt
