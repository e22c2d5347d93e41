// 4-bit NormalFloat (NF4) block quantization with double quantization, as QLoRA (Dettmers et
// al., "QLoRA: Efficient Finetuning of Quantized LLMs", 2023) defines it: the storage of a
// frozen base weight that LoRA adapters train on top of (kernels/nf4_linear.h computes with it).
//
// Levels. The 16 NormalFloat values are the quantiles of a standard normal, normalized to
// [−1, 1], with an exact zero: 8 positive quantiles at probabilities linspace(δ, ½, 9)[:-1]
// and 7 negative ones at linspace(δ, ½, 8)[:-1], δ = 0.9677083 ≈ 1 − ½(1/32 + 1/30) (the
// paper's offset, which keeps the outermost quantile finite), all divided by the largest.
// Nf4Levels() holds them as the paper (appendix E) and bitsandbytes publish them, ascending: code 0
// is −1.0, code 7 is 0.0, code 15 is 1.0.
//
// Blocks. The flat tensor (n elements, any n ≥ 1) is cut into blocks of kNf4Block = 64; block b
// has a scale A_b (its absmax), element i stores the code c_i of the level nearest to x_i / A_b
// and reads back as Nf4Levels()[c_i] · A_b. The last block may be partial. Codes are packed two
// per byte, element 2j in the high nibble of byte j and element 2j+1 in the low one (the order
// bitsandbytes uses); an odd n leaves the last low nibble 0.
//
// Absmax formats (Nf4Absmax):
//  - kF32: A_b stored as f32, 32 bits per 64 parameters = 0.5 bits/parameter of overhead.
//  - kDoubleQuantized: the paper's double quantization. The block absmax values a_b are
//    themselves quantized to 8 bits in groups of kNf4AbsmaxGroup = 256 blocks with one f32
//    scale s_g per group: first their mean μ (one f32 for the whole tensor) is subtracted, as
//    the paper does — the absmax values are all positive, so centring them puts the signed
//    8-bit map's both halves to use and halves the step — then each group stores
//    s_g = max |a_b − μ| and the code k_b of the kernels/quantization.h signed dynamic map value
//    nearest to (a_b − μ) / s_g (the map bitsandbytes uses for it). A_b is read back as
//        A_b = fma(DynamicMapSigned()[k_b], s_g, μ)   (f32, one rounding)
//    8/64 + 32/(64·256) = 0.127 bits/parameter of overhead instead of 0.5. The absmax error
//    is absolute within a group — at most half the map's largest gap, 0.007 · s_g — so a
//    block far smaller than its group's largest loses relative precision; the 256 blocks of a
//    group are 16,384 consecutive weights (a few rows), whose scales are alike in practice.
//
//  - kGroupIndexed: a tensor-parallel share of a kDoubleQuantized weight (worker/model/
//    transformer_lora.cc slices it), read back exactly as the whole weight reads back. The
//    share is `rows` rows of `row_blocks` whole blocks each; each share row is one contiguous
//    run of the whole weight's blocks, whose first block's index in the whole weight is
//    block_base[row]. Each block keeps the whole weight's 8-bit code k_b; absmax_scale holds
//    the whole weight's group scales (the groups run along the whole weight's blocks, so a
//    share's consecutive blocks need not share a group) and absmax_offset its μ:
//        A_b = fma(map[k_b], s[(block_base[b / row_blocks] + b mod row_blocks) / 256], μ)
//    8/64 bits/parameter, plus 32 bits per share row and per whole group.
//
// Quantization picks each element's code against the A_b that dequantization will use (the
// double-quantized one when there is one), so every element reads back as the representable
// value nearest to it; bitsandbytes picks against the exact absmax instead, which is never
// closer. Everything is deterministic and independent of the thread count.
#pragma once

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

inline constexpr int64_t kNf4Block = 64;
inline constexpr int64_t kNf4AbsmaxGroup = 256;
// The code of the level 0.0.
inline constexpr uint8_t kNf4ZeroCode = 7;

// The 16 NormalFloat levels, ascending (see above).
const std::array<float, 16>& Nf4Levels();

enum class Nf4Absmax : uint8_t {
  kF32,              // one f32 absmax per block
  kDoubleQuantized,  // 8-bit absmax codes, an f32 scale per 256 blocks and one f32 mean
  kGroupIndexed,     // a share of a kDoubleQuantized weight: its blocks index the group scales
};

// A kGroupIndexed share's shape: `row_blocks` blocks a share row, out of a whole weight of
// `whole_numel` elements (whose group scales the share keeps).
struct Nf4ShareShape {
  int64_t row_blocks = 0;
  int64_t whole_numel = 0;
};

// How many elements of each buffer an NF4 tensor of n elements holds, and the bytes in all.
struct Nf4Layout {
  int64_t numel = 0;
  int64_t code_bytes = 0;     // ceil(n / 2): the packed 4-bit codes
  int64_t blocks = 0;         // ceil(n / 64): absmax values (f32, or u8 codes when doubled)
  int64_t absmax_groups = 0;  // ceil(blocks / 256) when double-quantized (kGroupIndexed: of
                              // the whole weight's blocks), else 0
  int64_t rows = 0;           // kGroupIndexed: blocks / row_blocks share rows, else 0
  int64_t total_bytes = 0;    // every buffer together (the mean's 4 bytes included)
};
// `share` is read for kGroupIndexed only.
Nf4Layout Nf4LayoutFor(int64_t numel, Nf4Absmax format, const Nf4ShareShape& share = {});

// Views of one NF4-quantized tensor's buffers, all on one device; the caller owns the memory
// (sized by Nf4LayoutFor). The logical shape (say [N, K] of a weight) is the caller's: NF4
// blocks run over the flat row-major elements and may cross rows.
struct Nf4Tensor {
  int64_t numel = 0;
  Nf4Absmax format = Nf4Absmax::kDoubleQuantized;
  Tensor codes;          // (code_bytes) u8: the packed 4-bit codes
  Tensor absmax;         // (blocks): f32 for kF32, else u8 dynamic-map codes
  Tensor absmax_scale;   // (absmax_groups) f32 s_g; empty for kF32
  Tensor absmax_offset;  // (1) f32 μ; empty for kF32
  Tensor block_base;     // (rows) i32; kGroupIndexed only, else empty
  Nf4ShareShape share;   // kGroupIndexed only
};

// The buffers match Nf4LayoutFor(t.numel, t.format) in dtype and size and live on the
// context's device; InvalidArgument names the op, the buffer and the rule (numel ≥ 1, the
// absent buffers of a format empty; kGroupIndexed: numel a multiple of 64 · row_blocks, at
// most the whole weight's, block_base itself is not checked element by element).
absl::Status CheckNf4Tensor(const char* op, const char* arg, const Nf4Tensor& t,
                            const DeviceContext& ctx);

struct Nf4QuantizeArgs {
  Tensor src;     // (n) f32, finite: a NaN or inf is refused (it would poison its block)
  Nf4Tensor dst;  // written; dst.numel == n
};
// Fills every buffer of dst (kF32 or kDoubleQuantized: a kGroupIndexed share is sliced from its
// whole weight's quantization, never quantized on its own). CPU: allocates ceil(n / 64) floats of
// host scratch (the exact absmax values), so it is meant for loading weights, outside the step
// loop. InvalidArgument for a non-finite element (naming its index) or mismatched buffers.
absl::Status Nf4Quantize(const DeviceContext& ctx, const Nf4QuantizeArgs& args);

struct Nf4DequantizeArgs {
  Nf4Tensor src;
  Tensor dst;  // (n) f32, written: Nf4Levels()[c_i] · A_b
};
absl::Status Nf4Dequantize(const DeviceContext& ctx, const Nf4DequantizeArgs& args);

}  // namespace zt
