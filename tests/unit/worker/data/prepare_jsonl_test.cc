// `zt prepare --format jsonl`: documents, their loss mask, the split and each named error.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/document_index.h"
#include "worker/data/prepare.h"
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

DocumentIndex IndexOf(const std::string& shard) {
  auto header = ReadTokenShardHeader(shard);
  EXPECT_TRUE(header.ok()) << header.status();
  auto index = ReadDocumentIndex(shard, header.ok() ? header->count : 0);
  EXPECT_TRUE(index.ok()) << index.status();
  if (!index.ok() || !index->has_value()) {
    ADD_FAILURE() << "no document index beside " << shard;
    return {};
  }
  return **index;
}

// Ids and lengths are exact: no tolerance in this file.
TEST(PrepareJsonlTest, PromptCompletionAndTextKeepBoundariesAndPromptLengths) {
  ScratchDir dir;
  WriteBytes(dir.File("a.jsonl"),
             "{\"prompt\": \"ab\", \"completion\": \"c\"}\n\n   \n{\"text\": \"de\"}\n");
  PrepareStats stats;
  ASSERT_TRUE(PrepareJsonlShard(ByteTokenizer(), {dir.File("a.jsonl")}, dir.File("out.bin"), &stats)
                  .ok());
  EXPECT_EQ(ShardTokens(dir.File("out.bin")), (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e'}));
  const DocumentIndex index = IndexOf(dir.File("out.bin"));
  ASSERT_EQ(index.documents.size(), 2u);
  EXPECT_EQ(index.documents[0].length, 3u);
  EXPECT_EQ(index.documents[0].prompt_length, 2u);
  EXPECT_EQ(index.documents[1].length, 2u);
  EXPECT_EQ(index.documents[1].prompt_length, 0u);
  EXPECT_EQ(stats.documents, 2);
  EXPECT_EQ(stats.tokens, 5);
}

TEST(PrepareJsonlTest, EndOfTextClosesEveryCompletionAndCounts) {
  ScratchDir dir;
  TinyBpe::WriteVocabAndMerges(dir.File("vocab.json"), dir.File("merges.txt"));
  auto tok = BpeTokenizer::FromVocabAndMerges(dir.File("vocab.json"), dir.File("merges.txt"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  WriteBytes(dir.File("a.jsonl"), "{\"prompt\": \"hello\", \"completion\": \" the\"}\n");
  ASSERT_TRUE(PrepareJsonlShard(**tok, {dir.File("a.jsonl")}, dir.File("out.bin"), nullptr).ok());
  // "hello" -> [hell, o] (prompt); " the" -> [Ġthe], then <|endoftext|> (completion).
  EXPECT_EQ(ShardTokens(dir.File("out.bin")),
            (std::vector<int32_t>{258, 111, 260, TinyBpe::kEndOfText}));
  const DocumentIndex index = IndexOf(dir.File("out.bin"));
  ASSERT_EQ(index.documents.size(), 1u);
  EXPECT_EQ(index.documents[0].prompt_length, 2u);
}

TEST(PrepareJsonlTest, SplitCutsBetweenWholeDocuments) {
  ScratchDir dir;
  WriteBytes(dir.File("a.jsonl"), "{\"text\": \"abc\"}\n{\"text\": \"de\"}\n{\"text\": \"f\"}\n"
                                  "{\"prompt\": \"g\", \"completion\": \"hi\"}\n");
  PrepareStats stats;
  ASSERT_TRUE(PrepareJsonlSplit(ByteTokenizer(), {dir.File("a.jsonl")},
                                {.train_path = dir.File("train.bin"),
                                 .val_path = dir.File("val.bin"),
                                 .val_fraction = 0.5},
                                &stats)
                  .ok());
  EXPECT_EQ(ShardTokens(dir.File("train.bin")), (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e'}));
  EXPECT_EQ(ShardTokens(dir.File("val.bin")), (std::vector<int32_t>{'f', 'g', 'h', 'i'}));
  EXPECT_EQ(IndexOf(dir.File("train.bin")).documents.size(), 2u);
  const DocumentIndex val = IndexOf(dir.File("val.bin"));
  ASSERT_EQ(val.documents.size(), 2u);
  EXPECT_EQ(val.documents[1].prompt_length, 1u);
  EXPECT_EQ(stats.val_tokens, 4);
}

struct BadLine {
  std::string line;
  std::string rule;
};

TEST(PrepareJsonlTest, BadLinesAreNamedByFileLineAndRule) {
  const std::vector<BadLine> cases = {
      {"{\"prompt\": \"a\"", "not valid JSON"},
      {"[1, 2]", "must be a JSON object, not array"},
      {"{\"prompt\": \"a\"}", "needs a 'text' field or both 'prompt' and 'completion'"},
      {"{\"completion\": \"a\"}", "needs a 'text' field or both 'prompt' and 'completion'"},
      {"{\"text\": \"a\", \"prompt\": \"b\"}", "'text' beside 'prompt'/'completion'"},
      {"{\"text\": 3}", "field 'text' must be a string, not number"},
      {"{\"text\": \"\"}", "empty document: 'text'"},
      {"{\"prompt\": \"a\", \"completion\": \"\"}", "empty document: 'completion'"},
  };
  for (const BadLine& c : cases) {
    ScratchDir dir;
    WriteBytes(dir.File("in.jsonl"), "{\"text\": \"ok\"}\n\n" + c.line + "\n");
    const absl::Status s =
        PrepareJsonlShard(ByteTokenizer(), {dir.File("in.jsonl")}, dir.File("out.bin"), nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(s.message(), HasSubstr(dir.File("in.jsonl") + ":3: ")) << c.line;
    EXPECT_THAT(s.message(), HasSubstr(c.rule)) << c.line;
    EXPECT_FALSE(std::filesystem::exists(dir.File("out.bin"))) << c.line;
  }
}

TEST(PrepareJsonlTest, InputWithoutDocumentsIsRefused) {
  ScratchDir dir;
  WriteBytes(dir.File("in.jsonl"), "\n  \n");
  const absl::Status s =
      PrepareJsonlShard(ByteTokenizer(), {dir.File("in.jsonl")}, dir.File("out.bin"), nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no documents"));
}

TEST(PrepareJsonlTest, TextPrepareOverAJsonlShardRemovesItsIndex) {
  ScratchDir dir;
  WriteBytes(dir.File("a.jsonl"), "{\"text\": \"abc\"}\n");
  WriteBytes(dir.File("a.txt"), "abcd");
  ASSERT_TRUE(
      PrepareJsonlShard(ByteTokenizer(), {dir.File("a.jsonl")}, dir.File("out.bin"), nullptr).ok());
  ASSERT_TRUE(PrepareShard(ByteTokenizer(), {dir.File("a.txt")}, dir.File("out.bin"), nullptr).ok());
  auto index = ReadDocumentIndex(dir.File("out.bin"), 4);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_FALSE(index->has_value());
}

TEST(DocumentIndexTest, CorruptIndexesAreDataLossNamingTheFile) {
  ScratchDir dir;
  const std::string shard = dir.File("s.bin");
  ASSERT_TRUE(WriteDocumentIndex(shard + kDocumentIndexSuffix,
                                 {.documents = {{.length = 3, .prompt_length = 1}}})
                  .ok());
  // Against a shard of another size.
  auto wrong = ReadDocumentIndex(shard, 4);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(wrong.status().message(), HasSubstr(shard + kDocumentIndexSuffix));
  // Truncated by one byte.
  std::string bytes = testing::ReadBytes(shard + kDocumentIndexSuffix);
  WriteBytes(shard + kDocumentIndexSuffix, bytes.substr(0, bytes.size() - 1));
  EXPECT_EQ(ReadDocumentIndex(shard, 3).status().code(), absl::StatusCode::kDataLoss);
  // A bad magic.
  bytes[0] = 'X';
  WriteBytes(shard + kDocumentIndexSuffix, bytes);
  EXPECT_EQ(ReadDocumentIndex(shard, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zt
