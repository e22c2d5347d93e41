// The host optimizer step of ZeRO-Offload, alone: AdamW over one rank's flat fp32 shard
// (the kernel the offloaded step runs on host threads, kernels/optimizer.h), timed as
// parameters per second. bench/torch_adamw_reference.py times torch.optim.AdamW (foreach)
// over the same number of parameters on the same threads; the bar is >= 3x.
//
// Two shapes of the same update:
//  - fp32: f32 parameters, gradients, moments (the shape torch.optim.AdamW runs);
//  - mixed: a bf16 gradient in, the f32 master updated and its bf16 copy written in the same
//    pass (the mixed-precision job's host step: what ZeRO-Offload actually runs).
// Memory: 16 bytes a parameter for fp32 (param, grad, m, v), 2 + 2 more for mixed's bf16
// gradient and copy instead of the f32 gradient (18 bytes): 1 B parameters need ~18 GB.
//
// Usage: host_adamw_kernels_bench [parameters] [threads] [iterations] [fp32|mixed|both]
//        (defaults 1000000000, 2, 3, both; one untimed step first). Prints one line per
//        shape; exits 1 if an update fails.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/optimizer.h"
#include "kernels/tensor.h"

namespace {

using zt::DType;
using zt::Tensor;

// Untouched-until-written buffers: the first pass (below) faults the pages in on the threads
// that use them, as a rank's shard would be.
struct Buffer {
  explicit Buffer(int64_t bytes) : data(static_cast<uint8_t*>(std::malloc(bytes))) {}
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data;
};

// A cheap deterministic pattern of small values, so the moments, their square root and the
// division see realistic numbers rather than zeros.
void FillF32(float* p, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    p[i] = scale * static_cast<float>(static_cast<int64_t>((i * 2654435761u) % 2001) - 1000) / 1000.0f;
  }
}

void FillBf16(uint16_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float f =
        1e-3f * static_cast<float>(static_cast<int64_t>((i * 40503u) % 2001) - 1000) / 1000.0f;
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    p[i] = static_cast<uint16_t>(bits >> 16);
  }
}

double Seconds(const std::chrono::steady_clock::time_point& t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best of `iterations` steps after one untimed one; -1 when an update fails.
double BestStepSeconds(const zt::DeviceContext& ctx, zt::AdamWArgs args, int iterations) {
  double best = 1e30;
  for (int i = 0; i <= iterations; ++i) {
    args.step = i + 1;
    const auto t0 = std::chrono::steady_clock::now();
    if (const absl::Status s = zt::AdamWUpdate(ctx, args); !s.ok()) {
      std::fprintf(stderr, "AdamWUpdate: %s\n", s.ToString().c_str());
      return -1;
    }
    if (i > 0) best = std::min(best, Seconds(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 1000000000;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string shapes = argc > 4 ? argv[4] : "both";
  if (n <= 0 || threads <= 0 || iterations <= 0 ||
      (shapes != "fp32" && shapes != "mixed" && shapes != "both")) {
    std::fprintf(stderr,
                 "usage: host_adamw_kernels_bench [parameters > 0] [threads > 0] "
                 "[iterations > 0] [fp32|mixed|both]\n");
    return 2;
  }
  const zt::DeviceContext ctx = zt::CpuContext(threads);
  Buffer param(4 * n), m(4 * n), v(4 * n);
  FillF32(reinterpret_cast<float*>(param.data), n, 0.02f);
  std::memset(m.data, 0, 4 * n);
  std::memset(v.data, 0, 4 * n);
  const zt::AdamWArgs base{.param = Tensor(param.data, DType::kF32, {n}),
                           .m = Tensor(m.data, DType::kF32, {n}),
                           .v = Tensor(v.data, DType::kF32, {n}),
                           .lr = 1e-4f,
                           .weight_decay = 0.01f};
  // PyTorch's defaults beside: betas (0.9, 0.999), eps 1e-8; lr and decay as the script.
  std::printf("host AdamW, %lld parameters, %d threads, best of %d steps\n",
              static_cast<long long>(n), threads, iterations);
  if (shapes != "mixed") {
    Buffer grad(4 * n);
    FillF32(reinterpret_cast<float*>(grad.data), n, 1e-3f);
    zt::AdamWArgs args = base;
    args.grad = Tensor(grad.data, DType::kF32, {n});
    const double s = BestStepSeconds(ctx, args, iterations);
    if (s < 0) return 1;
    std::printf("fp32 (f32 param, grad, m, v): %.3f s a step, %.3g parameters/s, %.2f GB/s\n", s,
                n / s, 28.0 * n / s / 1e9);  // reads param, grad, m, v (16 B); writes param, m, v (12 B)
  }
  if (shapes != "fp32") {
    Buffer grad(2 * n), copy(2 * n);
    FillBf16(reinterpret_cast<uint16_t*>(grad.data), n);
    zt::AdamWArgs args = base;
    args.grad = Tensor(grad.data, DType::kBF16, {n});
    args.param_copy = Tensor(copy.data, DType::kBF16, {n});
    const double s = BestStepSeconds(ctx, args, iterations);
    if (s < 0) return 1;
    std::printf(
        "mixed (f32 master, m, v; bf16 grad in, bf16 copy out): %.3f s a step, %.3g "
        "parameters/s, %.2f GB/s\n",
        s, n / s, 28.0 * n / s / 1e9);  // reads 4+2+4+4 B; writes 4+4+4+2 B
  }
  return 0;
}
