// CPU NF4 quantization. Blocks are independent and each is quantized by one thread in a fixed
// order; the only reduction over blocks (the mean of the absmax values) is summed serially in
// float64 in block order, so any thread count gives the same bytes.
#include "kernels/cpu/nf4.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/quantization.h"

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;

std::array<float, 15> BuildThresholds() {
  const std::array<float, 16>& levels = Nf4Levels();
  std::array<float, 15> t{};
  for (int k = 0; k < 15; ++k) {
    // The sum of two f32 values and its half are exact in double.
    const double mid = (static_cast<double>(levels[k]) + levels[k + 1]) / 2;
    float f = static_cast<float>(mid);
    if (f > mid) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
    t[k] = f;
  }
  return t;
}

// Double quantization of the exact absmax values `amax` (kernels/nf4.h): writes the codes,
// group scales and mean into dst and replaces each amax[b] by the A_b dequantization reads.
void DoubleQuantizeAbsmax(const DeviceContext& ctx, std::vector<float>& amax,
                          const Nf4Tensor& dst) {
  const int64_t blocks = static_cast<int64_t>(amax.size());
  double sum = 0;
  for (float a : amax) sum += a;
  const float mean = static_cast<float>(sum / static_cast<double>(blocks));
  dst.absmax_offset.data<float>()[0] = mean;
  const int64_t groups = NumQuantBlocks(blocks, kNf4AbsmaxGroup);
  const CodeSearch& search = CodeSearchFor(DynamicMap::kSigned);
  const float* map = DynamicMapSigned().data();
  uint8_t* codes = dst.absmax.data<uint8_t>();
  float* scales = dst.absmax_scale.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (blocks > 4096)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t lo = g * kNf4AbsmaxGroup;
    const int64_t hi = std::min(blocks, lo + kNf4AbsmaxGroup);
    float s = 0.0f;
    for (int64_t b = lo; b < hi; ++b) s = std::max(s, std::abs(amax[b] - mean));
    scales[g] = s;
    for (int64_t b = lo; b < hi; ++b) {
      codes[b] = s > 0.0f ? NearestCode(search, (amax[b] - mean) / s) : kDynamicSignedZeroCode;
      amax[b] = std::fma(map[codes[b]], s, mean);
    }
  }
}

}  // namespace

const std::array<float, 15>& Nf4Thresholds() {
  static const std::array<float, 15> t = BuildThresholds();
  return t;
}

absl::Status Nf4Quantize(const DeviceContext& ctx, const Nf4QuantizeArgs& args) {
  const int64_t n = args.src.numel();
  const float* x = args.src.data<float>();
  int64_t first_bad = n;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) \
    reduction(min                                                      \
              : first_bad) if (n > kMinParallel)
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) first_bad = std::min(first_bad, i);
  }
  if (first_bad < n) {
    return absl::InvalidArgumentError(absl::StrCat("Nf4Quantize: src[", first_bad, "] is ",
                                                   x[first_bad],
                                                   ", NF4 quantizes finite values only"));
  }
  const Nf4Tensor& dst = args.dst;
  const int64_t blocks = NumQuantBlocks(n, kNf4Block);
  std::vector<float> amax(blocks);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n > kMinParallel)
  for (int64_t b = 0; b < blocks; ++b) {
    float m = 0.0f;
    for (int64_t i = b * kNf4Block; i < std::min(n, (b + 1) * kNf4Block); ++i) {
      m = std::max(m, std::abs(x[i]));
    }
    amax[b] = m;
  }
  if (dst.format == Nf4Absmax::kDoubleQuantized) {
    DoubleQuantizeAbsmax(ctx, amax, dst);
  } else {
    std::copy(amax.begin(), amax.end(), dst.absmax.data<float>());
  }
  const float* thresholds = Nf4Thresholds().data();
  uint8_t* codes = dst.codes.data<uint8_t>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n > kMinParallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const float scale = amax[b];
    const int64_t begin = b * kNf4Block;
    const int64_t end = std::min(n, begin + kNf4Block);
    const auto code_of = [&](int64_t i) {
      return scale != 0.0f ? Nf4NearestCode(thresholds, x[i] / scale) : kNf4ZeroCode;
    };
    // A block starts at an even element, so it owns whole bytes.
    for (int64_t i = begin; i < end; i += 2) {
      const uint8_t low = i + 1 < end ? code_of(i + 1) : 0;
      codes[i >> 1] = static_cast<uint8_t>(code_of(i) << 4 | low);
    }
  }
  return absl::OkStatus();
}

void Nf4Dequantize(const DeviceContext& ctx, const Nf4DequantizeArgs& args) {
  const Nf4Tensor& src = args.src;
  const int64_t n = src.numel;
  const int64_t blocks = NumQuantBlocks(n, kNf4Block);
  float* dst = args.dst.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n > kMinParallel)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4Block;
    Nf4DequantizeTile(src, n, 0, 1, begin, std::min(n, begin + kNf4Block), dst + begin, 0);
  }
}

}  // namespace zt::cpu
