// DocumentSampler: packed and padded rows, their targets and masks, document starts, overlong
// documents, shuffled epochs, and shards that mix documents with plain text.
#include "worker/data/document_sampler.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"
#include "worker/data/document_index.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScratchDir;

// Documents (tokens, prompt length) written as one shard with its index.
struct Doc {
  std::vector<int32_t> tokens;
  uint32_t prompt = 0;
};

std::string WriteDocs(const ScratchDir& dir, const std::string& name,
                      const std::vector<Doc>& docs) {
  std::vector<int32_t> all;
  DocumentIndex index;
  for (const Doc& d : docs) {
    all.insert(all.end(), d.tokens.begin(), d.tokens.end());
    index.documents.push_back(
        {.length = static_cast<uint32_t>(d.tokens.size()), .prompt_length = d.prompt});
  }
  const std::string path = dir.File(name);
  EXPECT_TRUE(WriteTokenShard(path, all, 256).ok());
  EXPECT_TRUE(WriteDocumentIndex(path + kDocumentIndexSuffix, index).ok());
  return path;
}

struct Opened {
  TokenStream stream;
  std::vector<DocumentIndex> indexes;
};

Opened Open(const std::vector<std::string>& paths) {
  auto stream = TokenStream::Open(paths, "data.train");
  EXPECT_TRUE(stream.ok()) << stream.status();
  auto indexes = ReadStreamDocuments(*stream);
  EXPECT_TRUE(indexes.ok()) << indexes.status();
  EXPECT_TRUE(indexes->has_value());
  return {std::move(*stream), std::move(**indexes)};
}

// Ids and positions are exact: no tolerance in this file.
TEST(DocumentSamplerTest, PackedRowsHoldWholeDocumentsWithMaskedTargets) {
  ScratchDir dir;
  // Prompt lengths 1, 0, 2: targets inside the prompt and at each document's end are -1.
  const std::string shard =
      WriteDocs(dir, "a.bin", {{{10, 11, 12}, 1}, {{20, 21}, 0}, {{30, 31, 32, 33}, 2}, {{40}, 0}});
  Opened o = Open({shard});
  auto s = DocumentSampler::Create(&o.stream, o.indexes, {.B = 2, .T = 6, .pack = true});
  ASSERT_TRUE(s.ok()) << s.status();
  // Row 0: docs 0, 1 and, first fit, 3 (6 tokens, no padding); row 1: doc 2 (4 tokens and
  // 2 of padding).
  EXPECT_EQ((*s)->rows(), 2);
  EXPECT_EQ((*s)->max_documents_per_row(), 3);
  std::vector<int32_t> in(12), tg(12), starts(6);
  ASSERT_TRUE((*s)->Fill(0, in.data(), tg.data(), starts.data()).ok());
  EXPECT_THAT(in, ElementsAre(10, 11, 12, 20, 21, 40, 30, 31, 32, 33, 0, 0));
  EXPECT_THAT(tg, ElementsAre(11, 12, -1, 21, -1, -1, -1, 32, 33, -1, -1, -1));
  EXPECT_THAT(starts, ElementsAre(0, 3, 5, 0, 4, 6));
}

TEST(DocumentSamplerTest, UnpackedRowsPadEachDocumentWithTheSameMask) {
  ScratchDir dir;
  const std::string shard = WriteDocs(dir, "a.bin", {{{10, 11, 12}, 1}, {{20, 21}, 0}});
  Opened o = Open({shard});
  auto s = DocumentSampler::Create(&o.stream, o.indexes, {.B = 2, .T = 4, .pack = false});
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<int32_t> in(8), tg(8), starts(4);
  ASSERT_TRUE((*s)->Fill(0, in.data(), tg.data(), starts.data()).ok());
  EXPECT_THAT(in, ElementsAre(10, 11, 12, 0, 20, 21, 0, 0));
  EXPECT_THAT(tg, ElementsAre(11, 12, -1, -1, 21, -1, -1, -1));
  EXPECT_THAT(starts, ElementsAre(0, 3, 0, 2));
  // Epoch two starts over: micro-batch 1 is micro-batch 0 again.
  std::vector<int32_t> in1(8), tg1(8);
  ASSERT_TRUE((*s)->Fill(1, in1.data(), tg1.data(), nullptr).ok());
  EXPECT_EQ(in1, in);
  EXPECT_EQ(tg1, tg);
}

TEST(DocumentSamplerTest, OverlongDocumentIsRefusedByNameOrTruncated) {
  ScratchDir dir;
  const std::string shard = WriteDocs(dir, "a.bin", {{{1, 2}, 0}, {{3, 4, 5, 6, 7}, 1}});
  Opened o = Open({shard});
  auto refused = DocumentSampler::Create(&o.stream, o.indexes, {.B = 1, .T = 4});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("data.train[0] '" + shard + "': document 1"));
  EXPECT_THAT(refused.status().message(), HasSubstr("5 tokens > data.seq_len 4"));
  EXPECT_THAT(refused.status().message(), HasSubstr("data.overlong REFUSE"));
  auto cut = DocumentSampler::Create(&o.stream, o.indexes,
                                     {.B = 2, .T = 4, .overlong = Overlong::kTruncate});
  ASSERT_TRUE(cut.ok()) << cut.status();
  std::vector<int32_t> in(8), tg(8);
  ASSERT_TRUE((*cut)->Fill(0, in.data(), tg.data(), nullptr).ok());
  EXPECT_THAT(in, ElementsAre(1, 2, 0, 0, 3, 4, 5, 6));
  EXPECT_THAT(tg, ElementsAre(2, -1, -1, -1, 4, 5, 6, -1));
}

TEST(DocumentSamplerTest, ShuffledEpochsArePermutationsOfTheRowsAndPureInK) {
  ScratchDir dir;
  std::vector<Doc> docs;
  for (int i = 0; i < 12; ++i) docs.push_back({{i + 1, i + 100}, 0});
  Opened o = Open({WriteDocs(dir, "a.bin", docs)});
  const DocumentSamplerOptions opts = {.B = 3, .T = 2, .pack = true, .shuffle = true, .seed = 7};
  auto s = DocumentSampler::Create(&o.stream, o.indexes, opts);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ((*s)->rows(), 12);
  std::vector<int> seen;
  std::vector<std::vector<int32_t>> first;
  for (int k = 0; k < 4; ++k) {  // one epoch: 12 rows
    std::vector<int32_t> in(6), tg(6);
    ASSERT_TRUE((*s)->Fill(k, in.data(), tg.data(), nullptr).ok());
    for (int b = 0; b < 3; ++b) seen.push_back(in[2 * b]);
    first.push_back(in);
  }
  std::vector<int> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_THAT(sorted, ElementsAre(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12));
  EXPECT_NE(seen, sorted);  // seed 7 does not give the identity on 12 rows
  // A fresh sampler (a resumed run) gives the same batch k in any order.
  auto fresh = DocumentSampler::Create(&o.stream, o.indexes, opts);
  ASSERT_TRUE(fresh.ok());
  for (int k = 3; k >= 0; --k) {
    std::vector<int32_t> in(6), tg(6);
    ASSERT_TRUE((*fresh)->Fill(k, in.data(), tg.data(), nullptr).ok());
    EXPECT_EQ(in, first[k]) << k;
  }
}

// CountedTargets works the count out from the plan; Fill writes the targets: they must agree
// for every micro-batch, packed or padded, shuffled, with prompts of every length (none, part,
// all, and longer than the document a 9-token one is truncated to).
TEST(DocumentSamplerTest, CountedTargetsIsWhatFillCounts) {
  ScratchDir dir;
  std::vector<Doc> docs;
  for (int i = 0; i < 40; ++i) {
    const int length = 1 + (i * 7) % 9;  // 1 … 9 tokens; 9 > T truncates
    Doc d;
    for (int j = 0; j < length; ++j) d.tokens.push_back(1 + (i + j) % 200);
    d.prompt = static_cast<uint32_t>((i * 5) % (length + 1));  // 0 … length
    docs.push_back(d);
  }
  Opened o = Open({WriteDocs(dir, "a.bin", docs)});
  for (const bool pack : {true, false}) {
    for (const bool shuffle : {false, true}) {
      auto s = DocumentSampler::Create(&o.stream, o.indexes,
                                       {.B = 3,
                                        .T = 8,
                                        .pack = pack,
                                        .shuffle = shuffle,
                                        .seed = 3,
                                        .overlong = Overlong::kTruncate});
      ASSERT_TRUE(s.ok()) << s.status();
      int64_t total = 0;
      for (int64_t k = 0; k < 30; ++k) {  // more than an epoch
        std::vector<int32_t> in(24), tg(24);
        ASSERT_TRUE((*s)->Fill(k, in.data(), tg.data(), nullptr).ok());
        const int64_t filled =
            std::count_if(tg.begin(), tg.end(), [](int32_t t) { return t >= 0; });
        auto counted = (*s)->CountedTargets(k);
        ASSERT_TRUE(counted.ok()) << counted.status();
        EXPECT_EQ(*counted, filled)
            << "k " << k << (pack ? " packed" : " padded") << (shuffle ? " shuffled" : "");
        total += filled;
      }
      EXPECT_GT(total, 0);
    }
  }
  auto s = DocumentSampler::Create(&o.stream, o.indexes,
                                   {.B = 1, .T = 8, .overlong = Overlong::kTruncate});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->CountedTargets(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DocumentSamplerTest, DocumentsAndPlainTextInOneFieldAreRefused) {
  ScratchDir dir;
  const std::string docs = WriteDocs(dir, "a.bin", {{{1, 2}, 0}});
  const std::string plain = dir.File("b.bin");
  ASSERT_TRUE(WriteTokenShard(plain, std::vector<int32_t>{1, 2, 3}, 256).ok());
  auto stream = TokenStream::Open({docs, plain}, "data.train");
  ASSERT_TRUE(stream.ok());
  auto indexes = ReadStreamDocuments(*stream);
  EXPECT_EQ(indexes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(indexes.status().message(), HasSubstr("data.train[1] '" + plain + "' has none"));
  // Plain shards alone: no documents, as before.
  auto only_plain = TokenStream::Open({plain}, "data.train");
  ASSERT_TRUE(only_plain.ok());
  auto none = ReadStreamDocuments(*only_plain);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

}  // namespace
}  // namespace zt
