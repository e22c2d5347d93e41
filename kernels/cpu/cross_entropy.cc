// Fused softmax cross-entropy on the CPU, one row per work item.
// Legend: N rows (B·T), V vocabulary.
// Per row: m = max(x); e = exp(x − m), written over the logits when the gradient is wanted;
// S = Σe in double; loss = m + log S − x[target]; dlogits = grad_scale·(e/S − onehot).
// A row of V = 50257 floats (196 KiB) stays in L2 between the three passes. Rows are
// independent and each is summed in one fixed order, so results do not depend on the thread
// count. bf16/f16 logits are converted row by row into a per-thread f32 row, computed exactly
// as f32 logits are, and the gradient is rounded once to the logits' dtype when stored.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/load_store.h"
#include "kernels/cpu/vec_math.h"

namespace zt::cpu {
namespace {

// Max over 16 running lanes held in a GCC/Clang vector type: `a > b ? a : b` is exactly what
// vmaxps computes, but neither a `reduction(max)` loop nor a plain lane array vectorized once
// inlined. The max is exact, so the lane split changes nothing. A NaN logit is skipped here
// and poisons the sum (and the loss) in the next pass instead.
float RowMax(const float* x, int64_t v) {
  using Lanes = float __attribute__((vector_size(64)));
  constexpr int kLanes = 16;
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  Lanes lanes;
  for (int j = 0; j < kLanes; ++j) lanes[j] = kLowest;
  int64_t i = 0;
  for (; i + kLanes <= v; i += kLanes) {
    Lanes xv;
    std::memcpy(&xv, x + i, sizeof(xv));
    lanes = xv > lanes ? xv : lanes;
  }
  float m = kLowest;
  for (; i < v; ++i) m = x[i] > m ? x[i] : m;
  for (int j = 0; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
  return m;
}

// Σ exp(x − m); with `e` non-null, also stores each exp(x − m) there (e may alias x).
double RowExpSum(const float* x, float m, int64_t v, float* e) {
  double sum = 0;
  if (e == nullptr) {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < v; ++i) sum += FastExp(x[i] - m);
  } else {
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < v; ++i) {
      const float ei = FastExp(x[i] - m);
      e[i] = ei;
      sum += ei;
    }
  }
  return sum;
}

}  // namespace

absl::Status SoftmaxCrossEntropy(const DeviceContext& ctx, const CrossEntropyArgs& args) {
  const int64_t n = args.logits.dim(0), v = args.logits.dim(1);
  void* logits = args.logits.raw();  // (N, V)
  const DType dtype = args.logits.dtype();
  const int32_t* targets = args.targets.data<int32_t>();  // (N)
  float* losses = args.losses.data<float>();              // (N)
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] >= v) {
      return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: targets[", r,
                                                     "] = ", targets[r], " is not below V = ", v,
                                                     " (negative targets are ignored)"));
    }
  }
  const float scale = args.grad_scale;
  const bool write_grad = args.write_grad;

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    // A 16-bit row is computed in an f32 copy and its gradient stored back, rounded once.
    float* x = WriteRow(logits, dtype, r * v, v, 0, /*load=*/true);
    const int32_t target = targets[r];
    if (target < 0) {
      losses[r] = 0.0f;
      if (write_grad) {
        std::fill(x, x + v, 0.0f);
        FinishRow(x, v, logits, dtype, r * v);
      }
      continue;
    }
    const float x_target = x[target];
    const float m = RowMax(x, v);
    const double sum = RowExpSum(x, m, v, write_grad ? x : nullptr);
    losses[r] = static_cast<float>(static_cast<double>(m) + std::log(sum) - x_target);
    if (!write_grad) continue;
    const double e_target = x[target];
    const float inv = static_cast<float>(static_cast<double>(scale) / sum);
#pragma omp simd
    for (int64_t i = 0; i < v; ++i) x[i] *= inv;
    // In double: the target's probability is often close to 1, and p − 1 would cancel in f32.
    x[target] = static_cast<float>((e_target / sum - 1.0) * scale);
    FinishRow(x, v, logits, dtype, r * v);
  }
  return absl::OkStatus();
}

void AccumulateMeanLoss(const MeanLossArgs& args) {
  const int32_t* t = args.targets.data<int32_t>();
  const float* l = args.losses.data<float>();
  double sum = 0;
  int64_t valid = 0;
  for (int64_t i = 0; i < args.losses.numel(); ++i) {
    if (t[i] >= 0) {
      sum += l[i];
      ++valid;
    }
  }
  const double mean = valid > 0 ? sum / static_cast<double>(valid) : 0.0;
  *static_cast<double*>(args.sum.raw()) += mean / args.divisor;
}

}  // namespace zt::cpu
