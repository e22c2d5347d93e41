// EmbeddingForward/Backward with explicit positions (packed sequences): learned positions
// restart at each document, the position table's gradient lands on the given rows, and a bad
// position is refused by element.
#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/embedding.h"

namespace zt {
namespace {

constexpr int64_t B = 2, T = 4, C = 3, V = 5, P = 6;

TEST(EmbeddingPositionsTest, ForwardAndBackwardUseTheGivenPositions) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  std::vector<float> wte(V * C), wpe(P * C), out(B * T * C), dout(B * T * C);
  for (float& x : wte) x = n(rng);
  for (float& x : wpe) x = n(rng);
  for (float& x : dout) x = n(rng);
  std::vector<int32_t> tokens = {1, 2, 3, 4, 0, 1, 2, 3};
  std::vector<int32_t> positions = {0, 1, 0, 1, 0, 1, 2, 0};  // documents of 2, 2 | 3, 1
  const DeviceContext ctx = CpuContext(2);
  const Tensor tok(tokens.data(), DType::kI32, {B, T});
  const Tensor pos(positions.data(), DType::kI32, {B, T});
  ASSERT_TRUE(EmbeddingForward(ctx, {.tokens = tok,
                                     .wte = Tensor(wte.data(), DType::kF32, {V, C}),
                                     .wpe = Tensor(wpe.data(), DType::kF32, {P, C}),
                                     .out = Tensor(out.data(), DType::kF32, {B, T, C}),
                                     .positions = pos})
                  .ok());
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t c = 0; c < C; ++c) {
      // One f32 addition, as the reference's: exact.
      EXPECT_EQ(out[bt * C + c], wte[tokens[bt] * C + c] + wpe[positions[bt] * C + c]);
    }
  }
  std::vector<float> dwte(V * C, 0.0f), dwpe(P * C, 0.0f);
  ASSERT_TRUE(EmbeddingBackward(ctx, {.tokens = tok,
                                      .dout = Tensor(dout.data(), DType::kF32, {B, T, C}),
                                      .dwte = Tensor(dwte.data(), DType::kF32, {V, C}),
                                      .dwpe = Tensor(dwpe.data(), DType::kF32, {P, C}),
                                      .positions = pos})
                  .ok());
  std::vector<double> want(P * C, 0.0);
  for (int64_t bt = 0; bt < B * T; ++bt) {
    for (int64_t c = 0; c < C; ++c) want[positions[bt] * C + c] += dout[bt * C + c];
  }
  // At most 4 f32 terms a row, summed in order: a few ulps against the float64 sum.
  for (int64_t i = 0; i < P * C; ++i) EXPECT_NEAR(dwpe[i], want[i], 1e-6 * (1 + std::abs(want[i])));
  // Rows 3.. are no position of this batch: untouched.
  for (int64_t i = 3 * C; i < P * C; ++i) EXPECT_EQ(dwpe[i], 0.0f);
}

TEST(EmbeddingPositionsTest, APositionOutsideTheRowIsRefusedByElement) {
  std::vector<float> wte(V * C), wpe(P * C), out(B * T * C);
  std::vector<int32_t> tokens(B * T, 0), positions(B * T, 0);
  positions[5] = static_cast<int32_t>(T);  // ≥ T: a restart never gets there
  const absl::Status s =
      EmbeddingForward(CpuContext(1), {.tokens = Tensor(tokens.data(), DType::kI32, {B, T}),
                                       .wte = Tensor(wte.data(), DType::kF32, {V, C}),
                                       .wpe = Tensor(wpe.data(), DType::kF32, {P, C}),
                                       .out = Tensor(out.data(), DType::kF32, {B, T, C}),
                                       .positions = Tensor(positions.data(), DType::kI32, {B, T})});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("positions[5] = 4 is outside [0, 4)"));
}

}  // namespace
}  // namespace zt
