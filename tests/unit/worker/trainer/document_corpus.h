// The document shards the packed-data tests train on (`zt prepare --format jsonl`'s output:
// a token shard and its document index): 200 documents of 2..max_length tokens over a
// vocabulary of 32, each an arithmetic progression (something to learn), with prompts of
// 0..length − 1 tokens whose targets do not count.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/document_index.h"
#include "worker/data/token_shard.h"

namespace zt::testing {

// Writes the shard at `path` (and its index beside it). `all_prompt`: every document is prompt
// from end to end (nothing counted).
inline void WriteDocumentShard(const std::string& path, int max_length, bool all_prompt = false) {
  std::mt19937 rng(11);
  std::vector<int32_t> tokens;
  DocumentIndex index;
  for (int d = 0; d < 200; ++d) {
    const int length = 2 + static_cast<int>(rng() % (max_length - 1));
    const int32_t stride = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t first = static_cast<int32_t>(rng() % 32);
    for (int i = 0; i < length; ++i) tokens.push_back((first + i * stride) % 32);
    const auto prompt = all_prompt ? length : static_cast<int>(rng() % length);
    index.documents.push_back(
        {.length = static_cast<uint32_t>(length), .prompt_length = static_cast<uint32_t>(prompt)});
  }
  EXPECT_TRUE(WriteTokenShard(path, tokens, 32).ok());
  EXPECT_TRUE(WriteDocumentIndex(path + kDocumentIndexSuffix, index).ok());
}

}  // namespace zt::testing
