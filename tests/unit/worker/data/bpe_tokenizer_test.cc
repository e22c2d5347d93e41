#include "worker/data/bpe_tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/worker/data/data_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;
using testing::Sym;
using testing::TinyBpe;

// Ids and bytes are exact: no tolerance anywhere in this file.
class TinyBpeTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> tok;
    switch (GetParam()) {
      case 0:
        TinyBpe::WriteVocabAndMerges(dir_.File("vocab.json"), dir_.File("merges.txt"));
        tok = BpeTokenizer::FromVocabAndMerges(dir_.File("vocab.json"), dir_.File("merges.txt"));
        break;
      default:
        TinyBpe::WriteTokenizerJson(dir_.File("tokenizer.json"), /*pair_merges=*/GetParam() == 2);
        tok = BpeTokenizer::FromTokenizerJson(dir_.File("tokenizer.json"));
        break;
    }
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
  }

  std::vector<int32_t> Ids(const std::string& text) { return tok_->Encode(text); }

  ScratchDir dir_;
  std::unique_ptr<BpeTokenizer> tok_;
};

// Expected ids derived by hand from TinyBpe's table (data_test_util.h); byte b has id b.
TEST_P(TinyBpeTest, HandDerivedEncodings) {
  EXPECT_EQ(tok_->vocab_size(), TinyBpe::kVocabSize);
  EXPECT_EQ(tok_->num_merges(), 15);
  // Pieces "hello" " the" " world".
  // "hello": h e l l o -> rank 0 (h,e): he l l o -> rank 1 (l,l): he ll o -> rank 2: hell o.
  // " the":  Ġ t h e -> rank 0 (h,e) before rank 3 (Ġ,t): Ġ t he -> Ġt he -> rank 4: Ġthe.
  // " world": Ġ w o r l d -> rank 5 (o,r) then rank 6 (Ġ,w): Ġw or l d.
  // Rank 8 (o,Ġ) would join "hello" and " the" but they are different pieces.
  EXPECT_EQ(Ids("hello the world"), (std::vector<int32_t>{258, 111, 260, 262, 261, 108, 100}));
  // "bell": b e l l; (l,l) rank 1 beats (e,l) rank 7, so the result is b e ll, not b el l.
  EXPECT_EQ(Ids("bell"), (std::vector<int32_t>{'b', 'e', 257}));
  // "llll": three (l,l) pairs of equal rank; the leftmost merges first: ll l l -> ll ll.
  EXPECT_EQ(Ids("llll"), (std::vector<int32_t>{257, 257}));
  // "café" is one letter piece; é is bytes C3 A9, merged by rank 10.
  EXPECT_EQ(Ids("caf\xC3\xA9"), (std::vector<int32_t>{'c', 'a', 'f', 266}));
  // "it's": the contraction "'s" is its own piece and merges by rank 11.
  EXPECT_EQ(Ids("it's"), (std::vector<int32_t>{'i', 't', 267}));
  // "2024!!": digits and punctuation are separate pieces, so rank 12 (4,!) never applies.
  EXPECT_EQ(Ids("2024!!"), (std::vector<int32_t>{'2', '0', '2', '4', '!', '!'}));
  // "a  b": pieces "a", " " (whitespace not followed by a non-space), " b": no (Ġ,Ġ) merge.
  EXPECT_EQ(Ids("a  b"), (std::vector<int32_t>{'a', ' ', ' ', 'b'}));
  // "a  \n": trailing whitespace is one piece Ġ Ġ Ċ, and rank 9 joins the two spaces.
  EXPECT_EQ(Ids("a  \n"), (std::vector<int32_t>{'a', 265, '\n'}));
  // "aé" is one letter piece only if é counts as a letter: a Ã © -> a é -> rank 14 "aé".
  EXPECT_EQ(Ids("a\xC3\xA9"), (std::vector<int32_t>{270}));
  // U+3000 (E3 80 80) is Unicode whitespace: "a", U+3000, U+3000, "b" are four pieces, so
  // rank 13 (80, E3) never joins the two ideographic spaces.
  EXPECT_EQ(Ids("a\xE3\x80\x80\xE3\x80\x80"
                "b"),
            (std::vector<int32_t>{'a', 0xE3, 0x80, 0x80, 0xE3, 0x80, 0x80, 'b'}));
  EXPECT_TRUE(Ids("").empty());
}

TEST_P(TinyBpeTest, SpecialTokensAreTextWhenEncodedAndNamedWhenDecoded) {
  EXPECT_EQ(tok_->end_of_text(), TinyBpe::kEndOfText);
  const std::vector<int32_t> ids = Ids("<|endoftext|>");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), TinyBpe::kEndOfText), 0);
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{258, 111, TinyBpe::kEndOfText, 260}),
            "hello<|endoftext|> the");
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{'a', 5000, -3}), "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_P(TinyBpeTest, RoundTripsArbitraryText) {
  constexpr char kEmbeddedNul[] = "embedded\0nul and \x01\x7f control";
  const std::vector<std::string> texts = {
      "Hello, World! It's 2024; we'll see: 3.14159 + 2e-5 = ?\n\n",
      "  leading and trailing spaces   \t\ttabs\r\nCRLF\n\n\n",
      "Grüße aus Köln — naïve café, Ελληνικά, русский, 日本語のテキスト, العربية 🎉🚀!",
      "digits123mixed456 ٣٤٥ Ⅻ ½ and punctuation...!?#@$%^&*()[]{}<>~`|\\/\"'",
      "'s'S 'll 'LL 've 're 'd 'm 't x's",
      std::string(kEmbeddedNul, sizeof(kEmbeddedNul) - 1),
      // Invalid UTF-8: lone continuation bytes, a truncated sequence, an overlong form.
      "bad \x80\xBF utf8 \xE2\x82 and \xC0\xAF and \xFF\xFE end",
      std::string(100000, ' ') + "x" + std::string(3000, '\n'),
      std::string(100000, 'l'),
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(tok_->Decode(tok_->Encode(text)), text) << text.substr(0, 60);
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 50; ++trial) {
    std::string random(rng() % 300, '\0');
    for (char& c : random) c = static_cast<char>(rng());
    EXPECT_EQ(tok_->Decode(tok_->Encode(random)), random) << trial;
  }
}

TEST_P(TinyBpeTest, CachedWordsEncodeAsFresh) {
  const std::vector<int32_t> first = Ids("hello hello hello");
  EXPECT_EQ(first, Ids("hello hello hello"));
  EXPECT_EQ(first, (std::vector<int32_t>{258, 111, ' ', 258, 111, ' ', 258, 111}));
}

std::string FormatName(const ::testing::TestParamInfo<int>& info) {
  const char* names[] = {"VocabAndMerges", "TokenizerJson", "TokenizerJsonPairs"};
  return names[info.param];
}
INSTANTIATE_TEST_SUITE_P(Formats, TinyBpeTest, ::testing::Values(0, 1, 2), FormatName);

// GPT-2's bpe() from openai/gpt-2 encoder.py, transcribed over byte strings: merge every
// occurrence of the lowest-ranked pair, left to right, until no pair is ranked.
std::vector<std::string> ReferenceBpe(
    const std::string& word, const std::map<std::pair<std::string, std::string>, int>& rank) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.emplace_back(1, c);
  while (symbols.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> bigram;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = rank.find({symbols[i], symbols[i + 1]});
      if (it != rank.end() && (best < 0 || it->second < best)) {
        best = it->second;
        bigram = it->first;
      }
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == bigram.first && symbols[i + 1] == bigram.second) {
        merged.push_back(bigram.first + bigram.second);
        i += 2;
      } else {
        merged.push_back(symbols[i++]);
      }
    }
    symbols = std::move(merged);
  }
  return symbols;
}

// A random merge table over {a, b, c} (each merge joins two tokens that already exist, as
// a trained table does) and random words: the heap-based merge must agree with GPT-2's loop.
TEST(BpeTokenizerTest, MatchesGpt2ReferenceOnRandomMergeTables) {
  ScratchDir dir;
  std::mt19937 rng(2024);
  for (int table = 0; table < 5; ++table) {
    std::vector<std::string> tokens = {"a", "b", "c"};
    std::map<std::string, int> vocab;
    for (int b = 0; b < 256; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
    std::map<std::pair<std::string, std::string>, int> rank;
    std::ofstream merges(dir.File("merges.txt"));
    while (rank.size() < 150) {
      const std::string x = tokens[rng() % tokens.size()];
      const std::string y = tokens[rng() % tokens.size()];
      if (vocab.count(x + y) || x.size() + y.size() > 8) continue;
      const int id = static_cast<int>(vocab.size());
      vocab[x + y] = id;
      rank[{x, y}] = static_cast<int>(rank.size());
      tokens.push_back(x + y);
      merges << Sym(x) << " " << Sym(y) << "\n";
    }
    merges.close();
    nlohmann::json vocab_json = nlohmann::json::object();
    for (const auto& [token, id] : vocab) vocab_json[Sym(token)] = id;
    std::ofstream(dir.File("vocab.json")) << vocab_json.dump();
    auto tok = BpeTokenizer::FromVocabAndMerges(dir.File("vocab.json"), dir.File("merges.txt"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (int w = 0; w < 400; ++w) {
      std::string word(1 + rng() % 60, 'a');
      for (char& c : word) c = static_cast<char>('a' + rng() % 3);
      std::vector<int32_t> want;
      for (const std::string& s : ReferenceBpe(word, rank)) want.push_back(vocab.at(s));
      ASSERT_EQ((*tok)->Encode(word), want) << "table " << table << " word " << word;
    }
  }
}

class BpeLoadErrorTest : public ::testing::Test {
 protected:
  nlohmann::json TokenizerJson() {
    TinyBpe::WriteTokenizerJson(dir_.File("t.json"), /*pair_merges=*/false);
    return nlohmann::json::parse(testing::ReadBytes(dir_.File("t.json")));
  }
  absl::Status LoadJson(const nlohmann::json& j) {
    std::ofstream(dir_.File("t.json"), std::ios::trunc) << j.dump();
    return BpeTokenizer::FromTokenizerJson(dir_.File("t.json")).status();
  }

  ScratchDir dir_;
};

TEST_F(BpeLoadErrorTest, RejectsWhatIsNotByteLevelBpe) {
  nlohmann::json j = TokenizerJson();
  j["model"]["type"] = "WordPiece";
  absl::Status s = LoadJson(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.type is \"WordPiece\""));
  EXPECT_THAT(s.message(), HasSubstr("t.json"));

  j = TokenizerJson();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  s = LoadJson(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not ByteLevel"));

  // Llama-3 style: a Sequence that contains ByteLevel is accepted.
  j = TokenizerJson();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}}, {{"type", "ByteLevel"}}}}};
  EXPECT_TRUE(LoadJson(j).ok());

  j = TokenizerJson();
  j["model"]["vocab"].erase(Sym("\n"));
  s = LoadJson(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("byte 0x0a"));
}

TEST_F(BpeLoadErrorTest, NamesTheBadMergeOrVocabEntry) {
  nlohmann::json j = TokenizerJson();
  j["model"]["merges"][3] = "Ġt";
  absl::Status s = LoadJson(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.merges[3]"));

  j = TokenizerJson();
  j["model"]["merges"][5] = "o z";  // "oz" is not in the vocabulary
  s = LoadJson(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.merges[5] (\"o z\"): \"oz\" is not in the vocabulary"));

  j = TokenizerJson();
  j["model"]["vocab"]["duplicate"] = 3;
  s = LoadJson(j);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("id 3 is given to two tokens"));

  TinyBpe::WriteVocabAndMerges(dir_.File("vocab.json"), dir_.File("merges.txt"));
  // Line 17: after the "#version" line and the 15 merges.
  std::ofstream(dir_.File("merges.txt"), std::ios::app) << "h e l\n";
  s = BpeTokenizer::FromVocabAndMerges(dir_.File("vocab.json"), dir_.File("merges.txt")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("merges.txt' line 17: \"h e l\" is not a pair"));

  s = BpeTokenizer::FromVocabAndMerges(dir_.File("vocab.json"), dir_.File("none.txt")).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("none.txt"));
}

}  // namespace
}  // namespace zt
