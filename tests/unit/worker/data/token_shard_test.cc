#include "worker/data/token_shard.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::ReadBytes;
using testing::ScratchDir;
using testing::WriteBytes;

template <typename T>
T At(const std::string& bytes, size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

// Ids are integers: every comparison in this file is exact.
TEST(TokenShardTest, HeaderIsTheDocumentedLayout) {
  ScratchDir dir;
  const std::string path = dir.File("a.bin");
  const std::vector<int32_t> tokens = {7, 300, 65535, 0};
  ASSERT_TRUE(WriteTokenShard(path, tokens, 65536).ok());
  const std::string bytes = ReadBytes(path);
  ASSERT_EQ(bytes.size(), 64u + 4 * 2);
  EXPECT_EQ(bytes.substr(0, 8), "ZTTOKENS");
  EXPECT_EQ(At<uint32_t>(bytes, 8), 1u);   // version
  EXPECT_EQ(At<uint32_t>(bytes, 12), 2u);  // width: vocab <= 65536
  EXPECT_EQ(At<uint64_t>(bytes, 16), 4u);  // count
  EXPECT_EQ(At<uint32_t>(bytes, 24), 65536u);
  EXPECT_EQ(At<uint32_t>(bytes, 28), 65535u);  // largest id
  EXPECT_EQ(bytes.substr(32, 32), std::string(32, '\0'));
  EXPECT_EQ(At<uint16_t>(bytes, 64), 7);
  EXPECT_EQ(At<uint16_t>(bytes, 66), 300);
  EXPECT_EQ(At<uint16_t>(bytes, 68), 65535);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TokenShardTest, RoundTripsBothWidths) {
  ScratchDir dir;
  struct Case {
    uint32_t vocab;
    int32_t largest;
    int width;
  };
  // Vocab 0 (unknown) picks the width from the largest id.
  for (const Case c : {Case{256, 255, 2}, Case{65536, 65535, 2}, Case{65537, 65536, 4},
                       Case{200000, 199999, 4}, Case{0, 65535, 2}, Case{0, 65536, 4}}) {
    const std::string path = dir.File("w.bin");
    std::vector<int32_t> tokens;
    for (int i = 0; i < 1000; ++i) tokens.push_back((i * 7919) % (c.largest + 1));
    tokens.push_back(c.largest);
    ASSERT_TRUE(WriteTokenShard(path, tokens, c.vocab).ok());
    auto shard = TokenShard::Open(path);
    ASSERT_TRUE(shard.ok()) << shard.status();
    const TokenShard& s = **shard;
    EXPECT_EQ(s.token_width(), c.width) << c.vocab;
    EXPECT_EQ(s.vocab_size(), c.vocab);
    EXPECT_EQ(s.max_token(), c.largest);
    ASSERT_EQ(s.size(), static_cast<int64_t>(tokens.size()));
    for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(s.token(i), tokens[i]) << i;
    std::vector<int32_t> out(500);
    s.Read(300, 500, out.data());
    EXPECT_EQ(out, std::vector<int32_t>(tokens.begin() + 300, tokens.begin() + 800));
  }
}

TEST(TokenShardTest, EmptyShardAndOverwrite) {
  ScratchDir dir;
  const std::string path = dir.File("e.bin");
  ASSERT_TRUE(WriteTokenShard(path, std::vector<int32_t>{1, 2, 3}, 256).ok());
  ASSERT_TRUE(WriteTokenShard(path, {}, 256).ok());
  auto shard = TokenShard::Open(path);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->size(), 0);
  EXPECT_EQ((*shard)->max_token(), 0);
  EXPECT_EQ(ReadBytes(path).size(), 64u);
}

TEST(TokenShardTest, WriterRejectsIdsOutsideTheVocabulary) {
  ScratchDir dir;
  const std::string path = dir.File("bad.bin");
  absl::Status s = WriteTokenShard(path, std::vector<int32_t>{1, 256, 3}, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token 1 is 256 >= vocab_size 256"));
  s = WriteTokenShard(path, std::vector<int32_t>{1, 2, -5}, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token 2 is -5"));
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(TokenShardTest, WriterNamesTheFileItCannotCreate) {
  ScratchDir dir;
  const std::string path = dir.File("no/such/dir/x.bin");
  absl::Status s = WriteTokenShard(path, std::vector<int32_t>{1}, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(path + ".tmp"));
}

TEST(TokenShardTest, MissingFileIsNotFound) {
  ScratchDir dir;
  auto shard = TokenShard::Open(dir.File("missing.bin"));
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(shard.status().message(), HasSubstr("missing.bin"));
}

class CorruptShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("c.bin");
    std::vector<int32_t> tokens(100);
    for (int i = 0; i < 100; ++i) tokens[i] = i;
    ASSERT_TRUE(WriteTokenShard(path_, tokens, 256).ok());
    bytes_ = ReadBytes(path_);
  }
  absl::Status OpenWith(const std::string& bytes) {
    WriteBytes(path_, bytes);
    return TokenShard::Open(path_).status();
  }
  template <typename T>
  std::string Patched(size_t offset, T value) {
    std::string b = bytes_;
    std::memcpy(b.data() + offset, &value, sizeof(T));
    return b;
  }

  ScratchDir dir_;
  std::string path_;
  std::string bytes_;
};

TEST_F(CorruptShardTest, BadMagic) {
  std::string b = bytes_;
  b[0] = 'X';
  absl::Status s = OpenWith(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("bad magic"));
  EXPECT_THAT(s.message(), HasSubstr(path_));
}

TEST_F(CorruptShardTest, UnsupportedVersionAndWidth) {
  absl::Status s = OpenWith(Patched<uint32_t>(8, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unsupported format version 2"));
  s = OpenWith(Patched<uint32_t>(12, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unsupported token width 3"));
}

TEST_F(CorruptShardTest, TruncatedSaysExpectedAndActualBytes) {
  absl::Status s = OpenWith(bytes_.substr(0, 64 + 150));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
  EXPECT_THAT(s.message(), HasSubstr("expected 64 + 100 x 2 bytes but the file has 214"));
  EXPECT_THAT(s.message(), HasSubstr(path_));

  s = OpenWith(bytes_.substr(0, 10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("10 bytes, shorter than the 64-byte header"));

  // A count so large that count x width overflows 64 bits must still read as truncated.
  s = OpenWith(Patched<uint64_t>(16, ~uint64_t{0}));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("truncated"));
}

TEST_F(CorruptShardTest, TrailingBytesAndInconsistentHeader) {
  absl::Status s = OpenWith(bytes_ + "xx");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("expected 264 bytes but the file has 266"));
  s = OpenWith(Patched<uint32_t>(28, 256));  // largest id 256 in a vocab of 256
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("largest id 256"));
}

TEST(TokenShardTest, CheckVocabNamesTheJobFields) {
  ScratchDir dir;
  const std::string path = dir.File("x.bin");
  ASSERT_TRUE(WriteTokenShard(path, std::vector<int32_t>{5, 300, 7}, 0).ok());
  auto shard = TokenShard::Open(path);
  ASSERT_TRUE(shard.ok());
  absl::Status s = (*shard)->CheckVocab(256, "data.train[0]");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "data.train[0] '" + path + "': token id 300 >= model.vocab_size 256");
  EXPECT_THAT((*shard)->CheckVocab(300, "data.val[2]", "tokenizer vocab").message(),
              HasSubstr("data.val[2] '" + path + "': token id 300 >= tokenizer vocab 300"));
  EXPECT_TRUE((*shard)->CheckVocab(301, "data.train[0]").ok());
}

}  // namespace
}  // namespace zt
