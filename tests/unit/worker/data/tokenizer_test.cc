#include "worker/data/tokenizer.h"

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/data/data_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::TinyBpe;

// Token ids are integers and text is bytes: every comparison in this file is exact.
TEST(ByteTokenizerTest, OneIdPerByteAndExactRoundTrip) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_FALSE(tok.end_of_text().has_value());
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::vector<int32_t> ids = tok.Encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.Decode(ids), all);

  std::mt19937 rng(3);
  std::string random(10000, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  EXPECT_EQ(tok.Decode(tok.Encode(random)), random);
}

TEST(ByteTokenizerTest, OutOfRangeIdsDecodeToReplacementCharacter) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.Decode(std::vector<int32_t>{'a', 256, -1, 'b'}),
            "a\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
}

// "hello the world" under TinyBpe (data_test_util.h): [hell, o, Ġthe, Ġw, or, l, d].
const std::vector<int32_t> kHelloIds = {258, 111, 260, 262, 261, 108, 100};

TEST(LoadTokenizerTest, EveryAcceptedSpecGivesTheSameBpe) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.File("gpt2"));
  std::filesystem::create_directories(dir.File("hf"));
  TinyBpe::WriteVocabAndMerges(dir.File("gpt2/vocab.json"), dir.File("gpt2/merges.txt"));
  TinyBpe::WriteTokenizerJson(dir.File("hf/tokenizer.json"), /*pair_merges=*/false);
  TinyBpe::WriteTokenizerJson(dir.File("renamed.json"), /*pair_merges=*/true);
  for (const std::string& spec : {dir.File("gpt2"), dir.File("gpt2/vocab.json"), dir.File("hf"),
                                  dir.File("hf/tokenizer.json"), dir.File("renamed.json")}) {
    auto tok = LoadTokenizer(spec);
    ASSERT_TRUE(tok.ok()) << spec << ": " << tok.status();
    EXPECT_EQ((*tok)->vocab_size(), TinyBpe::kVocabSize) << spec;
    EXPECT_EQ((*tok)->end_of_text(), TinyBpe::kEndOfText) << spec;
    EXPECT_EQ((*tok)->Encode("hello the world"), kHelloIds) << spec;
  }
  auto bytes = LoadTokenizer("bytes");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)->vocab_size(), 256);
}

TEST(LoadTokenizerTest, ErrorsNameWhatIsMissing) {
  ScratchDir dir;
  auto tok = LoadTokenizer(dir.File("nope"));
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tok.status().message(), HasSubstr(dir.File("nope")));

  tok = LoadTokenizer(dir.path());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tok.status().message(), HasSubstr("neither tokenizer.json nor vocab.json"));

  TinyBpe::WriteVocabAndMerges(dir.File("vocab.json"), dir.File("merges.txt"));
  std::filesystem::remove(dir.File("merges.txt"));
  tok = LoadTokenizer(dir.File("vocab.json"));
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tok.status().message(), HasSubstr(dir.File("merges.txt")));

  testing::WriteBytes(dir.File("broken.json"), "{\"model\": ");
  tok = LoadTokenizer(dir.File("broken.json"));
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tok.status().message(), HasSubstr("broken.json"));
}

}  // namespace
}  // namespace zt
