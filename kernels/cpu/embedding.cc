// Token and position embedding on the CPU.
// Legend: B batch, T sequence, C channels, V vocabulary.
// Forward parallelizes over the B·T output rows. Backward is a scatter-add, where two
// positions with the same token hit the same dwte row: it parallelizes over blocks of
// channels instead, and each block walks the positions in order, so every dwte element is
// summed by one thread in one fixed order whatever the thread count (no atomics).
#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace zt::cpu {
namespace {

// Channels one backward work item owns: 256 bytes of a row, and C = 768 still splits into
// 12 items for the threads to share.
constexpr int64_t kChannelBlock = 64;

absl::Status CheckTokens(const char* op, const int32_t* tokens, int64_t b, int64_t t, int64_t v) {
  for (int64_t i = 0; i < b * t; ++i) {
    if (tokens[i] < 0 || tokens[i] >= v) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": tokens[", i / t, ", ", i % t, "] = ", tokens[i], " is outside [0, ", v, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args) {
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1);
  const int64_t v = args.wte.dim(0), c = args.wte.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  if (absl::Status s = CheckTokens("EmbeddingForward", tokens, b, t, v); !s.ok()) return s;
  const float* wte = args.wte.data<float>();                               // (V, C)
  const float* wpe = args.wpe.empty() ? nullptr : args.wpe.data<float>();  // (P, C)
  float* out = args.out.data<float>();                                     // (B, T, C)

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t bt = 0; bt < b * t; ++bt) {
    const float* tok_row = wte + tokens[bt] * c;
    float* out_row = out + bt * c;
    if (wpe == nullptr) {
      std::copy(tok_row, tok_row + c, out_row);
    } else {
      const float* pos_row = wpe + (bt % t) * c;
#pragma omp simd
      for (int64_t i = 0; i < c; ++i) out_row[i] = tok_row[i] + pos_row[i];
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args) {
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1);
  const int64_t v = args.dwte.dim(0), c = args.dwte.dim(1);
  const int32_t* tokens = args.tokens.data<int32_t>();
  if (absl::Status s = CheckTokens("EmbeddingBackward", tokens, b, t, v); !s.ok()) return s;
  const float* dout = args.dout.data<float>();                          // (B, T, C)
  float* dwte = args.dwte.data<float>();                                // (V, C) +=
  float* dwpe = args.dwpe.empty() ? nullptr : args.dwpe.data<float>();  // (P, C) +=
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kChannelBlock;
    const int64_t n = std::min(kChannelBlock, c - c0);
    for (int64_t bt = 0; bt < b * t; ++bt) {
      const float* src = dout + bt * c + c0;
      float* dst = dwte + tokens[bt] * c + c0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    }
    if (dwpe == nullptr) continue;
    for (int64_t bt = 0; bt < b * t; ++bt) {
      const float* src = dout + bt * c + c0;
      float* dst = dwpe + (bt % t) * c + c0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    }
  }
  return absl::OkStatus();
}

}  // namespace zt::cpu
