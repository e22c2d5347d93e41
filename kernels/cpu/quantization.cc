// CPU block-wise quantization: blocks are independent, so they are spread over the threads
// with a static schedule and each block is quantized by one thread in a fixed order — any
// thread count gives the same bytes.
#include "kernels/cpu/quantization.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace zt::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallel = 1 << 15;

CodeSearch BuildCodeSearch(const std::array<float, 256>& map) {
  CodeSearch s;
  for (int k = 0; k < 255; ++k) {
    // The sum of two neighbouring f32 values and its half are exact in double.
    const double mid = (static_cast<double>(map[k]) + map[k + 1]) / 2;
    float t = static_cast<float>(mid);
    if (t > mid) t = std::nextafter(t, -std::numeric_limits<float>::infinity());
    s.thresholds[k] = t;
  }
  s.thresholds[255] = std::numeric_limits<float>::infinity();
  const auto count_below = [&](float x) {
    return static_cast<int32_t>(
        std::lower_bound(s.thresholds.begin(), s.thresholds.begin() + 255, x) -
        s.thresholds.begin());
  };
  const float inf = std::numeric_limits<float>::infinity();
  for (int32_t b = 0; b < CodeSearch::kPerSign; ++b) {
    // Bucket b of either sign holds magnitudes [low, high]; the first one reaches down to 0,
    // the last one up to infinity.
    const float low =
        b == 0 ? 0.0f
               : std::bit_cast<float>(CodeSearch::kMinBits + (uint32_t(b) << CodeSearch::kShift));
    const float high = b == CodeSearch::kPerSign - 1
                           ? inf
                           : std::bit_cast<float>(CodeSearch::kMinBits +
                                                  (uint32_t(b + 1) << CodeSearch::kShift) - 1);
    s.first[CodeSearch::kPerSign + b] = count_below(low);
    s.first[CodeSearch::kPerSign - 1 - b] = count_below(-high);
  }
  return s;
}

}  // namespace

const CodeSearch& CodeSearchFor(DynamicMap map) {
  static const CodeSearch signed_search = BuildCodeSearch(DynamicMapSigned());
  static const CodeSearch unsigned_search = BuildCodeSearch(DynamicMapUnsigned());
  return map == DynamicMap::kSigned ? signed_search : unsigned_search;
}

void BlockQuantize(const DeviceContext& ctx, const BlockQuantizeArgs& args) {
  const int64_t n = args.src.numel(), block = args.block;
  const int64_t num_blocks = NumQuantBlocks(n, block);
  const float* src = args.src.data<float>();
  uint8_t* codes = args.codes.data<uint8_t>();
  float* absmax = args.absmax.data<float>();
  const CodeSearch& search = CodeSearchFor(args.map);
  const uint8_t zero_code = ZeroCode(args.map);

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * block, len = std::min(block, n - begin);
    const float* x = src + begin;
    uint8_t* c = codes + begin;
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(x[i]));
    absmax[b] = amax;
    if (amax == 0.0f) {
      std::memset(c, zero_code, static_cast<size_t>(len));
      continue;
    }
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) c[i] = NearestCode(search, x[i] / amax);
  }
}

void BlockDequantize(const DeviceContext& ctx, const BlockDequantizeArgs& args) {
  const int64_t n = args.dst.numel(), block = args.block;
  const int64_t num_blocks = NumQuantBlocks(n, block);
  const uint8_t* codes = args.codes.data<uint8_t>();
  const float* absmax = args.absmax.data<float>();
  float* dst = args.dst.data<float>();
  const float* map = MapValues(args.map);

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static) if (n >= kMinParallel)
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t begin = b * block, len = std::min(block, n - begin);
    const float amax = absmax[b];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) dst[begin + i] = map[codes[begin + i]] * amax;
  }
}

}  // namespace zt::cpu
