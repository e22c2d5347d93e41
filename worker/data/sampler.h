// Sampler: which tokens form training micro-batch k.
//
// B = sequences per micro-batch, T = tokens per sequence. A micro-batch is B x T input ids
// and the B x T target ids (each input's next token). The sampler is a pure function of k
// (and its construction arguments): a resumed run continues at its saved k, and data-parallel
// rank r of R reads global micro-batch k * R + r, with no state to carry or share.
//
// Sequential (llm.c's loader): micro-batch k reads the B*T + 1 contiguous tokens starting at
// stream index (k * B * T) mod size, wrapping at the stream's end; inputs are the first
// B*T, targets the same shifted by one.
//
// Shuffled: the stream is cut into W = (size - 1) / T windows of T + 1 tokens, window w
// starting at w * T (consecutive windows share one token). Epoch e visits the windows in the
// order ShuffledOrder(W, EpochSeed(seed, e)); the epochs' orders are concatenated and
// micro-batch k takes positions k*B ... k*B + B - 1 of that sequence, one window per row.
//
// Thread-safe: Fill may be called concurrently (a small permutation cache is locked).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "worker/data/token_stream.h"

namespace zt {

// The seed of epoch `epoch`'s permutation: a SplitMix64 hash of (seed, epoch), so nearby
// seeds and epochs give unrelated permutations.
uint64_t EpochSeed(uint64_t seed, int64_t epoch);

// A permutation of 0..n-1: Fisher-Yates driven by std::mt19937_64(seed) with unbiased
// rejection sampling. Both are fully specified, so the order is the same on every platform
// and compiler (std::shuffle and std::uniform_int_distribution are not).
std::vector<int64_t> ShuffledOrder(int64_t n, uint64_t seed);

class Sampler {
 public:
  // `stream` must outlive the sampler. B and T are validated by Check(), not here.
  Sampler(const TokenStream* stream, int B, int T, bool shuffle, uint64_t seed);

  // InvalidArgument when B or T is < 1, or when the stream is shorter than one micro-batch
  // (B*T + 1 tokens), naming the stream's field and both counts.
  absl::Status Check() const;

  // Writes micro-batch k (k >= 0) into inputs and targets, each B*T ids, row-major (B, T).
  // Returns Check()'s error, InvalidArgument for a negative k, or the stream's error when a
  // shard cannot be mapped.
  absl::Status Fill(int64_t k, int32_t* inputs, int32_t* targets) const;

  // Input tokens in one pass over the data: size() when sequential, W*T when shuffled.
  int64_t tokens_per_epoch() const;
  // Windows per epoch when shuffled, W = (size - 1) / T.
  int64_t windows_per_epoch() const;

  int B() const { return B_; }
  int T() const { return T_; }

 private:
  absl::Status FillSequential(int64_t k, int32_t* inputs, int32_t* targets) const;
  absl::Status FillShuffled(int64_t k, int32_t* inputs, int32_t* targets) const;
  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch) const;

  const TokenStream* stream_;
  int B_;
  int T_;
  bool shuffle_;
  uint64_t seed_;

  // A micro-batch spans at most two epochs (W >= B), so two cached permutations suffice.
  struct CachedPermutation {
    int64_t epoch = -1;
    std::shared_ptr<const std::vector<int64_t>> order;
  };
  mutable std::mutex mu_;
  mutable CachedPermutation cache_[2];  // guarded by mu_
  mutable int next_slot_ = 0;           // guarded by mu_
};

}  // namespace zt
