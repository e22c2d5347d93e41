// kernels/lora: the column-block copy and add of a fused projection's part, and the seeded
// dropout, against direct float references; bad arguments named.
#include "kernels/lora.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

TEST(ColumnsTest, CopyAndAddTouchOnlyTheirColumns) {
  constexpr int64_t M = 5, N = 9, n = 3, c0 = 4;
  std::vector<float> wide = Iota(M * N, -3.0f), part(M * n, 0.0f);
  const Tensor w(wide.data(), DType::kF32, {M, N}), p(part.data(), DType::kF32, {M, n});
  ASSERT_TRUE(ColumnsCopy(CpuContext(2), {.src = w, .col_begin = c0, .dst = p}).ok());
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < n; ++j) EXPECT_EQ(part[i * n + j], wide[i * N + c0 + j]);
  }
  const std::vector<float> before = wide;
  std::vector<float> src = Iota(M * n, 1.0f);
  ASSERT_TRUE(
      ColumnsAdd(CpuContext(2),
                 {.src = Tensor(src.data(), DType::kF32, {M, n}), .dst = w, .col_begin = c0})
          .ok());
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      const bool inside = j >= c0 && j < c0 + n;
      // Sums of quarter-integers this small are exact in f32.
      EXPECT_EQ(wide[i * N + j], before[i * N + j] + (inside ? src[i * n + j - c0] : 0.0f));
    }
  }
}

TEST(ColumnsTest, AddRoundsOnceIntoABf16Output) {
  std::vector<uint16_t> dst = {FloatToBf16(1.0f), FloatToBf16(2.0f)};
  std::vector<float> src = {0x1p-9f, 0.5f};
  ASSERT_TRUE(ColumnsAdd(CpuContext(1), {.src = Tensor(src.data(), DType::kF32, {1, 1}),
                                         .dst = Tensor(dst.data(), DType::kBF16, {1, 2}),
                                         .col_begin = 1})
                  .ok());
  EXPECT_EQ(dst[0], FloatToBf16(1.0f));
  EXPECT_EQ(dst[1], FloatToBf16(2.0f + 0x1p-9f));  // 2 + 2^-9 rounds to 2 in bf16
}

TEST(ColumnsTest, ColumnsOutsideTheMatrixAreRefusedByName) {
  std::vector<float> wide(12), part(6);
  const absl::Status s =
      ColumnsCopy(CpuContext(1), {.src = Tensor(wide.data(), DType::kF32, {2, 6}),
                                  .col_begin = 4,
                                  .dst = Tensor(part.data(), DType::kF32, {2, 3})});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("ColumnsCopy: columns [4, 7) of dst do not lie inside the 6 "
                                     "columns of src"));
}

TEST(LoraDropoutTest, KeepsAboutOneMinusPScaledAndRepeatsFromItsSeed) {
  constexpr int64_t n = 1 << 16;
  constexpr float p = 0.25f;
  std::vector<float> x(n, 2.0f), a(n), b(n);
  const Tensor xt(x.data(), DType::kF32, {n});
  ASSERT_TRUE(LoraDropout(CpuContext(2),
                          {.inp = xt, .out = Tensor(a.data(), DType::kF32, {n}), .p = p, .seed = 7})
                  .ok());
  ASSERT_TRUE(LoraDropout(CpuContext(1),
                          {.inp = xt, .out = Tensor(b.data(), DType::kF32, {n}), .p = p, .seed = 7})
                  .ok());
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(a[i], b[i]) << i;  // the same mask for any thread count
    ASSERT_TRUE(a[i] == 0.0f || a[i] == 2.0f / (1.0f - p)) << a[i];
    EXPECT_EQ(a[i] != 0.0f, LoraDropoutKeeps(7, i, p));
    kept += a[i] != 0.0f;
  }
  // Binomial(65536, 0.75): standard deviation ~111; 5 of them.
  EXPECT_NEAR(static_cast<double>(kept), 0.75 * n, 5 * 111.0);
  std::vector<float> c(n);
  ASSERT_TRUE(LoraDropout(CpuContext(1),
                          {.inp = xt, .out = Tensor(c.data(), DType::kF32, {n}), .p = p, .seed = 8})
                  .ok());
  EXPECT_NE(a, c);  // another seed, another mask
}

// A tensor-parallel rank's input columns of a row-parallel site draw the logical matrix's
// masks: the two halves dropped as shares put together are the whole matrix dropped, bit for
// bit (the same hash of the same index). Drawing by share index instead would part them.
TEST(LoraDropoutTest, ColumnSharesDrawTheLogicalMatrixsMasks) {
  constexpr int64_t M = 37, N = 96, n = N / 2;
  constexpr float p = 0.3f;
  std::vector<float> whole(M * N), dropped(M * N);
  for (int64_t i = 0; i < M * N; ++i) whole[i] = 0.25f + static_cast<float>(i % 13);
  ASSERT_TRUE(LoraDropout(CpuContext(2), {.inp = Tensor(whole.data(), DType::kF32, {M, N}),
                                          .out = Tensor(dropped.data(), DType::kF32, {M, N}),
                                          .p = p,
                                          .seed = 11})
                  .ok());
  int64_t differs_by_share_index = 0;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<float> share(M * n), out(M * n);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t j = 0; j < n; ++j) share[m * n + j] = whole[m * N + rank * n + j];
    }
    ASSERT_TRUE(LoraDropout(CpuContext(2), {.inp = Tensor(share.data(), DType::kF32, {M, n}),
                                            .out = Tensor(out.data(), DType::kF32, {M, n}),
                                            .p = p,
                                            .seed = 11,
                                            .logical_cols = N,
                                            .col_begin = rank * n})
                    .ok());
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(out[m * n + j], dropped[m * N + rank * n + j]) << rank << " " << m << " " << j;
        differs_by_share_index += LoraDropoutKeeps(11, m * n + j, p) !=
                                  LoraDropoutKeeps(11, m * N + rank * n + j, p);
      }
    }
  }
  EXPECT_GT(differs_by_share_index, 0);  // the test tells the two indexings apart
  std::vector<float> share(M * n), out(M * n);
  const absl::Status s =
      LoraDropout(CpuContext(1), {.inp = Tensor(share.data(), DType::kF32, {M, n}),
                                  .out = Tensor(out.data(), DType::kF32, {M, n}),
                                  .p = p,
                                  .logical_cols = N,
                                  .col_begin = n + 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("columns [49, 97) of logical_cols 96"));
}

TEST(LoraDropoutTest, ZeroCopiesAndOneIsRefused) {
  std::vector<float> x = {1.5f, -2.0f}, y(2);
  ASSERT_TRUE(LoraDropout(CpuContext(1), {.inp = Tensor(x.data(), DType::kF32, {2}),
                                          .out = Tensor(y.data(), DType::kF32, {2})})
                  .ok());
  EXPECT_EQ(y, x);
  const absl::Status s = LoraDropout(CpuContext(1), {.inp = Tensor(x.data(), DType::kF32, {2}),
                                                     .out = Tensor(y.data(), DType::kF32, {2}),
                                                     .p = 1.0f});
  EXPECT_THAT(s.message(), HasSubstr("LoraDropout: p is 1, must be in [0, 1)"));
}

}  // namespace
}  // namespace zt
