// The small ops LoRA adapters need beside GEMM (Hu et al. 2021; the layer is built in
// worker/model from these and LinearForward/LinearBackward).
//
// Legend: M rows (B·T tokens), N columns of a fused projection's output (q|k|v, gate|up), n the
// columns of one adapted part of it, starting at column c0.
//
// A fused projection's part (Llama's q_proj inside attn.qkv) is a block of columns of its
// (M, N) output: ColumnsCopy gathers one into a dense (M, n) matrix (its output gradient, for
// the adapter's backward) and ColumnsAdd adds a dense (M, n) into one (the adapter's output).
// LoraDropout drops the adapter's input with a mask that is a pure function of (seed, element
// index), so the backward re-applies the same mask from the seed instead of storing it.
//
// Tensors may be f32, bf16 or f16 independently: loaded to f32, computed, rounded once on
// store. CUDA contexts run kernels/cuda/lora.h's twins, bit for bit the CPU's results (no
// sums; the same rounding and the same mask hash).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct ColumnsCopyArgs {
  Tensor src;             // (M, N)
  int64_t col_begin = 0;  // c0, with c0 + n ≤ N
  Tensor dst;             // (M, n), written
};
// dst = src[:, c0 : c0 + n].
absl::Status ColumnsCopy(const DeviceContext& ctx, const ColumnsCopyArgs& args);

struct ColumnsAddArgs {
  Tensor src;             // (M, n)
  Tensor dst;             // (M, N), added to
  int64_t col_begin = 0;  // c0, with c0 + n ≤ N
};
// dst[:, c0 : c0 + n] += src.
absl::Status ColumnsAdd(const DeviceContext& ctx, const ColumnsAddArgs& args);

struct LoraDropoutArgs {
  Tensor inp;      // any shape; (…, n) rows of n when logical_cols > 0
  Tensor out;      // same element count; may alias inp
  float p = 0.0f;  // drop probability in [0, 1)
  uint64_t seed = 0;
  // A column share: inp's rows of n are columns [col_begin, col_begin + n) of a logical (M, logical_cols)
  // matrix (a tensor-parallel rank's input columns of a row-parallel site), and element (m, j)
  // draws the logical element's mask, m · logical_cols + col_begin + j, so the ranks' shares
  // together drop exactly what one rank drops. 0: inp is the whole matrix.
  int64_t logical_cols = 0;
  int64_t col_begin = 0;
};
// out[i] = keep(seed, i) ? inp[i] / (1 − p) : 0, with keep true with probability 1 − p from
// a hash of (seed, i) — i the logical index above: the same mask for any thread count and any
// column split, and in the backward (which applies this same op to the input gradient). p = 0
// copies.
absl::Status LoraDropout(const DeviceContext& ctx, const LoraDropoutArgs& args);

// The mask seed of adapter `adapter` of block `block` under a micro-batch's seed: distinct
// adapters draw independent masks.
uint64_t LoraDropoutSeed(uint64_t seed, int64_t block, int64_t adapter);

// Whether element i survives dropout p under `seed`: the mask LoraDropout applies.
bool LoraDropoutKeeps(uint64_t seed, int64_t i, float p);

}  // namespace zt
