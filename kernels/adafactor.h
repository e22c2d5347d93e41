// Adafactor (Shazeer & Stern, Adafactor: Adaptive Learning Rates with Sublinear Memory Cost,
// 2018, Algorithms 4 and 5) for one tensor, with the conventions and defaults of the widely
// used Hugging Face transformers `Adafactor` (which follows fairseq's).
//
// For a matrix the second moment is factored: one f32 per row and one per column instead of
// one per element, so its state is (rows + cols) · 4 bytes (plus 4 bytes per element with a
// first moment). A vector keeps a full second moment (4 bytes per element).
//
// One step t, with g = grad · grad_scale:
//   β2t = 1 − t^decay_rate
//   matrix: R_i = β2t·R_i + (1 − β2t)·mean_j(g_ij² + eps1)  (over columns)
//           C_j = β2t·C_j + (1 − β2t)·mean_i(g_ij² + eps1)  (over rows)
//           V_ij = R_i·C_j / mean_i(R_i)
//   vector: V_i = β2t·V_i + (1 − β2t)·(g_i² + eps1)
//   U = g / √V;  U /= max(1, RMS(U) / clip_threshold)
//   ρ = relative_step ? min(warmup_init ? 1e-6·t : 1e-2, 1/√t) : lr
//   α = scale_parameter ? max(eps2, RMS(param before the step)) · ρ : ρ
//   with a first moment: m = β1·m + (1 − β1)·α·U, step = m;  without: step = α·U
//   param = param − weight_decay·α·param − step
// Reductions (RMS, means) are accumulated in double over fixed chunks combined in a fixed
// order, so any thread count gives the same bits.
//
// The gradient may be f32, bf16 or f16, and param_copy, stochastic_rounding and seed work as
// in AdamWArgs (kernels/optimizer.h): the updated f32 parameter is also written, rounded, to a
// 16-bit copy, with the stochastic hash's counter the element index within the tensor.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct AdafactorArgs {
  Tensor param;       // (rows, cols) factored, or (n); f32, updated in place. Tensors of more
                      // dimensions are passed as (product of the leading ones, last one).
  Tensor grad;        // param's shape, f32, bf16 or f16
  Tensor row_state;   // (rows) f32, updated: matrices only, empty for vectors
  Tensor col_state;   // (cols) f32, updated: matrices only, empty for vectors
  Tensor full_state;  // (n) f32, updated: vectors only, empty for matrices
  Tensor m;           // param's element count, f32, updated; empty when beta1 is 0
  // The absolute step size; must be 0 with relative_step (the step size is computed then).
  float lr = 0;
  float beta1 = 0;              // in [0, 1); 0 with an empty m means no first moment
  float decay_rate = -0.8f;     // < 0
  float eps1 = 1e-30f;          // > 0, added to g² so that rows or columns of zeros stay finite
  float eps2 = 1e-3f;           // ≥ 0, the least parameter scale with scale_parameter
  float clip_threshold = 1.0f;  // > 0
  // Hugging Face's defaults; its recommendation for fine-tuning is relative_step and
  // scale_parameter false with an explicit lr and warm-up schedule.
  bool relative_step = true;
  bool scale_parameter = true;
  bool warmup_init = false;  // requires relative_step
  float weight_decay = 0;
  int64_t step = 1;                  // 1-based step count
  float grad_scale = 1.0f;           // applied to grad before use
  Tensor param_copy;                 // param's element count, bf16 or f16, or empty
  bool stochastic_rounding = false;  // bf16 param_copy only
  uint64_t seed = 0;                 // of the stochastic rounding
};
absl::Status AdafactorUpdate(const DeviceContext& ctx, const AdafactorArgs& args);

}  // namespace zt
