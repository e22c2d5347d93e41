// CUDA block-wise quantization, bit-exact with the CPU: codes and absmax are the same bytes.
// Quantize: one thread block per quantization block; absmax = max |x| (max is exact, so its
// order does not matter), then code = the count of the CPU's thresholds below the f32
// quotient x / absmax (IEEE division: device code is built without fast math), a block
// whose absmax is 0 getting the code of 0.0 everywhere. Dequantize: one thread per element,
// map[code] · absmax, one f32 product as on the CPU.
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/norm_reduce.cuh"
#include "kernels/cuda/quant_map.cuh"
#include "kernels/cuda/quantization.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void QuantizeKernel(const float* src, uint8_t* codes, float* absmax, int64_t n,
                               int64_t block, QuantMap map, uint8_t zero_code) {
  __shared__ QuantMap s;
  __shared__ float scratch[32];
  LoadQuantMap(map, s);
  const int64_t begin = blockIdx.x * block;
  const int64_t len = n - begin < block ? n - begin : block;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) amax = fmaxf(amax, fabsf(src[begin + i]));
  amax = BlockMax(amax, scratch);  // its barriers also publish the shared map
  if (threadIdx.x == 0) absmax[blockIdx.x] = amax;
  for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
    codes[begin + i] = amax == 0.0f ? zero_code : QuotientCode(s, src[begin + i], amax);
  }
}

__global__ void DequantizeKernel(const uint8_t* codes, const float* absmax, float* dst, int64_t n,
                                 int64_t block, QuantMap map) {
  __shared__ float values[256];
  for (int k = threadIdx.x; k < 256; k += blockDim.x) values[k] = map.values[k];
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = values[codes[i]] * absmax[i / block];
  }
}

}  // namespace

absl::Status BlockQuantize(const DeviceContext& ctx, const BlockQuantizeArgs& args) {
  const int64_t n = args.src.numel();
  if (n == 0) return absl::OkStatus();
  const int64_t blocks = NumQuantBlocks(n, args.block);
  QuantizeKernel<<<static_cast<unsigned int>(blocks), kThreads, 0, StreamOf(ctx)>>>(
      args.src.data<float>(), args.codes.data<uint8_t>(), args.absmax.data<float>(), n, args.block,
      QuantMapOf(args.map), cpu::ZeroCode(args.map));
  return LaunchStatus("BlockQuantize");
}

absl::Status BlockDequantize(const DeviceContext& ctx, const BlockDequantizeArgs& args) {
  const int64_t n = args.dst.numel();
  if (n == 0) return absl::OkStatus();
  DequantizeKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      args.codes.data<uint8_t>(), args.absmax.data<float>(), args.dst.data<float>(), n, args.block,
      QuantMapOf(args.map));
  return LaunchStatus("BlockDequantize");
}

}  // namespace zt::cuda
