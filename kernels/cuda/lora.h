// CUDA LoRA ops: the twins of kernels/lora.h's ColumnsCopy, ColumnsAdd and LoraDropout,
// called by kernels/lora.cc after it has checked the arguments (the same checks on both
// backends). No sums anywhere, so each result is the CPU's bit for bit: elements are loaded to
// f32 and stored with load_store.h's rounding (kernels/cuda/elementwise_bits.cuh), and the
// dropout mask is the CPU's hash of (seed, logical index) with the same 24-bit keep rule. No
// CUDA header here, so the entry points compile without nvcc.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/lora.h"

namespace zt::cuda {

absl::Status ColumnsCopy(const DeviceContext& ctx, const ColumnsCopyArgs& args);
absl::Status ColumnsAdd(const DeviceContext& ctx, const ColumnsAddArgs& args);
// `n` and `row` are the share's width and its logical row length (1 and 1 for a whole
// matrix), as kernels/lora.cc worked them out; `keep_scale` is 1 / (1 − p) computed there, so
// both backends multiply by the same f32.
absl::Status LoraDropout(const DeviceContext& ctx, const LoraDropoutArgs& args, int64_t n,
                         int64_t row, int64_t col_begin, float keep_scale);

}  // namespace zt::cuda
