// The element-wise ops on the GPU against the CPU ops (kernels/elementwise.h) on the same
// inputs, compared for equality: every op's result depends only on its own element (and, for
// the stochastic cast, its index), the conversions are the CPU's own bit operations
// (kernels/cuda/elementwise_bits.cuh) and an f32 add or multiply is IEEE on both, so the
// bits must match. Inputs are random bit patterns — every exponent, subnormals, infinities,
// NaNs with payloads — except for Add and Scale, where a NaN operand's result payload is
// hardware-defined (x86 keeps the first operand's, the GPU returns a canonical NaN); there
// NaN inputs are replaced, and a NaN made by inf − inf or 0 · inf equals any NaN. Sizes not a
// multiple of the 8-element packs, and buffers offset by one element so that the unaligned (scalar)
// path runs too.
#if ZT_HAVE_CUDA

#include "kernels/elementwise.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::ToHostBytes;

constexpr int64_t kN = 100003;  // odd: 12500 packs of 8 and a tail of 3
const DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// n random elements of `dtype` as bytes; NaNs replaced by 1 when `no_nan`.
std::vector<uint8_t> RandomBits(DType dtype, int64_t n, uint32_t seed, bool no_nan = false) {
  std::mt19937 rng(seed);
  const int64_t size = DTypeSize(dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(n * size));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = rng();
    if (size == 4) {
      // Half the elements of ordinary magnitude, where additions mostly round rather than
      // saturate or vanish.
      if (i % 2 == 0) {
        float f = std::ldexp(static_cast<float>(u % 20001) / 10000.0f - 1.0f,
                             static_cast<int>(u % 9) - 4);
        std::memcpy(&u, &f, 4);
      }
      if (no_nan && (u & 0x7fffffffu) > 0x7f800000u) u = 0x3f800000u;
      std::memcpy(&bytes[static_cast<size_t>(4 * i)], &u, 4);
    } else {
      uint16_t h = static_cast<uint16_t>(u);
      const bool nan = dtype == DType::kBF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
      if (no_nan && nan) h = dtype == DType::kBF16 ? 0x3f80u : 0x3c00u;
      std::memcpy(&bytes[static_cast<size_t>(2 * i)], &h, 2);
    }
  }
  return bytes;
}

// How ExpectSameBits treats NaNs.
enum class NaNs : uint8_t {
  kExact,     // bit operations (casts, splits): a NaN's sign and payload must match too
  kAnyEqual,  // arithmetic: inf − inf or 0 · inf makes a NaN whose bits the hardware picks
              // (x86's negative default NaN, the GPU's canonical 0x7fffffff)
};

bool IsNaN(uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::kBF16:
      return (bits & 0x7fffu) > 0x7f80u;
    case DType::kF16:
      return (bits & 0x7fffu) > 0x7c00u;
    default:
      return false;
  }
}

// The device tensor holds `want`'s elements bit for bit (NaNs as `nans` says); a mismatch
// names how many and the first, rather than printing both buffers.
void ExpectSameBits(const Tensor& device, const std::vector<uint8_t>& want, NaNs nans,
                    const std::string& what) {
  const std::vector<uint8_t> got = ToHostBytes(device);
  ASSERT_EQ(got.size(), want.size()) << what;
  const int64_t size = DTypeSize(device.dtype());
  int64_t mismatches = 0, first = -1;
  uint32_t first_got = 0, first_want = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(got.size()) / size; ++i) {
    uint32_t g = 0, w = 0;
    std::memcpy(&g, &got[static_cast<size_t>(i * size)], static_cast<size_t>(size));
    std::memcpy(&w, &want[static_cast<size_t>(i * size)], static_cast<size_t>(size));
    if (g == w ||
        (nans == NaNs::kAnyEqual && IsNaN(g, device.dtype()) && IsNaN(w, device.dtype()))) {
      continue;
    }
    if (first < 0) first = i, first_got = g, first_want = w;
    ++mismatches;
  }
  EXPECT_EQ(mismatches, 0) << what << ": first at element " << first << ", GPU bits 0x" << std::hex
                           << first_got << ", CPU bits 0x" << first_want;
}

// A device tensor of n elements holding `bytes`, starting `offset` elements into its buffer.
Tensor OnDevice(const std::vector<uint8_t>& bytes, DType dtype, int64_t n, DeviceBuffer& mem,
                int64_t offset = 0) {
  const int64_t size = DTypeSize(dtype);
  mem = DeviceBuffer((n + offset) * size);
  char* data = static_cast<char*>(mem.data()) + offset * size;
  EXPECT_EQ(cudaMemcpy(data, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return Tensor(data, dtype, {n}, gpu_test::Gpu0());
}

Tensor OnHost(std::vector<uint8_t>& bytes, DType dtype, int64_t n) {
  return Tensor(bytes.data(), dtype, {n});
}

class ElementwiseGpuTest : public ::testing::TestWithParam<int64_t> {
 protected:
  int64_t offset() const { return GetParam(); }
};

TEST_P(ElementwiseGpuTest, AddMatchesTheCpuBitsForEveryDtypeMix) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (DType ta : kFloatTypes) {
    for (DType tb : kFloatTypes) {
      for (DType tout : kFloatTypes) {
        std::vector<uint8_t> a = RandomBits(ta, kN, 1, true), b = RandomBits(tb, kN, 2, true);
        std::vector<uint8_t> out(static_cast<size_t>(kN * DTypeSize(tout)));
        DeviceBuffer ma, mb, mo;
        const Tensor ga = OnDevice(a, ta, kN, ma, offset()), gb = OnDevice(b, tb, kN, mb);
        const Tensor go = OnDevice(out, tout, kN, mo, offset());
        ASSERT_TRUE(
            Add(CpuContext(2), OnHost(a, ta, kN), OnHost(b, tb, kN), OnHost(out, tout, kN)).ok());
        ASSERT_TRUE(Add(gpu, ga, gb, go).ok());
        ExpectSameBits(
            go, out, NaNs::kAnyEqual,
            std::string(DTypeName(ta)) + " + " + DTypeName(tb) + " -> " + DTypeName(tout));
      }
    }
  }
}

TEST_P(ElementwiseGpuTest, AddInPlaceAndAliasedAddMatchTheCpuBits) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (DType t : kFloatTypes) {
    std::vector<uint8_t> acc = RandomBits(t, kN, 3, true),
                         x = RandomBits(DType::kBF16, kN, 4, true);
    DeviceBuffer ma, mx;
    const Tensor gacc = OnDevice(acc, t, kN, ma, offset()), gx = OnDevice(x, DType::kBF16, kN, mx);
    ASSERT_TRUE(AddInPlace(CpuContext(2), OnHost(acc, t, kN), OnHost(x, DType::kBF16, kN)).ok());
    ASSERT_TRUE(AddInPlace(gpu, gacc, gx).ok());
    ExpectSameBits(gacc, acc, NaNs::kAnyEqual, DTypeName(t));
    // out aliasing b: out = a + out.
    ASSERT_TRUE(
        Add(CpuContext(2), OnHost(x, DType::kBF16, kN), OnHost(acc, t, kN), OnHost(acc, t, kN))
            .ok());
    ASSERT_TRUE(Add(gpu, gx, gacc, gacc).ok());
    ExpectSameBits(gacc, acc, NaNs::kAnyEqual, std::string(DTypeName(t)) + " aliased");
  }
}

TEST_P(ElementwiseGpuTest, ScaleMatchesTheCpuBits) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (DType t : kFloatTypes) {
    for (float s : {0.0f, -1.5f, 1.0f / 3.0f, 65504.0f}) {
      std::vector<uint8_t> x = RandomBits(t, kN, 5, true);
      DeviceBuffer mx;
      const Tensor gx = OnDevice(x, t, kN, mx, offset());
      ASSERT_TRUE(Scale(CpuContext(2), OnHost(x, t, kN), s).ok());
      ASSERT_TRUE(Scale(gpu, gx, s).ok());
      ExpectSameBits(gx, x, NaNs::kAnyEqual, std::string(DTypeName(t)) + " * " + std::to_string(s));
    }
  }
}

TEST_P(ElementwiseGpuTest, ZeroClearsEveryByte) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  std::mt19937 rng(6);
  for (DType t : {DType::kF32, DType::kBF16, DType::kI16, DType::kU8}) {
    std::vector<uint8_t> x(static_cast<size_t>(kN * DTypeSize(t)));
    for (uint8_t& byte : x) byte = static_cast<uint8_t>(rng() | 1u);
    DeviceBuffer mx;
    const Tensor gx = OnDevice(x, t, kN, mx, offset());
    ASSERT_TRUE(Zero(gpu_test::CudaContext(stream), gx).ok());
    ExpectSameBits(gx, std::vector<uint8_t>(x.size(), 0), NaNs::kExact, DTypeName(t));
  }
}

TEST_P(ElementwiseGpuTest, CastMatchesTheCpuBitsNaNsIncluded) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (DType from : kFloatTypes) {
    for (DType to : kFloatTypes) {
      std::vector<uint8_t> src = RandomBits(from, kN, 7);
      std::vector<uint8_t> dst(static_cast<size_t>(kN * DTypeSize(to)));
      DeviceBuffer ms, md;
      const Tensor gs = OnDevice(src, from, kN, ms, offset()), gd = OnDevice(dst, to, kN, md);
      ASSERT_TRUE(Cast(CpuContext(2), OnHost(src, from, kN), OnHost(dst, to, kN)).ok());
      ASSERT_TRUE(Cast(gpu, gs, gd).ok());
      ExpectSameBits(gd, dst, NaNs::kExact, std::string(DTypeName(from)) + " -> " + DTypeName(to));
    }
  }
}

TEST_P(ElementwiseGpuTest, CastStochasticMatchesTheCpuBits) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (uint64_t seed : {uint64_t{0}, uint64_t{0x243f6a8885a308d3ull}}) {
    std::vector<uint8_t> src = RandomBits(DType::kF32, kN, 8);
    std::vector<uint8_t> dst(static_cast<size_t>(kN * 2));
    DeviceBuffer ms, md;
    const Tensor gs = OnDevice(src, DType::kF32, kN, ms, offset());
    const Tensor gd = OnDevice(dst, DType::kBF16, kN, md, offset());
    ASSERT_TRUE(CastStochastic(CpuContext(2), OnHost(src, DType::kF32, kN),
                               OnHost(dst, DType::kBF16, kN), seed)
                    .ok());
    ASSERT_TRUE(CastStochastic(gpu, gs, gd, seed).ok());
    ExpectSameBits(gd, dst, NaNs::kExact, "seed " + std::to_string(seed));
  }
}

TEST_P(ElementwiseGpuTest, SplitAndJoinMasterMatchTheCpuBits) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  std::vector<uint8_t> src = RandomBits(DType::kF32, kN, 9);
  std::vector<uint8_t> high(static_cast<size_t>(kN * 2)), low(static_cast<size_t>(kN * 2));
  std::vector<uint8_t> high_only(static_cast<size_t>(kN * 2));
  DeviceBuffer ms, mh, ml, mho;
  const Tensor gs = OnDevice(src, DType::kF32, kN, ms, offset());
  const Tensor gh = OnDevice(high, DType::kBF16, kN, mh);
  const Tensor gl = OnDevice(low, DType::kI16, kN, ml, offset());
  const Tensor gho = OnDevice(high_only, DType::kBF16, kN, mho);
  const Tensor src_host = OnHost(src, DType::kF32, kN);
  ASSERT_TRUE(SplitMasterWeights(CpuContext(2), src_host, OnHost(high, DType::kBF16, kN),
                                 OnHost(low, DType::kI16, kN))
                  .ok());
  ASSERT_TRUE(
      SplitMasterWeights(CpuContext(2), src_host, OnHost(high_only, DType::kBF16, kN), Tensor())
          .ok());
  ASSERT_TRUE(SplitMasterWeights(gpu, gs, gh, gl).ok());
  ASSERT_TRUE(SplitMasterWeights(gpu, gs, gho, Tensor()).ok());
  ExpectSameBits(gh, high, NaNs::kExact, "high");
  ExpectSameBits(gl, low, NaNs::kExact, "low");
  ExpectSameBits(gho, high_only, NaNs::kExact, "high without low");

  // Join random halves (not only those of a split), so every bit pattern is exercised.
  std::vector<uint8_t> rh = RandomBits(DType::kBF16, kN, 10), rl = RandomBits(DType::kBF16, kN, 11);
  std::vector<uint8_t> joined(static_cast<size_t>(kN * 4));
  DeviceBuffer mrh, mrl, mj;
  const Tensor grh = OnDevice(rh, DType::kBF16, kN, mrh, offset());
  const Tensor grl = OnDevice(rl, DType::kI16, kN, mrl);
  const Tensor gj = OnDevice(joined, DType::kF32, kN, mj, offset());
  ASSERT_TRUE(JoinMasterWeights(CpuContext(2), OnHost(rh, DType::kBF16, kN),
                                OnHost(rl, DType::kI16, kN), OnHost(joined, DType::kF32, kN))
                  .ok());
  ASSERT_TRUE(JoinMasterWeights(gpu, grh, grl, gj).ok());
  ExpectSameBits(gj, joined, NaNs::kExact, "joined");
}

TEST_P(ElementwiseGpuTest, EmptyAndOneElementTensors) {
  ZT_SKIP_WITHOUT_GPU();
  const GpuStream stream;
  const DeviceContext gpu = gpu_test::CudaContext(stream);
  for (int64_t n : {int64_t{0}, int64_t{1}}) {
    std::vector<uint8_t> a = RandomBits(DType::kF32, n, 12, true);
    std::vector<uint8_t> out(static_cast<size_t>(n * 2));
    DeviceBuffer ma, mo;
    const Tensor ga = OnDevice(a, DType::kF32, n, ma, offset());
    const Tensor go = OnDevice(out, DType::kBF16, n, mo, offset());
    ASSERT_TRUE(Add(CpuContext(1), OnHost(a, DType::kF32, n), OnHost(a, DType::kF32, n),
                    OnHost(out, DType::kBF16, n))
                    .ok());
    ASSERT_TRUE(Add(gpu, ga, ga, go).ok());
    ExpectSameBits(go, out, NaNs::kAnyEqual, std::to_string(n));
  }
}

INSTANTIATE_TEST_SUITE_P(Offsets, ElementwiseGpuTest, ::testing::Values(0, 1),
                         [](const auto& info) {
                           return info.param == 0 ? std::string("aligned")
                                                  : std::string("offset_by_one");
                         });

TEST(ElementwiseGpuCheckTest, RefusesATensorOnAnotherDevice) {
  // Runs without a GPU: the entry point's check comes before any CUDA call.
  std::vector<float> x(16);
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  const Tensor gpu(x.data(), DType::kF32, {16}, gpu_test::Gpu0());
  const Tensor host(x.data(), DType::kF32, {16});
  const absl::Status s = Add(ctx, gpu, host, gpu);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b is on cpu:0"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
