// Tests of kernels/attention.h with packed rows (doc_starts, kernels/packing.h): each document
// of a packed row gets exactly the output and gradients of running it alone, nothing is read
// across a document boundary (other documents' keys and values poisoned with NaN change no
// bit), the backward against finite differences of a float64 block-diagonal reference, and
// the argument checks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using ::zt::testing::FiniteDifferenceGradient;
using ::zt::testing::MaxErrorOverLargest;
using ::zt::testing::MaxRelativeError;
using ::zt::testing::RandomVector;
using ::zt::testing::SameBits;
using ::zt::testing::ToDouble;

struct Dims {
  int b, t, h, hkv, d;
  int64_t row() const { return int64_t{h + 2 * hkv} * d; }  // C3
  int64_t out_row() const { return int64_t{h} * d; }
};

// Buffers of one attention call and its document starts (S per row).
struct AttentionRun {
  AttentionRun(const Dims& dims, std::vector<int32_t> starts, uint32_t seed)
      : dm(dims),
        doc_starts(std::move(starts)),
        qkv(RandomVector(dims.b * dims.t * dims.row(), seed, -1.5f, 1.5f)),
        out(dims.b * dims.t * dims.out_row()),
        lse(int64_t{dims.b} * dims.h * dims.t),
        dout(RandomVector(dims.b * dims.t * dims.out_row(), seed + 1)),
        dqkv(qkv.size()) {}

  Tensor Qkv() { return Tensor(qkv.data(), DType::kF32, {dm.b, dm.t, dm.row()}); }
  Tensor Out() { return Tensor(out.data(), DType::kF32, {dm.b, dm.t, dm.out_row()}); }
  Tensor Lse() { return Tensor(lse.data(), DType::kF32, {dm.b, dm.h, dm.t}); }
  Tensor Starts() {
    if (doc_starts.empty()) return Tensor();
    return Tensor(doc_starts.data(), DType::kI32,
                  {dm.b, static_cast<int64_t>(doc_starts.size()) / dm.b});
  }

  absl::Status Forward(int threads = 2) {
    return AttentionForward(CpuContext(threads), {.qkv = Qkv(),
                                                  .out = Out(),
                                                  .lse = Lse(),
                                                  .n_head = dm.h,
                                                  .n_kv_head = dm.hkv,
                                                  .doc_starts = Starts()});
  }
  absl::Status Backward(int threads = 2) {
    return AttentionBackward(CpuContext(threads),
                             {.qkv = Qkv(),
                              .out = Out(),
                              .lse = Lse(),
                              .dout = Tensor(dout.data(), DType::kF32, {dm.b, dm.t, dm.out_row()}),
                              .dqkv = Tensor(dqkv.data(), DType::kF32, {dm.b, dm.t, dm.row()}),
                              .n_head = dm.h,
                              .n_kv_head = dm.hkv,
                              .doc_starts = Starts()});
  }

  Dims dm;
  std::vector<int32_t> doc_starts;
  std::vector<float> qkv, out, lse, dout, dqkv;
};

// Rows [t0, t0 + n) of batch row b of a (B, T, width) buffer.
std::vector<float> Rows(const std::vector<float>& v, const Dims& dm, int64_t width, int b, int t0,
                        int n) {
  const auto first = v.begin() + (int64_t{b} * dm.t + t0) * width;
  return std::vector<float>(first, first + int64_t{n} * width);
}

// lse of batch row b, tokens [t0, t0 + n), every head.
std::vector<float> LseRows(const AttentionRun& r, int b, int t0, int n) {
  std::vector<float> v;
  for (int h = 0; h < r.dm.h; ++h) {
    const auto first = r.lse.begin() + (int64_t{b} * r.dm.h + h) * r.dm.t + t0;
    v.insert(v.end(), first, first + n);
  }
  return v;
}

// Document lengths of each batch row, and their starts padded with T to `s` per row.
struct Packing {
  std::vector<std::vector<int>> lengths;
  int s;
  std::vector<int32_t> Starts(int t) const {
    std::vector<int32_t> starts;
    for (const std::vector<int>& row : lengths) {
      int at = 0;
      for (int len : row) {
        starts.push_back(at);
        at += len;
      }
      for (size_t d = row.size(); d < static_cast<size_t>(s); ++d) starts.push_back(t);
    }
    return starts;
  }
};

// T = 150 is three tiles (64, 64, 22). Row 0: documents of 70, 50 and 30 tokens, boundaries
// inside tiles; row 1: 100 and 50, so the last query tile's documents start in tile 1 and key
// tile 0 is skipped; heads GQA 2:1, D = 16.
constexpr Dims kDims{2, 150, 4, 2, 16};
const Packing kPacking{{{70, 50, 30}, {100, 50}}, 3};

// Each document alone: a (1, length) run on its own rows of q, k, v and dout.
TEST(PackedAttentionTest, EachDocumentMatchesRunningItAlone) {
  AttentionRun packed(kDims, kPacking.Starts(kDims.t), 1);
  ASSERT_TRUE(packed.Forward().ok());
  ASSERT_TRUE(packed.Backward().ok());
  for (int b = 0; b < kDims.b; ++b) {
    int t0 = 0;
    for (int len : kPacking.lengths[b]) {
      SCOPED_TRACE("row " + std::to_string(b) + " document at " + std::to_string(t0));
      const Dims alone_dims{1, len, kDims.h, kDims.hkv, kDims.d};
      AttentionRun alone(alone_dims, {}, 99);
      alone.qkv = Rows(packed.qkv, kDims, kDims.row(), b, t0, len);
      alone.dout = Rows(packed.dout, kDims, kDims.out_row(), b, t0, len);
      ASSERT_TRUE(alone.Forward().ok());
      ASSERT_TRUE(alone.Backward().ok());
      // fp32 noise: both runs compute the same sums, but the packed one cuts the document into
      // other tiles, so the online softmax rescales at other keys and the tile products sum in
      // other groupings — a few ulps per step over ≤ 3 tiles. Outputs are O(1) (convex
      // combinations of values ≤ 1.5), gradients O(1)–O(10): 2e-6 of the largest is ~30 ulps.
      EXPECT_LT(MaxErrorOverLargest(Rows(packed.out, kDims, kDims.out_row(), b, t0, len),
                                    ToDouble(alone.out)),
                2e-6);
      EXPECT_LT(MaxErrorOverLargest(LseRows(packed, b, t0, len), ToDouble(alone.lse)), 2e-6);
      EXPECT_LT(MaxErrorOverLargest(Rows(packed.dqkv, kDims, kDims.row(), b, t0, len),
                                    ToDouble(alone.dqkv)),
                2e-6);
      t0 += len;
    }
  }
}

// The middle document of row 0 with every other document's keys and values NaN: its output,
// log-sum-exp and gradients keep every bit.
TEST(PackedAttentionTest, NoReadAcrossADocumentBoundary) {
  AttentionRun clean(kDims, kPacking.Starts(kDims.t), 2);
  ASSERT_TRUE(clean.Forward().ok());
  ASSERT_TRUE(clean.Backward().ok());
  AttentionRun poisoned = clean;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int first = 70, last = 120;  // document 1 of row 0
  for (int b = 0; b < kDims.b; ++b) {
    for (int t = 0; t < kDims.t; ++t) {
      if (b == 0 && t >= first && t < last) continue;
      float* row = poisoned.qkv.data() + (int64_t{b} * kDims.t + t) * kDims.row();
      std::fill(row + int64_t{kDims.h} * kDims.d, row + kDims.row(), nan);  // k and v heads
    }
  }
  ASSERT_TRUE(poisoned.Forward().ok());
  ASSERT_TRUE(poisoned.Backward().ok());
  const int n = last - first;
  EXPECT_TRUE(SameBits(Rows(poisoned.out, kDims, kDims.out_row(), 0, first, n),
                       Rows(clean.out, kDims, kDims.out_row(), 0, first, n)));
  EXPECT_TRUE(SameBits(LseRows(poisoned, 0, first, n), LseRows(clean, 0, first, n)));
  EXPECT_TRUE(SameBits(Rows(poisoned.dqkv, kDims, kDims.row(), 0, first, n),
                       Rows(clean.dqkv, kDims, kDims.row(), 0, first, n)));
  // The poison did reach the other documents: the check above is not vacuous.
  const std::vector<float> other = Rows(poisoned.out, kDims, kDims.out_row(), 0, 0, first);
  EXPECT_TRUE(std::any_of(other.begin(), other.end(), [](float x) { return std::isnan(x); }));
}

// One document per row through doc_starts is the plain causal path, bit for bit.
TEST(PackedAttentionTest, OneDocumentPerRowIsPlainCausal) {
  AttentionRun plain(kDims, {}, 3);
  AttentionRun single(kDims, {0, 0}, 3);
  ASSERT_TRUE(plain.Forward().ok());
  ASSERT_TRUE(plain.Backward().ok());
  ASSERT_TRUE(single.Forward().ok());
  ASSERT_TRUE(single.Backward().ok());
  EXPECT_TRUE(SameBits(plain.out, single.out));
  EXPECT_TRUE(SameBits(plain.lse, single.lse));
  EXPECT_TRUE(SameBits(plain.dqkv, single.dqkv));
}

// Each (b, h, query tile) of the forward and each (b, kv head) of the backward is one task
// with a fixed order inside, so the thread count changes no bit.
TEST(PackedAttentionTest, BitwiseIdenticalForAnyThreadCount) {
  AttentionRun one(kDims, kPacking.Starts(kDims.t), 8);
  AttentionRun three = one;
  ASSERT_TRUE(one.Forward(1).ok());
  ASSERT_TRUE(one.Backward(1).ok());
  ASSERT_TRUE(three.Forward(3).ok());
  ASSERT_TRUE(three.Backward(3).ok());
  EXPECT_TRUE(SameBits(one.out, three.out));
  EXPECT_TRUE(SameBits(one.lse, three.lse));
  EXPECT_TRUE(SameBits(one.dqkv, three.dqkv));
}

// Block-diagonal causal attention in float64: query i of row b sees keys [doc(i), i].
void PackedAttentionRef(const Dims& dm, const std::vector<int32_t>& starts, int s,
                        const std::vector<double>& qkv, std::vector<double>* out) {
  out->assign(int64_t{dm.b} * dm.t * dm.out_row(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dm.d));
  for (int b = 0; b < dm.b; ++b) {
    for (int i = 0; i < dm.t; ++i) {
      int doc = 0;
      for (int k = 0; k < s; ++k) {
        if (starts[b * s + k] <= i) doc = starts[b * s + k];
      }
      for (int h = 0; h < dm.h; ++h) {
        const int g = h / (dm.h / dm.hkv);
        const double* q = qkv.data() + (int64_t{b} * dm.t + i) * dm.row() + h * dm.d;
        std::vector<double> sc;
        for (int j = doc; j <= i; ++j) {
          const double* k = qkv.data() + (int64_t{b} * dm.t + j) * dm.row() + (dm.h + g) * dm.d;
          double acc = 0;
          for (int d = 0; d < dm.d; ++d) acc += q[d] * k[d];
          sc.push_back(acc * scale);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double sum = 0;
        for (double x : sc) sum += std::exp(x - mx);
        double* o = out->data() + (int64_t{b} * dm.t + i) * dm.out_row() + h * dm.d;
        for (int j = doc; j <= i; ++j) {
          const double p = std::exp(sc[j - doc] - mx) / sum;
          const double* v =
              qkv.data() + (int64_t{b} * dm.t + j) * dm.row() + (dm.h + dm.hkv + g) * dm.d;
          for (int d = 0; d < dm.d; ++d) o[d] += p * v[d];
        }
      }
    }
  }
}

TEST(PackedAttentionTest, ForwardAndBackwardMatchTheFloat64Reference) {
  const Dims dm{2, 20, 2, 1, 4};
  const std::vector<int32_t> starts = {0, 7, 15, 0, 1, 20};  // row 1: 1 token, then 19
  AttentionRun run(dm, starts, 4);
  ASSERT_TRUE(run.Forward().ok());
  ASSERT_TRUE(run.Backward().ok());
  std::vector<double> want;
  PackedAttentionRef(dm, starts, 3, ToDouble(run.qkv), &want);
  // f32 sums of a handful of O(1) terms: ~1e-7 relative.
  EXPECT_LT(MaxRelativeError(run.out, want, 0.05), 1e-5);
  const std::vector<double> w = ToDouble(run.dout);
  const std::vector<double> fd =
      FiniteDifferenceGradient(ToDouble(run.qkv), [&](const std::vector<double>& x) {
        std::vector<double> out;
        PackedAttentionRef(dm, starts, 3, x, &out);
        double loss = 0;
        for (size_t i = 0; i < out.size(); ++i) loss += w[i] * out[i];
        return loss;
      });
  // As attention_test's finite differences: the float64 side is exact to ~1e-9, the kernel's
  // f32 gradient to ~1e-5 absolute; relative to |g| + 0.05.
  EXPECT_LT(MaxRelativeError(run.dqkv, fd, 0.05), 1e-4);
}

TEST(PackedAttentionTest, BadDocStartsNameTheElementAndTheRule) {
  const Dims dm{2, 10, 2, 1, 4};
  const auto message = [&](std::vector<int32_t> starts) {
    AttentionRun run(dm, std::move(starts), 5);
    return std::string(run.Forward().message());
  };
  EXPECT_NE(message({1, 4, 0, 4}).find("doc_starts[0][0] is 1"), std::string::npos);
  EXPECT_NE(message({0, 4, 0, 11}).find("doc_starts[1][1] is 11"), std::string::npos);
  EXPECT_NE(message({0, 4, 3, 0, 4, 5}).find("must not decrease"), std::string::npos);

  AttentionRun run(dm, {}, 6);
  const auto with = [&](Tensor doc_starts) {
    return AttentionForward(CpuContext(1), {.qkv = run.Qkv(),
                                            .out = run.Out(),
                                            .lse = run.Lse(),
                                            .n_head = 2,
                                            .n_kv_head = 1,
                                            .doc_starts = doc_starts});
  };
  std::vector<int32_t> three = {0, 4, 8};
  absl::Status s = with(Tensor(three.data(), DType::kI32, {1, 3}));
  EXPECT_NE(s.message().find("expected [2, S]"), std::string::npos) << s;
  std::vector<float> f32_starts(4);
  s = with(Tensor(f32_starts.data(), DType::kF32, {2, 2}));
  EXPECT_NE(s.message().find("doc_starts"), std::string::npos) << s;
}

}  // namespace
}  // namespace zt
