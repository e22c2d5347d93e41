#include "worker/data/prepare.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::TinyBpe;
using testing::WriteBytes;

std::vector<int32_t> ShardTokens(const std::string& path) {
  auto shard = TokenShard::Open(path);
  EXPECT_TRUE(shard.ok()) << shard.status();
  if (!shard.ok()) return {};
  std::vector<int32_t> tokens((*shard)->size());
  (*shard)->Read(0, (*shard)->size(), tokens.data());
  return tokens;
}

// Ids are exact; no tolerance anywhere in this file.
TEST(PrepareTest, BytesConcatenateFilesWithNothingBetween) {
  ScratchDir dir;
  WriteBytes(dir.File("a.txt"), "abc");
  WriteBytes(dir.File("b.txt"), "de");
  PrepareStats stats;
  ASSERT_TRUE(PrepareShard(ByteTokenizer(), {dir.File("a.txt"), dir.File("b.txt")},
                           dir.File("out.bin"), &stats)
                  .ok());
  EXPECT_EQ(ShardTokens(dir.File("out.bin")), (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e'}));
  EXPECT_EQ(stats.files, 2);
  EXPECT_EQ(stats.bytes_read, 5);
  EXPECT_EQ(stats.tokens, 5);
  auto shard = TokenShard::Open(dir.File("out.bin"));
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ((*shard)->vocab_size(), 256u);
  EXPECT_EQ((*shard)->token_width(), 2);
}

TEST(PrepareTest, BpeSeparatesFilesWithEndOfText) {
  ScratchDir dir;
  TinyBpe::WriteVocabAndMerges(dir.File("vocab.json"), dir.File("merges.txt"));
  auto tok = BpeTokenizer::FromVocabAndMerges(dir.File("vocab.json"), dir.File("merges.txt"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  WriteBytes(dir.File("a.txt"), "hello");
  WriteBytes(dir.File("b.txt"), " the");
  WriteBytes(dir.File("c.txt"), "");
  PrepareStats stats;
  ASSERT_TRUE(PrepareShard(**tok, {dir.File("a.txt"), dir.File("b.txt"), dir.File("c.txt")},
                           dir.File("out.bin"), &stats)
                  .ok());
  // "hello" -> [hell, o]; " the" -> [Ġthe]; the empty file still follows a separator.
  const int eot = TinyBpe::kEndOfText;
  EXPECT_EQ(ShardTokens(dir.File("out.bin")), (std::vector<int32_t>{258, 111, eot, 260, eot}));
  EXPECT_EQ(stats.files, 3);
  EXPECT_EQ(stats.bytes_read, 9);
  EXPECT_EQ(stats.tokens, 5);
}

TEST(PrepareTest, MissingInputNamesTheFileAndWritesNothing) {
  ScratchDir dir;
  WriteBytes(dir.File("a.txt"), "abc");
  absl::Status s = PrepareShard(ByteTokenizer(), {dir.File("a.txt"), dir.File("gone.txt")},
                                dir.File("out.bin"), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("input text '" + dir.File("gone.txt") + "'"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("out.bin")));

  s = PrepareShard(ByteTokenizer(), {}, dir.File("out.bin"), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrepareTest, SplitPutsTheLastFractionInValidation) {
  ScratchDir dir;
  WriteBytes(dir.File("a.txt"), "0123456");
  WriteBytes(dir.File("b.txt"), "789");
  PrepareStats stats;
  const SplitOutputs out = {
      .train_path = dir.File("train.bin"), .val_path = dir.File("val.bin"), .val_fraction = 0.3};
  ASSERT_TRUE(
      PrepareSplit(ByteTokenizer(), {dir.File("a.txt"), dir.File("b.txt")}, out, &stats).ok());
  // floor(0.3 * 10) = 3 validation tokens: the last three bytes.
  EXPECT_EQ(ShardTokens(out.train_path), (std::vector<int32_t>{'0', '1', '2', '3', '4', '5', '6'}));
  EXPECT_EQ(ShardTokens(out.val_path), (std::vector<int32_t>{'7', '8', '9'}));
  EXPECT_EQ(stats.tokens, 10);
  EXPECT_EQ(stats.val_tokens, 3);
}

TEST(PrepareTest, SplitRejectsFractionsThatEmptyAShard) {
  ScratchDir dir;
  WriteBytes(dir.File("a.txt"), "0123456789");
  // floor(0.05 * 10) = 0 leaves validation empty; NaN fails every comparison.
  for (double f : {0.0, 1.0, -0.5, 0.05, std::nan("")}) {
    const SplitOutputs out = {
        .train_path = dir.File("train.bin"), .val_path = dir.File("val.bin"), .val_fraction = f};
    absl::Status s = PrepareSplit(ByteTokenizer(), {dir.File("a.txt")}, out, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_THAT(s.message(), HasSubstr("val_fraction")) << f;
    EXPECT_FALSE(std::filesystem::exists(dir.File("train.bin"))) << f;
  }
}

}  // namespace
}  // namespace zt
