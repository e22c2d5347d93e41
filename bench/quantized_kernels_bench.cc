// The issue-17 kernels on the CPU, timed against what they replace:
//  - the frozen NF4 linear layer (forward, and the input gradient) against the f32 linear
//    layer over the same, dequantized weight, at Llama-7B's attention and MLP shapes, with the
//    scratch each needs;
//  - LLM.int8()'s linear layer against the f32 one;
//  - attention over a packed row of 8 documents against one causal row of the same length
//    (the packed one skips the tiles between documents: about 1/8 of the work).
// Prints one line per measurement (milliseconds, GFLOP/s where meaningful); never fails.
//
// Usage: quantized_kernels_bench [threads] [iterations]   (defaults 2 and 3, after 1 warm-up)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/int8_linear.h"
#include "kernels/linear.h"
#include "kernels/nf4.h"
#include "kernels/nf4_linear.h"

namespace {

using zt::DType;
using zt::Tensor;

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Milliseconds per call, the best of `iterations` after one warm-up; -1 if a call failed.
double TimeMs(int iterations, const std::function<absl::Status()>& call) {
  if (!call().ok()) return -1;
  double best = 1e30;
  for (int i = 0; i < iterations; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!call().ok()) return -1;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    best = ms < best ? ms : best;
  }
  return best;
}

struct Owned {
  explicit Owned(int threads, int64_t bytes) : ctx(zt::CpuContext(threads)), ws(bytes) {
    ctx.workspace = {.data = ws.data(), .bytes = bytes};
  }
  zt::DeviceContext ctx;
  std::vector<uint8_t> ws;
};

void LinearShapes(int threads, int iterations) {
  struct Shape {
    const char* name;
    int64_t m, k, n;
  };
  const Shape shapes[] = {{"q_proj 4096x4096", 512, 4096, 4096},
                          {"up_proj 4096->11008", 512, 4096, 11008}};
  for (const Shape& s : shapes) {
    std::vector<float> w = Random(s.n * s.k, 1, 0.02f), inp = Random(s.m * s.k, 2, 1.0f);
    std::vector<float> dout = Random(s.m * s.n, 3, 1.0f), out(s.m * s.n), dinp(s.m * s.k);
    const zt::Nf4Layout layout = zt::Nf4LayoutFor(s.n * s.k, zt::Nf4Absmax::kDoubleQuantized);
    std::vector<uint8_t> codes(layout.code_bytes), absmax(layout.blocks);
    std::vector<float> scale(layout.absmax_groups), offset(1);
    zt::Nf4Tensor q{.numel = s.n * s.k,
                    .format = zt::Nf4Absmax::kDoubleQuantized,
                    .codes = Tensor(codes.data(), DType::kU8, {layout.code_bytes}),
                    .absmax = Tensor(absmax.data(), DType::kU8, {layout.blocks}),
                    .absmax_scale = Tensor(scale.data(), DType::kF32, {layout.absmax_groups}),
                    .absmax_offset = Tensor(offset.data(), DType::kF32, {1})};
    const zt::DeviceContext plain = zt::CpuContext(threads);
    if (!zt::Nf4Quantize(plain, {.src = Tensor(w.data(), DType::kF32, {s.n * s.k}), .dst = q})
             .ok() ||
        !zt::Nf4Dequantize(plain, {.src = q, .dst = Tensor(w.data(), DType::kF32, {s.n * s.k})})
             .ok()) {
      std::printf("%s: quantization failed\n", s.name);
      continue;
    }
    const int64_t nf4_ws = zt::Nf4LinearWorkspaceBytes(plain, s.m, s.k, s.n).value_or(-1);
    const int64_t f32_ws = zt::LinearWorkspaceBytes(plain, s.m, s.k, s.n).value_or(-1);
    Owned nf4(threads, nf4_ws), f32(threads, f32_ws);
    const Tensor inp_t(inp.data(), DType::kF32, {s.m, s.k}),
        out_t(out.data(), DType::kF32, {s.m, s.n});
    const Tensor dout_t(dout.data(), DType::kF32, {s.m, s.n});
    const Tensor dinp_t(dinp.data(), DType::kF32, {s.m, s.k});
    const Tensor w_t(w.data(), DType::kF32, {s.n, s.k});
    const double flops = 2.0 * s.m * s.n * s.k;
    const double nf4_fwd = TimeMs(iterations, [&] {
      return zt::Nf4LinearForward(nf4.ctx, {.inp = inp_t, .weight = q, .out = out_t});
    });
    const double f32_fwd = TimeMs(iterations, [&] {
      return zt::LinearForward(f32.ctx, {.inp = inp_t, .weight = w_t, .out = out_t});
    });
    const double nf4_bwd = TimeMs(iterations, [&] {
      return zt::Nf4LinearBackward(nf4.ctx, {.dout = dout_t, .weight = q, .dinp = dinp_t});
    });
    // The f32 layer's dinp alone: its GEMM through zt::Gemm (dout · W).
    const double f32_bwd =
        TimeMs(iterations, [&] { return zt::Gemm(f32.ctx, dout_t, w_t, dinp_t, {}); });
    std::printf(
        "%s, M=%lld: NF4 forward %.1f ms (%.0f GFLOP/s), f32 forward %.1f ms (%.0f GFLOP/s); "
        "NF4 dinp %.1f ms, f32 dinp %.1f ms; weight %.1f MiB NF4 vs %.1f MiB f32; scratch "
        "%.2f MiB NF4, %.2f MiB f32\n",
        s.name, static_cast<long long>(s.m), nf4_fwd, flops / nf4_fwd / 1e6, f32_fwd,
        flops / f32_fwd / 1e6, nf4_bwd, f32_bwd, layout.total_bytes / 1048576.0,
        4.0 * s.n * s.k / 1048576.0, nf4_ws / 1048576.0, f32_ws / 1048576.0);
  }
}

void Int8Shape(int threads, int iterations) {
  const int64_t m = 64, k = 4096, n = 4096;
  std::vector<float> w = Random(n * k, 4, 0.02f), inp = Random(m * k, 5, 1.0f), out(m * n);
  inp[7 * k + 100] = 20.0f;  // one outlier feature
  std::vector<uint8_t> codes(n * k);
  std::vector<float> scales(n);
  const zt::Int8Weight q{.codes = Tensor(codes.data(), DType::kU8, {n, k}),
                         .scales = Tensor(scales.data(), DType::kF32, {n})};
  const zt::DeviceContext plain = zt::CpuContext(threads);
  if (!zt::Int8QuantizeWeight(plain, {.src = Tensor(w.data(), DType::kF32, {n, k}), .dst = q})
           .ok()) {
    std::printf("int8: quantization failed\n");
    return;
  }
  Owned i8(threads, zt::Int8LinearWorkspaceBytes(m, k));
  Owned f32(threads, zt::LinearWorkspaceBytes(plain, m, k, n).value_or(0));
  const Tensor inp_t(inp.data(), DType::kF32, {m, k}), out_t(out.data(), DType::kF32, {m, n});
  const double flops = 2.0 * m * n * k;
  const double int8_ms = TimeMs(iterations, [&] {
    return zt::Int8LinearForward(i8.ctx, {.inp = inp_t, .weight = q, .out = out_t});
  });
  const double f32_ms = TimeMs(iterations, [&] {
    return zt::LinearForward(
        f32.ctx, {.inp = inp_t, .weight = Tensor(w.data(), DType::kF32, {n, k}), .out = out_t});
  });
  std::printf(
      "LLM.int8() 4096x4096, M=%lld, 1 outlier column: int8 forward %.1f ms (%.0f GOP/s, plain "
      "int32 loops), f32 forward %.1f ms (%.0f GFLOP/s)\n",
      static_cast<long long>(m), int8_ms, flops / int8_ms / 1e6, f32_ms, flops / f32_ms / 1e6);
}

void PackedAttention(int threads, int iterations) {
  const int64_t t = 4096;
  const int h = 8, hkv = 8, d = 128;
  const int64_t row = int64_t{h + 2 * hkv} * d, out_row = int64_t{h} * d;
  std::vector<float> qkv = Random(t * row, 6, 1.0f), out(t * out_row), lse(h * t);
  std::vector<float> dout = Random(t * out_row, 7, 1.0f), dqkv(t * row);
  std::vector<int32_t> starts(8);
  for (int i = 0; i < 8; ++i) starts[i] = static_cast<int32_t>(i * t / 8);
  const zt::DeviceContext ctx = zt::CpuContext(threads);
  for (bool packed : {false, true}) {
    const Tensor doc = packed ? Tensor(starts.data(), DType::kI32, {1, 8}) : Tensor();
    const zt::AttentionForwardArgs f{.qkv = Tensor(qkv.data(), DType::kF32, {1, t, row}),
                                     .out = Tensor(out.data(), DType::kF32, {1, t, out_row}),
                                     .lse = Tensor(lse.data(), DType::kF32, {1, h, t}),
                                     .n_head = h,
                                     .n_kv_head = hkv,
                                     .doc_starts = doc};
    const zt::AttentionBackwardArgs b{.qkv = f.qkv,
                                      .out = f.out,
                                      .lse = f.lse,
                                      .dout = Tensor(dout.data(), DType::kF32, {1, t, out_row}),
                                      .dqkv = Tensor(dqkv.data(), DType::kF32, {1, t, row}),
                                      .n_head = h,
                                      .n_kv_head = hkv,
                                      .doc_starts = doc};
    const double fwd = TimeMs(iterations, [&] { return zt::AttentionForward(ctx, f); });
    const double bwd = TimeMs(iterations, [&] { return zt::AttentionBackward(ctx, b); });
    std::printf("attention T=%lld, H=%d, D=%d, %s: forward %.1f ms, backward %.1f ms\n",
                static_cast<long long>(t), h, d,
                packed ? "packed, 8 documents of 512" : "one causal document", fwd, bwd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 3;
  std::printf("CPU, %d threads, GEMM: %s\n", threads,
              zt::CpuGemmDescription(zt::CpuGemm::kOneDnn).c_str());
  LinearShapes(threads, iterations);
  Int8Shape(threads, iterations);
  PackedAttention(threads, iterations);
  return 0;
}
