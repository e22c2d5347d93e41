// Optimizer updates on flat ranges (a unit's parameters, or a rank's shard of them): f32 master
// parameters and states, gradients in f32, bf16 or f16 (loaded to f32).
// Every update reads grad · grad_scale, so gradient clipping and loss-scale removal cost no
// extra pass. Weight decay is decoupled (AdamW): param −= lr · weight_decay · param.
//
// param_copy, when not empty, receives the updated parameter rounded to its dtype (bf16 or
// f16) in the same pass: the model's 16-bit weights. Rounding is to nearest even, or for a
// bf16 copy with stochastic_rounding, up with probability equal to the discarded fraction of
// an ulp, drawn from a hash of (seed, element index within the tensor): deterministic for a
// seed and independent of the thread count. Callers vary the seed per step and per shard.
//
// A split master (every optimizer here takes one): `param` is i16, the low halves of the f32
// master weights, and param_copy the bf16 high halves (SplitMaster in kernels/dtype.h). The
// update joins the halves, updates the exact f32 master and splits it again, so the model's
// bf16 weights are the master rounded to nearest and the master costs 2 bytes beyond them.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct AdamWArgs {
  Tensor param;  // (n) f32, updated in place; or i16, a split master's low halves
  Tensor grad;   // (n) f32, bf16 or f16
  Tensor m;      // (n) f32 first moment, updated
  Tensor v;      // (n) f32 second moment, updated
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0;
  int64_t step = 1;                  // 1-based step count, for bias correction
  float grad_scale = 1.0f;           // applied to grad before use
  Tensor param_copy;                 // (n) bf16 or f16 = the updated param, or empty
  bool stochastic_rounding = false;  // bf16 param_copy only
  uint64_t seed = 0;                 // of the stochastic rounding
};
// m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;
// param −= lr · (m̂ / (√v̂ + ε) + weight_decay · param), m̂ = m/(1−β1^t), v̂ = v/(1−β2^t).
absl::Status AdamWUpdate(const DeviceContext& ctx, const AdamWArgs& args);

struct SgdArgs {
  Tensor param;     // (n) f32, updated in place; or i16, a split master's low halves
  Tensor grad;      // (n) f32, bf16 or f16
  Tensor momentum;  // (n) f32 buffer, or empty when momentum == 0
  float lr = 0;
  float momentum_factor = 0;
  float weight_decay = 0;
  float grad_scale = 1.0f;
  Tensor param_copy;                 // (n) bf16 or f16 = the updated param, or empty
  bool stochastic_rounding = false;  // bf16 param_copy only
  uint64_t seed = 0;                 // of the stochastic rounding
};
// buf = μ·buf + g (buf = g on the first step is the caller's zeroed buffer: μ·0 + g);
// param −= lr · (buf + weight_decay · param)  (PyTorch's SGD with decoupled decay).
absl::Status SgdUpdate(const DeviceContext& ctx, const SgdArgs& args);

}  // namespace zt
