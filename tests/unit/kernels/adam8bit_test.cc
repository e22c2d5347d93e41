// kernels/adam8bit: 8-bit AdamW against a float64 reference of the same dequantize → update →
// requantize scheme, against plain f32 AdamW, partial last blocks, thread-count determinism,
// errors.
#include "kernels/adam8bit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/optimizer.h"
#include "kernels/quantization.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::MaxRelativeError;
using testing::RandomVector;
using testing::RoundTo;
using testing::SameBits;
using testing::SameWords;
using testing::Stored;
using testing::ToDouble;

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}
Tensor Flat(std::vector<uint8_t>& v) {
  return Tensor(v.data(), DType::kU8, {static_cast<int64_t>(v.size())});
}

// The 8-bit state of n parameters, zero-filled: the documented zero state.
struct State8 {
  State8(int64_t n, int64_t block)
      : m_codes(n),
        v_codes(n),
        m_absmax(NumQuantBlocks(n, block)),
        v_absmax(NumQuantBlocks(n, block)) {}
  std::vector<uint8_t> m_codes, v_codes;
  std::vector<float> m_absmax, v_absmax;
};

struct Hyper {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
};

// The 16-bit options of one step: the gradient's storage and the parameter copy.
struct Storage {
  Tensor grad;  // empty: the f32 vector passed to Step8
  Tensor param_copy;
  bool stochastic_rounding = false;
  uint64_t seed = 0;
};

absl::Status Step8(const DeviceContext& ctx, std::vector<float>& param, std::vector<float>& grad,
                   State8& s, int64_t block, const Hyper& h, int64_t step,
                   const Storage& storage = {}) {
  return AdamW8bitUpdate(ctx, {.param = Flat(param),
                               .grad = storage.grad.empty() ? Flat(grad) : storage.grad,
                               .m_codes = Flat(s.m_codes),
                               .m_absmax = Flat(s.m_absmax),
                               .v_codes = Flat(s.v_codes),
                               .v_absmax = Flat(s.v_absmax),
                               .block = block,
                               .lr = h.lr,
                               .beta1 = h.beta1,
                               .beta2 = h.beta2,
                               .eps = h.eps,
                               .weight_decay = h.weight_decay,
                               .step = step,
                               .grad_scale = h.grad_scale,
                               .param_copy = storage.param_copy,
                               .stochastic_rounding = storage.stochastic_rounding,
                               .seed = storage.seed});
}

// Index of the nearest map value to r in float64, ties to the lower index.
int Nearest64(const std::array<float, 256>& map, double r) {
  int best = 0;
  for (int k = 1; k < 256; ++k) {
    if (std::abs(map[k] - r) < std::abs(map[best] - r)) best = k;
  }
  return best;
}

// What a float64 reference of one step disagrees on: codes that differ, and how far each
// kernel code is from being as near as the reference's choice (0 for an exact tie).
struct CodeDiffs {
  int64_t count = 0;
  double worst_excess = 0;
  int worst_code_distance = 0;
};

void CompareCodes(const std::array<float, 256>& map, double r, uint8_t code, CodeDiffs& d) {
  const int best = Nearest64(map, r);
  if (code == best) return;
  ++d.count;
  d.worst_excess = std::max(d.worst_excess, std::abs(map[code] - r) - std::abs(map[best] - r));
  d.worst_code_distance = std::max(d.worst_code_distance, std::abs(int{code} - best));
}

// Each step the reference starts from the kernel's 8-bit state (so one disagreement does not
// propagate), dequantizes it in float64, applies AdamW's rule, requantizes by brute force;
// its parameters run on independently for all 20 steps. 5,000 = 19 blocks of 256 + 136.
TEST(AdamW8bitTest, TwentyStepsMatchFloat64ReferenceOfTheSameScheme) {
  const int64_t n = 5000, block = 256;
  const Hyper h{.lr = 1e-2f,
                .beta1 = 0.9f,
                .beta2 = 0.95f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .grad_scale = 0.5f};
  const std::array<float, 256>& smap = DynamicMapSigned();
  const std::array<float, 256>& umap = DynamicMapUnsigned();
  std::vector<float> param = RandomVector(n, 1);
  std::vector<double> p64 = ToDouble(param);
  State8 s(n, block);
  CodeDiffs m_diffs, v_diffs;
  for (int step = 1; step <= 20; ++step) {
    std::vector<float> grad = RandomVector(n, 100 + step, -2.0f, 2.0f);
    const State8 before = s;
    ASSERT_TRUE(Step8(CpuContext(2), param, grad, s, block, h, step).ok());
    const double bc1 = 1.0 - std::pow(double{h.beta1}, step);
    const double bc2 = 1.0 - std::pow(double{h.beta2}, step);
    for (int64_t b = 0; b < NumQuantBlocks(n, block); ++b) {
      const int64_t begin = b * block, end = std::min(n, begin + block);
      std::vector<double> m(end - begin), v(end - begin);
      double m_max = 0, v_max = 0;
      for (int64_t i = begin; i < end; ++i) {
        const double g = double{grad[i]} * h.grad_scale;
        const double m_old = double{smap[before.m_codes[i]]} * before.m_absmax[b];
        const double v_old = double{umap[before.v_codes[i]]} * before.v_absmax[b];
        m[i - begin] = h.beta1 * m_old + (1.0 - h.beta1) * g;
        v[i - begin] = h.beta2 * v_old + (1.0 - h.beta2) * g * g;
        m_max = std::max(m_max, std::abs(m[i - begin]));
        v_max = std::max(v_max, v[i - begin]);
        const double update = (m[i - begin] / bc1) / (std::sqrt(v[i - begin] / bc2) + h.eps);
        p64[i] -= h.lr * (update + h.weight_decay * p64[i]);
      }
      // A handful of f32 roundings in the kernel's dequantize and update: 1e-6 relative.
      ASSERT_NEAR(s.m_absmax[b], m_max, 1e-6 * m_max) << "step " << step << " block " << b;
      ASSERT_NEAR(s.v_absmax[b], v_max, 1e-6 * v_max) << "step " << step << " block " << b;
      for (int64_t i = begin; i < end; ++i) {
        CompareCodes(smap, m[i - begin] / m_max, s.m_codes[i], m_diffs);
        CompareCodes(umap, v[i - begin] / v_max, s.v_codes[i], v_diffs);
      }
    }
  }
  // A disagreement needs the value within the kernel's f32 rounding (~1e-7 of the block's
  // absmax) of a midpoint between two map values: then the kernel's code is the other
  // neighbour and no more than that rounding farther away.
  for (const CodeDiffs* d : {&m_diffs, &v_diffs}) {
    EXPECT_LE(d->worst_code_distance, 1);
    EXPECT_LE(d->worst_excess, 1e-6);
    // Of 100,000 codes per state, a rounding lands on the wrong side of a midpoint with
    // probability ~ rounding / gap ≲ 1e-4: a few dozen at most.
    EXPECT_LE(d->count, 50);
  }
  // Parameters after 20 steps: each step rounds a handful of f32 operations (~1e-7 relative
  // each); the floor 1e-3 covers parameters near zero.
  EXPECT_LE(MaxRelativeError(param, p64), 1e-5);
}

// 8-bit states against f32 states over the same 20 steps. The update m̂ / √v̂ is a ratio of
// two quantized moments. The dynamic maps' relative spacing is ≲ 1.4% near a block's absmax
// but grows to tens of per cent for values three or four decades below it (the decade
// 10^-4…10^-3 of the unsigned map has 8 values), and v spans that many decades within a block
// here (gradient scales 0.01…1 squared). So most parameters follow f32 AdamW to a per cent of
// their movement, and a tail of small-v elements lands further off.
TEST(AdamW8bitTest, TwentyStepsStayCloseToFloat32AdamW) {
  const int64_t n = 1 << 16, block = 2048;
  const Hyper h{.lr = 1e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.999f,
                .eps = 1e-8f,
                .weight_decay = 0.01f,
                .grad_scale = 1.0f};
  const std::vector<float> start = RandomVector(n, 3);
  std::vector<float> p8 = start, p32 = start, m(n, 0.0f), v(n, 0.0f);
  State8 s(n, block);
  // Each parameter keeps its own gradient scale and mean across steps, as in training.
  const std::vector<float> scale = RandomVector(n, 4, 0.01f, 1.0f);
  const std::vector<float> mean = RandomVector(n, 5, -0.5f, 0.5f);
  for (int step = 1; step <= 20; ++step) {
    std::vector<float> grad = RandomVector(n, 200 + step);
    for (int64_t i = 0; i < n; ++i) grad[i] = scale[i] * (mean[i] + grad[i]);
    ASSERT_TRUE(Step8(CpuContext(2), p8, grad, s, block, h, step).ok());
    ASSERT_TRUE(AdamWUpdate(CpuContext(2), {.param = Flat(p32),
                                            .grad = Flat(grad),
                                            .m = Flat(m),
                                            .v = Flat(v),
                                            .lr = h.lr,
                                            .beta1 = h.beta1,
                                            .beta2 = h.beta2,
                                            .eps = h.eps,
                                            .weight_decay = h.weight_decay,
                                            .step = step})
                    .ok());
  }
  // Adam moves a parameter by at most ~lr per step, so 20·lr bounds each movement.
  const double max_move = 20 * h.lr;
  std::vector<double> off(n);
  double diff_sq = 0, moved_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = double{p8[i]} - p32[i], moved = double{p32[i]} - start[i];
    off[i] = std::abs(diff) / max_move;
    diff_sq += diff * diff;
    moved_sq += moved * moved;
  }
  std::sort(off.begin(), off.end());
  // Measured here: median 0.5%, 99th percentile 3.5%, worst 11% of 20·lr, root mean square
  // 2.3% of the movement; the bounds leave about twice that.
  EXPECT_LE(off[n / 2], 0.01);
  EXPECT_LE(off[n * 99 / 100], 0.07);
  EXPECT_LE(off.back(), 0.25);
  EXPECT_LE(std::sqrt(diff_sq / moved_sq), 0.05);
}

// 257 elements in blocks of 256: the last block has one element, which is its own absmax, so
// its codes are the map's ends exactly.
TEST(AdamW8bitTest, SingleElementLastBlockQuantizesToTheMapEnds) {
  const int64_t n = 257, block = 256;
  const Hyper h{.lr = 1e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.999f,
                .eps = 1e-8f,
                .weight_decay = 0,
                .grad_scale = 1.0f};
  for (float last_grad : {0.25f, -0.25f}) {
    std::vector<float> param = RandomVector(n, 8), grad = RandomVector(n, 9);
    grad[256] = last_grad;
    State8 s(n, block);
    ASSERT_TRUE(Step8(CpuContext(1), param, grad, s, block, h, 1).ok());
    // m = (1 − β1)·g and v = (1 − β2)·g² after one step from zero; 1e-6 covers the f32
    // roundings of 1 − β and of the products.
    const double m_want = (1.0 - double{h.beta1}) * 0.25;
    const double v_want = (1.0 - double{h.beta2}) * 0.25 * 0.25;
    EXPECT_NEAR(s.m_absmax[1], m_want, 1e-6 * m_want);
    EXPECT_NEAR(s.v_absmax[1], v_want, 1e-6 * v_want);
    EXPECT_EQ(s.v_codes[256], 255);
    EXPECT_EQ(s.m_codes[256], last_grad > 0 ? 255 : 0);
  }
}

TEST(AdamW8bitTest, SameBitsForAnyThreadCount) {
  const int64_t n = (1 << 17) + 300, block = 2048;
  const Hyper h{.lr = 1e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.999f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .grad_scale = 0.7f};
  std::vector<float> p1 = RandomVector(n, 10), p3 = p1;
  State8 s1(n, block), s3(n, block);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> grad = RandomVector(n, 300 + step);
    ASSERT_TRUE(Step8(CpuContext(1), p1, grad, s1, block, h, step).ok());
    ASSERT_TRUE(Step8(CpuContext(3), p3, grad, s3, block, h, step).ok());
  }
  EXPECT_TRUE(SameBits(p1, p3));
  EXPECT_EQ(s1.m_codes, s3.m_codes);
  EXPECT_EQ(s1.v_codes, s3.v_codes);
  EXPECT_TRUE(SameBits(s1.m_absmax, s3.m_absmax));
  EXPECT_TRUE(SameBits(s1.v_absmax, s3.v_absmax));
}

// A bf16 or f16 gradient is loaded to f32 and used as the f32 path uses it. The first step
// from the zero state moves the parameter with m = (1 − β1)·g and v = (1 − β2)·g² before they
// are quantized, so it is checked against float64 AdamW fed the stored gradient, to the f32
// path's 1e-5 (TwentyStepsMatchFloat64ReferenceOfTheSameScheme: f32 roundings of an O(1)
// update, scaled by lr, against the floor 1e-3 near zero); later steps are bit for bit the f32
// path run on an f32 gradient holding the same values. The copy is the updated parameter
// rounded once.
TEST(AdamW8bitTest, SixteenBitGradAndParamCopy) {
  const int64_t n = 40000, block = 256;  // above the parallel threshold, partial last block
  const Hyper h{.lr = 1e-2f,
                .beta1 = 0.9f,
                .beta2 = 0.95f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .grad_scale = 0.5f};
  for (DType gt : {DType::kBF16, DType::kF16}) {
    for (DType ct : {DType::kBF16, DType::kF16}) {
      std::vector<float> param = RandomVector(n, 60), p32 = param;
      State8 s(n, block), s32(n, block);
      Stored copy(n, ct);
      for (int step = 1; step <= 3; ++step) {
        Stored grad(RandomVector(n, 60 + step, -2.0f, 2.0f), gt);
        std::vector<float> g32 = grad.Values();
        const std::vector<double> p0 = ToDouble(param);
        ASSERT_TRUE(Step8(CpuContext(2), param, g32, s, block, h, step,
                          {.grad = grad.Flat(), .param_copy = copy.Flat()})
                        .ok());
        ASSERT_TRUE(Step8(CpuContext(2), p32, g32, s32, block, h, step).ok());
        if (step == 1) {
          std::vector<double> want(n);
          for (int64_t i = 0; i < n; ++i) {
            const double g = double{grad.Get(i)} * h.grad_scale;
            const double mhat = (1.0 - h.beta1) * g / (1.0 - h.beta1);
            const double vhat = (1.0 - h.beta2) * g * g / (1.0 - h.beta2);
            want[i] = p0[i] - h.lr * (mhat / (std::sqrt(vhat) + h.eps) + h.weight_decay * p0[i]);
          }
          EXPECT_LE(MaxRelativeError(param, want), 1e-5) << DTypeName(gt);
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(FloatBits(copy.Get(i)), FloatBits(RoundTo(ct, param[i]))) << i;
        }
      }
      EXPECT_TRUE(SameBits(param, p32)) << DTypeName(gt) << " " << DTypeName(ct);
      EXPECT_EQ(s.m_codes, s32.m_codes);
      EXPECT_EQ(s.v_codes, s32.v_codes);
      EXPECT_TRUE(SameBits(s.m_absmax, s32.m_absmax));
      EXPECT_TRUE(SameBits(s.v_absmax, s32.v_absmax));
    }
  }
}

// With lr 0 the parameter stays x, so a stochastic bf16 copy holds k roundings of x, each to
// one of its two bf16 neighbours: their mean is x within 5 standard errors
// (gap·√(p(1 − p)/k), p the discarded fraction). The draws are a function of the seed and the
// element index only: the same for any thread count, other for another seed.
TEST(AdamW8bitTest, StochasticParamCopyIsUnbiasedAndDeterministic) {
  const int64_t k = 1 << 16, block = 2048;
  const float x = 0.3337f;
  const Hyper h{.lr = 0.0f,
                .beta1 = 0.9f,
                .beta2 = 0.999f,
                .eps = 1e-8f,
                .weight_decay = 0,
                .grad_scale = 1.0f};
  auto run = [&](int threads, uint64_t seed) {
    std::vector<float> param(k, x), grad = RandomVector(k, 70);
    State8 s(k, block);
    Stored copy(k, DType::kBF16);
    Stored g16(grad, DType::kF16);
    EXPECT_TRUE(Step8(CpuContext(threads), param, grad, s, block, h, 1,
                      {.grad = g16.Flat(),
                       .param_copy = copy.Flat(),
                       .stochastic_rounding = true,
                       .seed = seed})
                    .ok());
    return copy;
  };
  const Stored one = run(1, 9), three = run(3, 9), other = run(2, 10);
  EXPECT_TRUE(SameWords(one, three));
  EXPECT_FALSE(SameWords(one, other));
  const float down = Bf16ToFloat(static_cast<uint16_t>(FloatBits(x) >> 16));
  const float up = Bf16ToFloat(static_cast<uint16_t>((FloatBits(x) >> 16) + 1));
  double sum = 0;
  for (float r : one.Values()) {
    ASSERT_TRUE(r == down || r == up) << r;
    sum += r;
  }
  const double gap = static_cast<double>(up) - down;
  const double p = (x - static_cast<double>(down)) / gap;
  EXPECT_NEAR(sum / k, x, 5 * gap * std::sqrt(p * (1 - p) / k));
}

TEST(AdamW8bitTest, SixteenBitModesIndependentOfThreadCount) {
  const int64_t n = (1 << 17) + 300, block = 2048;
  const Hyper h{.lr = 1e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.999f,
                .eps = 1e-8f,
                .weight_decay = 0.1f,
                .grad_scale = 0.7f};
  std::vector<float> p1 = RandomVector(n, 80), p3 = p1, unused;
  State8 s1(n, block), s3(n, block);
  Stored c1(n, DType::kF16), c3(n, DType::kF16);
  for (int step = 1; step <= 3; ++step) {
    Stored grad(RandomVector(n, 80 + step), DType::kBF16);
    ASSERT_TRUE(Step8(CpuContext(1), p1, unused, s1, block, h, step,
                      {.grad = grad.Flat(), .param_copy = c1.Flat()})
                    .ok());
    ASSERT_TRUE(Step8(CpuContext(3), p3, unused, s3, block, h, step,
                      {.grad = grad.Flat(), .param_copy = c3.Flat()})
                    .ok());
  }
  EXPECT_TRUE(SameBits(p1, p3));
  EXPECT_TRUE(SameWords(c1, c3));
  EXPECT_EQ(s1.m_codes, s3.m_codes);
  EXPECT_EQ(s1.v_codes, s3.v_codes);
}

TEST(AdamW8bitTest, RejectsBadBlocksAndBuffers) {
  const int64_t n = 512;
  const Hyper h{.lr = 1e-3f,
                .beta1 = 0.9f,
                .beta2 = 0.999f,
                .eps = 1e-8f,
                .weight_decay = 0,
                .grad_scale = 1.0f};
  std::vector<float> param(n), grad(n);
  const DeviceContext ctx = CpuContext(1);
  for (int64_t block : {0, 32, 100, 1000}) {
    State8 s(n, 64);
    const absl::Status st = Step8(ctx, param, grad, s, block, h, 1);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << block;
    EXPECT_NE(st.message().find("block is"), std::string::npos) << st;
  }
  // State sized for blocks of 64 (8 absmax values) but the call says 128 (4 needed).
  State8 s(n, 64);
  const absl::Status st = Step8(ctx, param, grad, s, 128, h, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("m_absmax"), std::string::npos) << st;
  // v_codes as f32 instead of u8.
  State8 ok(n, 64);
  std::vector<float> wrong(n);
  const absl::Status dt = AdamW8bitUpdate(ctx, {.param = Flat(param),
                                                .grad = Flat(grad),
                                                .m_codes = Flat(ok.m_codes),
                                                .m_absmax = Flat(ok.m_absmax),
                                                .v_codes = Flat(wrong),
                                                .v_absmax = Flat(ok.v_absmax),
                                                .block = 64,
                                                .lr = 1e-3f});
  EXPECT_EQ(dt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dt.message().find("v_codes"), std::string::npos) << dt;
  // The 16-bit options are checked as AdamWUpdate checks them.
  std::vector<uint8_t> bytes(n);
  std::vector<uint16_t> halves(n);
  const Tensor f16_copy(halves.data(), DType::kF16, {n});
  const struct {
    Storage storage;
    std::string needle;
  } cases[] = {
      {{.grad = Flat(bytes)}, "grad has dtype u8, expected one of f32, bf16, f16"},
      {{.param_copy = Flat(param)}, "param_copy has dtype f32, expected bf16 or f16"},
      {{.param_copy = f16_copy, .stochastic_rounding = true},
       "stochastic_rounding needs a bf16 param_copy, it is f16"},
      {{.stochastic_rounding = true}, "stochastic_rounding is set but param_copy is empty"},
      {{.param_copy = Tensor(halves.data(), DType::kBF16, {n - 1})}, "param_copy"},
  };
  for (const auto& c : cases) {
    State8 fresh(n, 64);
    const absl::Status bad = Step8(ctx, param, grad, fresh, 64, h, 1, c.storage);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(bad.message().find(c.needle), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace zt
