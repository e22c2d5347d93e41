// Tests of kernels/packing.h: positions that restart at each document (the documented
// example), RoPE with them giving each document of a packed row exactly its rotation when run
// alone, and the document-start checks.
#include "kernels/packing.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/rope.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using ::zt::testing::RandomVector;
using ::zt::testing::SameBits;

TEST(DocumentPositionsTest, RestartAtEachDocument) {
  // The header's example: T = 10, row 0 documents of 4, 5 and 1 tokens, row 1 one of 10.
  std::vector<int32_t> starts = {0, 4, 9, 0, 10, 10};
  std::vector<int32_t> positions(20, -1);
  ASSERT_TRUE(DocumentPositions(CpuContext(1),
                                {.doc_starts = Tensor(starts.data(), DType::kI32, {2, 3}),
                                 .positions = Tensor(positions.data(), DType::kI32, {2, 10})})
                  .ok());
  const std::vector<int32_t> want = {0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(positions, want);
}

// A packed row of three documents rotated with DocumentPositions, against each document
// rotated alone with the default positions 0 … len − 1: the same bits.
TEST(DocumentPositionsTest, RopeOfAPackedRowEqualsEachDocumentAlone) {
  const int t = 23, h = 2, hkv = 1, d = 8;
  const int64_t row = int64_t{h + 2 * hkv} * d;
  const std::vector<int> lengths = {9, 10, 4};
  std::vector<int32_t> starts = {0, 9, 19};
  std::vector<int32_t> positions(t);
  ASSERT_TRUE(
      DocumentPositions(CpuContext(1), {.doc_starts = Tensor(starts.data(), DType::kI32, {1, 3}),
                                        .positions = Tensor(positions.data(), DType::kI32, {1, t})})
          .ok());
  std::vector<float> packed = RandomVector(t * row, 7);
  const std::vector<float> original = packed;
  ASSERT_TRUE(RopeApply(CpuContext(1), {.qkv = Tensor(packed.data(), DType::kF32, {1, t, row}),
                                        .n_head = h,
                                        .n_kv_head = hkv,
                                        .positions = Tensor(positions.data(), DType::kI32, {1, t})})
                  .ok());
  int t0 = 0;
  for (int len : lengths) {
    std::vector<float> alone(original.begin() + t0 * row, original.begin() + (t0 + len) * row);
    ASSERT_TRUE(RopeApply(CpuContext(1), {.qkv = Tensor(alone.data(), DType::kF32, {1, len, row}),
                                          .n_head = h,
                                          .n_kv_head = hkv})
                    .ok());
    EXPECT_TRUE(SameBits(
        alone, std::vector<float>(packed.begin() + t0 * row, packed.begin() + (t0 + len) * row)))
        << "document at " << t0;
    t0 += len;
  }
}

TEST(DocumentPositionsTest, BadStartsAreNamed) {
  std::vector<int32_t> positions(10);
  const auto message = [&](std::vector<int32_t> starts, int64_t s) {
    return std::string(
        DocumentPositions(CpuContext(1),
                          {.doc_starts = Tensor(starts.data(), DType::kI32, {2, s}),
                           .positions = Tensor(positions.data(), DType::kI32, {2, 5})})
            .message());
  };
  EXPECT_NE(message({0, 3, 2, 0}, 2).find("doc_starts[1][0] is 2"), std::string::npos);
  EXPECT_NE(message({0, 6, 0, 1}, 2).find("doc_starts[0][1] is 6"), std::string::npos);
  EXPECT_NE(message({0, 3, 2, 0, 1, 5}, 3).find("must not decrease"), std::string::npos);
  EXPECT_EQ(message({0, 5, 0, 5}, 2), "");
}

}  // namespace
}  // namespace zt
