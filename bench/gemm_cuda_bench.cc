// cuBLASLt GEMM throughput (zt::Gemm on a CUDA context) for GPT-2 124M's linear layers at
// B·T = 16384 tokens, bf16 in and out with fp32 accumulation, as the model runs them: the
// forward out = inp · weightᵀ, and the backward's dinp = dout · weight and dweight +=
// doutᵀ · inp. Prints milliseconds and TFLOP/s (2·M·N·K flops) per GEMM; without a GPU it
// prints why and exits 0.
//
// Usage: gemm_cuda_bench [iterations]   (default 20, after 3 warm-up calls)
#include <cstdio>
#include <cstdlib>

#if ZT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/linear.h"
#include "kernels/tensor.h"

namespace {

using zt::DType;
using zt::Tensor;
using zt::Transpose;

constexpr int64_t kTokens = 16384;  // B·T: 16 × 1024

struct Layer {
  const char* name;
  int64_t k;  // inputs
  int64_t n;  // outputs
};

// GPT-2 124M (d 768, 4·d MLP, padded vocab 50304).
constexpr Layer kLayers[] = {{"attn qkv", 768, 2304},
                             {"attn proj", 768, 768},
                             {"mlp fc", 768, 3072},
                             {"mlp proj", 3072, 768},
                             {"lm head", 768, 50304}};

// A device bf16 matrix of random values in [-1, 1); freed by the caller.
void* RandomBf16(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> host(static_cast<size_t>(count));
  for (uint16_t& h : host) h = zt::FloatToBf16(dist(rng));
  void* device = nullptr;
  if (cudaMalloc(&device, host.size() * 2) != cudaSuccess) return nullptr;
  cudaMemcpy(device, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
  return device;
}

// Milliseconds per call of `gemm` over `iterations` calls, after 3 warm-up calls; -1 on error.
template <typename F>
double TimeMs(cudaStream_t stream, int iterations, F gemm) {
  for (int i = 0; i < 3; ++i) {
    if (absl::Status s = gemm(); !s.ok()) {
      std::printf("  error: %s\n", std::string(s.message()).c_str());
      return -1;
    }
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int i = 0; i < iterations; ++i) (void)gemm();
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / iterations;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("gemm_cuda_bench: skipped: no usable CUDA device (cudaGetDeviceCount: %s, %d)\n",
                cudaGetErrorString(e), count);
    return 0;
  }
  cudaSetDevice(0);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::printf(
      "gemm_cuda_bench: %s, bf16 x bf16 -> bf16, fp32 accumulation, M = %ld tokens, "
      "%d iterations\n",
      prop.name, static_cast<long>(kTokens), iterations);
  std::printf("%-10s %-8s %6s %6s %6s %9s %9s\n", "layer", "gemm", "M", "N", "K", "ms", "TFLOP/s");
  const zt::Device gpu{.kind = zt::DeviceKind::kCuda, .index = 0};
  for (const Layer& layer : kLayers) {
    const int64_t m = kTokens, k = layer.k, n = layer.n;
    zt::DeviceContext ctx;
    ctx.device = gpu;
    ctx.stream = stream;
    const zt::LinearDTypes dtypes =
        zt::LinearDTypes::ForPrecision(DType::kBF16, DType::kBF16, DType::kBF16);
    const absl::StatusOr<int64_t> workspace_bytes = zt::LinearWorkspaceBytes(ctx, m, k, n, dtypes);
    void* workspace = nullptr;
    void* inp = RandomBf16(m * k, 1);
    void* weight = RandomBf16(n * k, 2);
    void* out = RandomBf16(m * n, 3);
    void* dinp = RandomBf16(m * k, 4);
    void* dweight = RandomBf16(n * k, 5);
    if (!workspace_bytes.ok() || cudaMalloc(&workspace, *workspace_bytes) != cudaSuccess ||
        inp == nullptr || weight == nullptr || out == nullptr || dinp == nullptr ||
        dweight == nullptr) {
      std::printf("%-10s could not allocate its buffers\n", layer.name);
      return 1;
    }
    ctx.workspace = {.data = workspace, .bytes = *workspace_bytes};
    const Tensor t_inp(inp, DType::kBF16, {m, k}, gpu), t_weight(weight, DType::kBF16, {n, k}, gpu);
    const Tensor t_out(out, DType::kBF16, {m, n}, gpu), t_dinp(dinp, DType::kBF16, {m, k}, gpu);
    const Tensor t_dweight(dweight, DType::kBF16, {n, k}, gpu);
    struct Run {
      const char* gemm;
      double ms;
    };
    const Run runs[] = {
        {"forward", TimeMs(stream, iterations,
                           [&] {
                             return zt::Gemm(ctx, t_inp, t_weight, t_out,
                                             {.trans_b = Transpose::kYes});
                           })},
        {"dinp",
         TimeMs(stream, iterations, [&] { return zt::Gemm(ctx, t_out, t_weight, t_dinp, {}); })},
        {"dweight", TimeMs(stream, iterations, [&] {
           return zt::Gemm(ctx, t_out, t_inp, t_dweight,
                           {.trans_a = Transpose::kYes, .beta = 1.0f});
         })}};
    const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k;
    for (const Run& r : runs) {
      if (r.ms < 0) continue;
      std::printf("%-10s %-8s %6ld %6ld %6ld %9.3f %9.1f\n", layer.name, r.gemm,
                  static_cast<long>(m), static_cast<long>(n), static_cast<long>(k), r.ms,
                  flops / (r.ms * 1e-3) / 1e12);
    }
    for (void* p : {workspace, inp, weight, out, dinp, dweight}) cudaFree(p);
  }
  cudaStreamDestroy(stream);
  return 0;
}

#else  // !ZT_HAVE_CUDA

int main() {
  std::printf("gemm_cuda_bench: skipped: built without CUDA (no nvcc at configure time)\n");
  return 0;
}

#endif  // ZT_HAVE_CUDA
