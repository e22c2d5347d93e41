// The master parameters of an optimizer test on both sides (tests/gpu/kernels/twin.h), in one
// of the storage modes the optimizers take: f32 alone, f32 with a bf16 / f16 / stochastically
// rounded bf16 copy, or a split master (i16 low halves + bf16 high halves).
#pragma once

#if ZT_HAVE_CUDA

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "tests/gpu/kernels/twin.h"

namespace zt::gpu_test {

enum class MasterMode { kF32, kBf16Copy, kF16Copy, kBf16Stochastic, kSplit };

inline std::string MasterModeName(MasterMode m) {
  switch (m) {
    case MasterMode::kF32:
      return "f32";
    case MasterMode::kBf16Copy:
      return "bf16_copy";
    case MasterMode::kF16Copy:
      return "f16_copy";
    case MasterMode::kBf16Stochastic:
      return "bf16_stochastic";
    case MasterMode::kSplit:
      return "split";
  }
  return "?";
}

struct MasterTwin {
  MasterMode mode;
  Twin param, copy;

  MasterTwin(MasterMode m, const std::vector<float>& values) : mode(m) {
    const int64_t n = static_cast<int64_t>(values.size());
    if (m == MasterMode::kSplit) {
      std::vector<uint16_t> high(values.size());
      std::vector<int16_t> low(values.size());
      for (size_t i = 0; i < values.size(); ++i) {
        const SplitMasterBits b = SplitMaster(values[i]);
        high[i] = b.high;
        low[i] = b.low;
      }
      param = Twin::Of(low, DType::kI16, {n});
      copy = Twin::Of(high, DType::kBF16, {n});
      return;
    }
    param = Twin::Floats(values, DType::kF32, {n});
    if (m == MasterMode::kF16Copy) {
      copy = Twin::Floats(values, DType::kF16, {n});
    } else if (m != MasterMode::kF32) {
      copy = Twin::Floats(values, DType::kBF16, {n});
    }
  }
  bool stochastic() const { return mode == MasterMode::kBf16Stochastic; }
  bool has_copy() const { return mode != MasterMode::kF32; }

  // The f32 master values (joined from the halves for a split master).
  std::vector<float> Master(bool gpu) {
    if (mode != MasterMode::kSplit) return gpu ? param.GpuFloats() : param.CpuFloats();
    const std::vector<uint8_t> low = gpu ? param.GpuBytes() : param.CpuBytes();
    const std::vector<uint8_t> high = gpu ? copy.GpuBytes() : copy.CpuBytes();
    std::vector<float> out(low.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      int16_t l;
      uint16_t h;
      std::memcpy(&l, low.data() + 2 * i, 2);
      std::memcpy(&h, high.data() + 2 * i, 2);
      out[i] = JoinMaster(h, l);
    }
    return out;
  }
};

// A 16-bit copy is its master rounded once (with the same hash noise when stochastic): GPU
// and CPU copies differ by one of their ulps only where the masters' last-bit difference
// crosses a rounding boundary, so about one ulp over the whole buffer (bf16 2^-8, f16 2^-11
// relative) bounds their normalized error; a wrong element or rounding rule is O(1).
inline double CopyBound(MasterMode m) { return m == MasterMode::kF16Copy ? 5e-4 : 4e-3; }

// The GPU's master within `master_bound` of the CPU's, and its copy within CopyBound.
inline void ExpectSameMaster(MasterTwin& p, double master_bound) {
  EXPECT_LT(NormalizedError(p.Master(true), p.Master(false)), master_bound);
  if (p.has_copy()) {
    EXPECT_LT(NormalizedError(p.copy.GpuFloats(), p.copy.CpuFloats()), CopyBound(p.mode));
  }
}

inline std::vector<MasterMode> AllMasterModes() {
  return {MasterMode::kF32, MasterMode::kBf16Copy, MasterMode::kF16Copy,
          MasterMode::kBf16Stochastic, MasterMode::kSplit};
}

}  // namespace zt::gpu_test

#endif  // ZT_HAVE_CUDA
