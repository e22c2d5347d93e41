// CUDA frozen NF4 linear layer. Per tile: a dequantization kernel writes the f32 tile, the
// cuBLASLt GEMM (cuda::Gemm) multiplies it in, and a store kernel adds the bias (forward) or
// the previous dinp (backward, kAdd) and rounds once into the output's dtype. All on
// ctx.stream; nothing synchronizes.
#include <cstdint>

#include "kernels/cpu/nf4.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/nf4_linear.h"
#include "kernels/quantization.h"
#include "kernels/status_macros.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

// The tables a kernel reads with data-dependent indices: the 16 levels and the signed dynamic
// map of the double-quantized absmax, handed over by value from the CPU's own arrays.
struct Nf4Tables {
  float levels[16];
  float map[256];
};

Nf4Tables TablesOf() {
  Nf4Tables t;
  for (int k = 0; k < 16; ++k) t.levels[k] = Nf4Levels()[k];
  for (int k = 0; k < 256; ++k) t.map[k] = DynamicMapSigned()[k];
  return t;
}

// The device pointers of an Nf4Tensor.
struct Nf4Ptrs {
  const uint8_t* codes;
  const uint8_t* absmax_codes;  // kDoubleQuantized, kGroupIndexed
  const float* absmax_f32;      // kF32
  const float* scale;
  const float* offset;
  const int32_t* block_base;  // kGroupIndexed, else null
  int64_t row_blocks;         // kGroupIndexed
};

Nf4Ptrs PtrsOf(const Nf4Tensor& t) {
  const bool dq = t.format != Nf4Absmax::kF32;
  const bool indexed = t.format == Nf4Absmax::kGroupIndexed;
  return {.codes = t.codes.data<uint8_t>(),
          .absmax_codes = dq ? t.absmax.data<uint8_t>() : nullptr,
          .absmax_f32 = dq ? nullptr : t.absmax.data<float>(),
          .scale = dq ? t.absmax_scale.data<float>() : nullptr,
          .offset = dq ? t.absmax_offset.data<float>() : nullptr,
          .block_base = indexed ? t.block_base.data<int32_t>() : nullptr,
          .row_blocks = indexed ? t.share.row_blocks : 0};
}

// dst[r][c] (row stride ld) = element (r0 + r, c0 + c) of W viewed as (·, cols), for r < rows
// and c < width: Nf4Levels()[code] · A_b with A_b = fma(map[k_b], s_g, μ) (g of b's whole-weight
// block for kGroupIndexed) or the f32 absmax —
// the operations cpu::Nf4DequantizeTile performs, so the tiles agree bit for bit.
__global__ void DequantizeTileKernel(Nf4Ptrs w, Nf4Tables tables, int64_t cols, int64_t r0,
                                     int64_t rows, int64_t c0, int64_t width, float* dst,
                                     int64_t ld) {
  __shared__ Nf4Tables s;
  for (int k = threadIdx.x; k < 16; k += blockDim.x) s.levels[k] = tables.levels[k];
  for (int k = threadIdx.x; k < 256; k += blockDim.x) s.map[k] = tables.map[k];
  __syncthreads();
  const int64_t total = rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    const int64_t e = (r0 + r) * cols + c0 + c;
    const int64_t b = e / kNf4Block;
    // The group of the whole weight's block that b is (kGroupIndexed), or of b.
    const int64_t whole_block =
        w.block_base != nullptr ? w.block_base[b / w.row_blocks] + b % w.row_blocks : b;
    const float scale =
        w.absmax_codes != nullptr
            ? fmaf(s.map[w.absmax_codes[b]], w.scale[whole_block / kNf4AbsmaxGroup], w.offset[0])
            : w.absmax_f32[b];
    const uint8_t byte = w.codes[e >> 1];
    const uint8_t code = (e & 1) != 0 ? (byte & 0x0F) : (byte >> 4);
    dst[r * ld + c] = __fmul_rn(s.levels[code], scale);
  }
}

// x rounded to `dtype` and widened back (the bias as its value in out's dtype).
__device__ __forceinline__ float RoundedTo(DType dtype, float x) {
  switch (dtype) {
    case DType::kBF16:
      return __bfloat162float(__float2bfloat16_rn(x));
    case DType::kF16:
      return __half2float(__float2half_rn(x));
    default:
      return x;
  }
}

// out[m, n0 + j] = result[m, j] + bias[n0 + j], for the (m_rows, width) result of one tile.
__global__ void StoreForwardKernel(const float* result, int64_t m_rows, int64_t width, int64_t n0,
                                   int64_t n, FloatPtr bias, bool has_bias, FloatPtr out) {
  const int64_t total = m_rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / width, j = i % width;
    float v = result[i];
    if (has_bias) v += RoundedTo(out.dtype, bias.Load(n0 + j));
    out.Store(m * n + n0 + j, v);
  }
}

// dinp[m, k0 + j] = (or +=) result[m, j].
__global__ void StoreBackwardKernel(const float* result, int64_t m_rows, int64_t width, int64_t k0,
                                    int64_t k, bool add, FloatPtr dinp) {
  const int64_t total = m_rows * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / width, j = i % width;
    const int64_t at = m * k + k0 + j;
    dinp.Store(at, add ? dinp.Load(at) + result[i] : result[i]);
  }
}

}  // namespace

absl::Status Nf4LinearForward(const cpu::Nf4LinearScratch& s, const cpu::Nf4LinearDims& d,
                              const Nf4LinearForwardArgs& args) {
  constexpr const char* kOp = "Nf4LinearForward";
  const DeviceContext& ctx = s.gemm_ctx;
  const Nf4Ptrs w = PtrsOf(args.weight);
  const Nf4Tables tables = TablesOf();
  for (int64_t n0 = 0; n0 < d.n; n0 += kNf4LinearTile) {
    const int64_t nt = d.n - n0 < kNf4LinearTile ? d.n - n0 : kNf4LinearTile;
    DequantizeTileKernel<<<GridFor(nt * d.k, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        w, tables, d.k, n0, nt, 0, d.k, s.tile, d.k);
    ZT_RETURN_IF_ERROR(LaunchStatus(kOp));
    // result (M, nt) = inp (M, K) · tileᵀ
    ZT_RETURN_IF_ERROR(cuda::Gemm(ctx, args.inp, Tensor(s.tile, DType::kF32, {nt, d.k}, ctx.device),
                                  Tensor(s.result, DType::kF32, {d.m, nt}, ctx.device),
                                  {.trans_b = Transpose::kYes}));
    if (d.m == 0) continue;
    StoreForwardKernel<<<GridFor(d.m * nt, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        s.result, d.m, nt, n0, d.n, AsFloatPtr(args.bias), !args.bias.empty(),
        AsFloatPtr(args.out));
    ZT_RETURN_IF_ERROR(LaunchStatus(kOp));
  }
  return absl::OkStatus();
}

absl::Status Nf4LinearBackward(const cpu::Nf4LinearScratch& s, const cpu::Nf4LinearDims& d,
                               const Nf4LinearBackwardArgs& args) {
  constexpr const char* kOp = "Nf4LinearBackward";
  const DeviceContext& ctx = s.gemm_ctx;
  const Nf4Ptrs w = PtrsOf(args.weight);
  const Nf4Tables tables = TablesOf();
  const bool add = args.dinp_mode == Accumulate::kAdd;
  for (int64_t k0 = 0; k0 < d.k; k0 += kNf4LinearTile) {
    const int64_t kt = d.k - k0 < kNf4LinearTile ? d.k - k0 : kNf4LinearTile;
    DequantizeTileKernel<<<GridFor(d.n * kt, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        w, tables, d.k, 0, d.n, k0, kt, s.tile, kt);
    ZT_RETURN_IF_ERROR(LaunchStatus(kOp));
    // result (M, kt) = dout (M, N) · tile (N, kt)
    ZT_RETURN_IF_ERROR(cuda::Gemm(ctx, args.dout,
                                  Tensor(s.tile, DType::kF32, {d.n, kt}, ctx.device),
                                  Tensor(s.result, DType::kF32, {d.m, kt}, ctx.device), {}));
    if (d.m == 0) continue;
    StoreBackwardKernel<<<GridFor(d.m * kt, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        s.result, d.m, kt, k0, d.k, add, AsFloatPtr(args.dinp));
    ZT_RETURN_IF_ERROR(LaunchStatus(kOp));
  }
  return absl::OkStatus();
}

}  // namespace zt::cuda
