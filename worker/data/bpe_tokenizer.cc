#include "worker/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/read_file.h"

namespace zt {
namespace {

// GPT-2's pre-tokenizer (openai/gpt-2 encoder.py): contractions, letter runs, digit runs and
// punctuation runs, each with at most one leading space; whitespace that is not followed by
// a non-space, then any remaining whitespace.
constexpr char kGpt2Pattern[] =
    R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)re";

// Pieces longer than this are rare (long runs of one class) and not worth caching.
constexpr size_t kMaxCachedWordBytes = 256;
// Bounds the cache's memory on a large corpus; cleared wholesale when reached.
constexpr size_t kMaxCachedWords = 1 << 20;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes
// to U+0100.. in byte order, so every byte is a visible, non-space character.
std::array<int, 256> BytesToCodepoints() {
  std::array<int, 256> cp{};
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

void AppendUtf8(int cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Maps a vocabulary entry back to bytes through the inverse alphabet. Entries with a
// character outside the alphabet (added tokens written in plain text) decode to themselves.
std::string TokenToBytes(const std::string& token, const std::array<int, 512>& cp_to_byte) {
  std::string bytes;
  size_t i = 0;
  while (i < token.size()) {
    const auto c = static_cast<unsigned char>(token[i]);
    int cp = -1;
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F);
      len = 2;
    }
    if (cp < 0 || cp >= static_cast<int>(cp_to_byte.size()) || cp_to_byte[cp] < 0) {
      return token;
    }
    bytes.push_back(static_cast<char>(cp_to_byte[cp]));
    i += len;
  }
  return bytes;
}

bool IsByteLevel(const nlohmann::json& pre) {
  if (!pre.is_object()) return false;
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") return true;
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    for (const auto& p : pre["pretokenizers"]) {
      if (IsByteLevel(p)) return true;
    }
  }
  return false;
}

// "a b" -> {"a", "b"}; false unless exactly one space separates two non-empty symbols
// (the byte-level alphabet has no space, so a symbol never contains one).
bool SplitMerge(std::string_view line, std::pair<std::string, std::string>* out) {
  const size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
      line.find(' ', space + 1) != std::string_view::npos) {
    return false;
  }
  out->first = std::string(line.substr(0, space));
  out->second = std::string(line.substr(space + 1));
  return true;
}

absl::StatusOr<nlohmann::json> ParseJson(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON: ", e.what()));
  }
}

// Reads a JSON object of token -> id.
absl::Status ReadVocab(const nlohmann::json& vocab, const std::string& where,
                       std::string_view field, std::vector<std::pair<std::string, int64_t>>* out) {
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", std::string(field), " must be an object of token -> id"));
  }
  out->reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", std::string(field), "[\"", token, "\"] must be an integer id"));
    }
    out->emplace_back(token, id.get<int64_t>());
  }
  return absl::OkStatus();
}

}  // namespace

struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ~Regex() {
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    if (context != nullptr) pcre2_match_context_free(context);
    if (match != nullptr) pcre2_match_data_free(match);
    if (code != nullptr) pcre2_code_free(code);
  }
};

BpeTokenizer::BpeTokenizer() = default;
BpeTokenizer::~BpeTokenizer() = default;

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromTokenizerJson(
    const std::string& path) {
  const std::string where = absl::StrCat("tokenizer '", path, "'");
  ZT_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, "tokenizer"));
  ZT_ASSIGN_OR_RETURN(nlohmann::json j, ParseJson(text, where));
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::pair<std::string, int64_t>> added;
  try {
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": not a tokenizer.json (no \"model\" object)"));
    }
    const nlohmann::json& model = j["model"];
    if (model.contains("type") && model["type"] != "BPE") {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": model.type is ", model["type"].dump(), "; only \"BPE\" is supported"));
    }
    const nlohmann::json pre = j.value("pre_tokenizer", nlohmann::json());
    if (!IsByteLevel(pre)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": pre_tokenizer ", pre.dump(),
                       " is not ByteLevel; only byte-level BPE (GPT-2 style) is supported"));
    }
    if (!model.contains("vocab") || !model.contains("merges") || !model["merges"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": model needs a \"vocab\" object and a \"merges\" array"));
    }
    ZT_RETURN_IF_ERROR(ReadVocab(model["vocab"], where, "model.vocab", &vocab));
    const nlohmann::json& m = model["merges"];
    merges.resize(m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      bool ok = false;
      if (m[i].is_string()) {
        ok = SplitMerge(m[i].get_ref<const std::string&>(), &merges[i]);
      } else if (m[i].is_array() && m[i].size() == 2 && m[i][0].is_string() &&
                 m[i][1].is_string()) {
        merges[i] = {m[i][0].get<std::string>(), m[i][1].get<std::string>()};
        ok = !merges[i].first.empty() && !merges[i].second.empty();
      }
      if (!ok) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": model.merges[", i, "] is ",
                                                       m[i].dump(),
                                                       "; expected \"a b\" or [\"a\", \"b\"]"));
      }
    }
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      const nlohmann::json& a = j["added_tokens"];
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].is_object() || !a[i].contains("id") || !a[i]["id"].is_number_integer() ||
            !a[i].contains("content") || !a[i]["content"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": added_tokens[", i, "] needs an integer \"id\" and a string \"content\""));
        }
        added.emplace_back(a[i]["content"].get<std::string>(), a[i]["id"].get<int64_t>());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", e.what()));
  }
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  ZT_RETURN_IF_ERROR(tok->Build(
      vocab, merges, [](size_t i) { return absl::StrCat("model.merges[", i, "]"); }, added, where));
  return tok;
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromVocabAndMerges(
    const std::string& vocab_path, const std::string& merges_path) {
  const std::string vocab_where = absl::StrCat("vocab '", vocab_path, "'");
  ZT_ASSIGN_OR_RETURN(std::string vocab_text, ReadFileToString(vocab_path, "vocab"));
  ZT_ASSIGN_OR_RETURN(nlohmann::json vocab_json, ParseJson(vocab_text, vocab_where));
  std::vector<std::pair<std::string, int64_t>> vocab;
  try {
    ZT_RETURN_IF_ERROR(ReadVocab(vocab_json, vocab_where, "the vocabulary", &vocab));
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(vocab_where, ": ", e.what()));
  }

  const std::string merges_where = absl::StrCat("merges '", merges_path, "'");
  ZT_ASSIGN_OR_RETURN(std::string merges_text, ReadFileToString(merges_path, "merges"));
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<int> line_of;  // 1-based line number of each merge, for errors
  size_t begin = 0;
  for (int line_no = 1; begin < merges_text.size(); ++line_no) {
    size_t end = merges_text.find('\n', begin);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    std::pair<std::string, std::string> merge;
    if (!SplitMerge(line, &merge)) {
      return absl::InvalidArgumentError(absl::StrCat(
          merges_where, " line ", line_no, ": \"", std::string(line), "\" is not a pair \"a b\""));
    }
    merges.push_back(std::move(merge));
    line_of.push_back(line_no);
  }
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  ZT_RETURN_IF_ERROR(tok->Build(
      vocab, merges, [&](size_t i) { return absl::StrCat(merges_where, " line ", line_of[i]); }, {},
      vocab_where));
  return tok;
}

absl::Status BpeTokenizer::Build(const std::vector<std::pair<std::string, int64_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::function<std::string(size_t)>& merge_label,
                                 const std::vector<std::pair<std::string, int64_t>>& added,
                                 const std::string& where) {
  absl::flat_hash_map<std::string, int32_t> token_to_id;
  token_to_id.reserve(vocab.size() + added.size());
  int64_t max_id = -1;
  for (const auto* list : {&vocab, &added}) {
    for (const auto& [token, id] : *list) {
      if (id < 0 || id >= INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": token \"", token, "\" has id ", id, " outside [0, 2^31 - 1)"));
      }
      max_id = std::max(max_id, id);
    }
  }
  if (max_id < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": empty vocabulary"));
  id_to_bytes_.assign(max_id + 1, std::string());
  id_present_.assign(max_id + 1, false);

  const std::array<int, 256> byte_cp = BytesToCodepoints();
  std::array<int, 512> cp_to_byte;
  cp_to_byte.fill(-1);
  for (int b = 0; b < 256; ++b) cp_to_byte[byte_cp[b]] = b;

  for (const auto& [token, id] : vocab) {
    if (id_present_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": id ", id, " is given to two tokens (\"", token, "\" is the second)"));
    }
    id_present_[id] = true;
    id_to_bytes_[id] = TokenToBytes(token, cp_to_byte);
    token_to_id.emplace(token, static_cast<int32_t>(id));
  }
  // Added tokens usually repeat a vocabulary entry (GPT-2's "<|endoftext|>"); new ones
  // decode to their literal content.
  for (const auto& [content, id] : added) {
    if (!id_present_[id]) {
      id_present_[id] = true;
      id_to_bytes_[id] = content;
    }
    token_to_id.emplace(content, static_cast<int32_t>(id));
  }

  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    AppendUtf8(byte_cp[b], &symbol);
    auto it = token_to_id.find(symbol);
    if (it == token_to_id.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the vocabulary lacks \"%s\", the byte-level symbol of byte 0x%02x; only "
          "byte-level BPE vocabularies (all 256 byte symbols) are supported",
          where, symbol, b));
    }
    byte_id_[b] = it->second;
  }

  merges_.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    auto ia = token_to_id.find(a);
    auto ib = token_to_id.find(b);
    auto im = token_to_id.find(a + b);
    if (ia == token_to_id.end() || ib == token_to_id.end() || im == token_to_id.end()) {
      const std::string& missing =
          ia == token_to_id.end() ? a : (ib == token_to_id.end() ? b : a + b);
      return absl::InvalidArgumentError(absl::StrCat(merge_label(i), " (\"", a, " ", b, "\"): \"",
                                                     missing, "\" is not in the vocabulary"));
    }
    // A repeated pair keeps its first rank (real merges files never repeat one).
    merges_.try_emplace(PairKey(ia->second, ib->second),
                        Merge{static_cast<int32_t>(i), im->second});
  }

  if (auto it = token_to_id.find("<|endoftext|>"); it != token_to_id.end()) {
    end_of_text_ = it->second;
  }

  regex_ = std::make_unique<Regex>();
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                               &error_offset, nullptr);
  if (regex_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InternalError(absl::StrCat("compiling the GPT-2 pre-tokenizer regex: ",
                                            reinterpret_cast<const char*>(message)));
  }
  // JIT is an optimization only: without it pcre2_match interprets the same pattern.
  pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);
  regex_->match = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  regex_->context = pcre2_match_context_create(nullptr);
  // The default 32 KiB JIT stack can run out on long whitespace runs ("\s+(?!\S)" backtracks).
  regex_->jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  if (regex_->match == nullptr || regex_->context == nullptr || regex_->jit_stack == nullptr) {
    return absl::ResourceExhaustedError("allocating PCRE2 match buffers");
  }
  pcre2_jit_stack_assign(regex_->context, nullptr, regex_->jit_stack);
  return absl::OkStatus();
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  std::lock_guard<std::mutex> lock(mu_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc =
        pcre2_match(regex_->code, subject, text.size(), pos, 0, regex_->match, regex_->context);
    // No match means the rest holds no valid UTF-8 character; an error (a resource limit)
    // is handled the same way, so Encode stays lossless whatever happens.
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(regex_->match);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end <= start) break;  // every alternative consumes a character; never taken
    if (start > pos) EncodeWord(text.substr(pos, start - pos), &out);
    EncodeWord(text.substr(start, end - start), &out);
    pos = end;
  }
  if (pos < text.size()) EncodeWord(text.substr(pos), &out);
  return out;
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.size() == 1) {
    out->push_back(byte_id_[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (word.size() > kMaxCachedWordBytes) {
    MergeWord(word, out);
    return;
  }
  // Debian's Abseil has its own string_view type; the cache looks words up through it.
  if (auto it = cache_.find(absl::string_view(word.data(), word.size())); it != cache_.end()) {
    out->insert(out->end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> ids;
  MergeWord(word, &ids);
  out->insert(out->end(), ids.begin(), ids.end());
  if (cache_.size() >= kMaxCachedWords) cache_.clear();
  cache_.emplace(std::string(word), std::move(ids));
}

// Merges with a min-heap of candidate pairs keyed by (rank, position): the lowest rank
// first and, among equal ranks, the leftmost, which is the order GPT-2's loop produces,
// in O(n log n) instead of its O(n^2) on long pieces. A merge only changes symbols, never
// reverts one, so a heap entry whose two symbols still match is current; stale ones are
// skipped when popped.
void BpeTokenizer::MergeWord(std::string_view word, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t left;
    int32_t right;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_id_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges_.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) {
      heap.push({it->second.rank, pos, symbols[pos].id, symbols[next].id, it->second.merged});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[c.pos];
    if (left.id != c.left || left.next < 0 || symbols[left.next].id != c.right) continue;
    Symbol& right = symbols[left.next];
    left.id = c.merged;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.pos;
    right.id = -1;
    push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

std::string BpeTokenizer::Decode(absl::Span<const int32_t> tokens) const {
  std::string text;
  for (int32_t t : tokens) {
    if (t >= 0 && t < vocab_size() && id_present_[t]) {
      text += id_to_bytes_[t];
    } else {
      text += "\xEF\xBF\xBD";
    }
  }
  return text;
}

}  // namespace zt
