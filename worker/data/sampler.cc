#include "worker/data/sampler.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound): draws below 2^64 mod bound are rejected so every residue is
// equally likely.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t r = gen();
    if (r >= threshold) return r % bound;
  }
}

// (a * b) mod m without overflow for any int64 operands in [0, m).
int64_t MulMod(int64_t a, int64_t b, int64_t m) {
  return static_cast<int64_t>((static_cast<__int128>(a) * b) % m);
}

}  // namespace

uint64_t EpochSeed(uint64_t seed, int64_t epoch) {
  return SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(epoch)));
}

std::vector<int64_t> ShuffledOrder(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 gen(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(UniformBelow(gen, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

Sampler::Sampler(const TokenStream* stream, int B, int T, bool shuffle, uint64_t seed)
    : stream_(stream), B_(B), T_(T), shuffle_(shuffle), seed_(seed) {}

absl::Status Sampler::Check() const {
  const std::string& field = stream_->field_label();
  if (B_ < 1 || T_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": micro-batch size B = ", B_, " and sequence length T = ", T_, " must be >= 1"));
  }
  const int64_t need = static_cast<int64_t>(B_) * T_ + 1;
  if (stream_->size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", stream_->size(),
        " tokens are fewer than one micro-batch needs: B*T + 1 = ", B_, "*", T_, " + 1 = ", need));
  }
  return absl::OkStatus();
}

absl::Status Sampler::Fill(int64_t k, int32_t* inputs, int32_t* targets) const {
  absl::Status status = Check();
  if (!status.ok()) return status;
  if (k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(stream_->field_label(), ": micro-batch index ", k, " must be >= 0"));
  }
  return shuffle_ ? FillShuffled(k, inputs, targets) : FillSequential(k, inputs, targets);
}

// One read of B*T tokens into inputs; targets are inputs shifted by one plus the next token,
// so no scratch buffer is needed.
absl::Status Sampler::FillSequential(int64_t k, int32_t* inputs, int32_t* targets) const {
  const int64_t size = stream_->size();
  const int64_t n = static_cast<int64_t>(B_) * T_;
  const int64_t start = MulMod(k % size, n % size, size);
  ZT_RETURN_IF_ERROR(stream_->Read(start, n, inputs));
  std::copy(inputs + 1, inputs + n, targets);
  return stream_->Read(start + n, 1, targets + n - 1);
}

absl::Status Sampler::FillShuffled(int64_t k, int32_t* inputs, int32_t* targets) const {
  const int64_t windows = windows_per_epoch();
  for (int b = 0; b < B_; ++b) {
    // Position k*B + b in the concatenated epochs; k*B stays far from overflow for any
    // run that fits in a lifetime.
    const int64_t position = k * B_ + b;
    const std::shared_ptr<const std::vector<int64_t>> order = Permutation(position / windows);
    const int64_t start = (*order)[position % windows] * T_;
    int32_t* in = inputs + static_cast<int64_t>(b) * T_;
    int32_t* tg = targets + static_cast<int64_t>(b) * T_;
    ZT_RETURN_IF_ERROR(stream_->Read(start, T_, in));
    std::copy(in + 1, in + T_, tg);
    ZT_RETURN_IF_ERROR(stream_->Read(start + T_, 1, tg + T_ - 1));
  }
  return absl::OkStatus();
}

std::shared_ptr<const std::vector<int64_t>> Sampler::Permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const CachedPermutation& slot : cache_) {
    if (slot.epoch == epoch) return slot.order;
  }
  CachedPermutation& slot = cache_[next_slot_];
  next_slot_ = 1 - next_slot_;
  slot.epoch = epoch;
  slot.order = std::make_shared<const std::vector<int64_t>>(
      ShuffledOrder(windows_per_epoch(), EpochSeed(seed_, epoch)));
  return slot.order;
}

int64_t Sampler::windows_per_epoch() const { return T_ < 1 ? 0 : (stream_->size() - 1) / T_; }

int64_t Sampler::tokens_per_epoch() const {
  return shuffle_ ? windows_per_epoch() * T_ : stream_->size();
}

}  // namespace zt
