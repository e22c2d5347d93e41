// Compile-time storage dispatch for the optimizers' streaming loops: the gradient's dtype and
// how the f32 master parameter is stored with its 16-bit copy (no copy; a bf16 or f16 copy to
// nearest even; a bf16 copy rounded stochastically; or a split master, whose bf16 copy is its
// high half and whose i16 `param` buffer holds its low half) become template arguments, so
// each combination is one vectorized loop with no per-element switch. The loops reach the
// master only through MasterParams, so every optimizer supports every mode.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/load_store.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace zt::cpu {

enum class CopyMode : uint8_t { kNone, kBf16, kF16, kBf16Stochastic, kBf16Split };

inline CopyMode CopyModeFor(const Tensor& param, const Tensor& param_copy, bool stochastic) {
  if (param.dtype() == DType::kI16) return CopyMode::kBf16Split;
  if (param_copy.empty()) return CopyMode::kNone;
  if (param_copy.dtype() == DType::kF16) return CopyMode::kF16;
  return stochastic ? CopyMode::kBf16Stochastic : CopyMode::kBf16;
}

// Element i of a buffer whose dtype is the template argument, as f32.
template <DType D>
inline float LoadAs(const void* p, int64_t i) {
  if constexpr (D == DType::kBF16) {
    return FromBf16(static_cast<const uint16_t*>(p)[i]);
  } else if constexpr (D == DType::kF16) {
    return FromHalf(static_cast<const uint16_t*>(p)[i]);
  } else {
    return static_cast<const float*>(p)[i];
  }
}

// The 16-bit copy of an updated parameter, element i (the stochastic hash's counter).
template <CopyMode M>
inline void StoreCopy(void* copy, int64_t i, float p, uint64_t seed) {
  uint16_t* c = static_cast<uint16_t*>(copy);
  if constexpr (M == CopyMode::kBf16) {
    c[i] = ToBf16(p);
  } else if constexpr (M == CopyMode::kF16) {
    c[i] = ToHalf(p);
  } else if constexpr (M == CopyMode::kBf16Stochastic) {
    c[i] = ToBf16Stochastic(p, seed, static_cast<uint64_t>(i));
  }
}

// The master parameters of an update (f32, or split into the copy's bf16 high halves and
// `param`'s i16 low halves) and their 16-bit copy, from element `offset` on.
template <CopyMode M>
struct MasterParams {
  void* param = nullptr;
  void* copy = nullptr;
  uint64_t seed = 0;

  float Load(int64_t i) const {
    if constexpr (M == CopyMode::kBf16Split) {
      return JoinMaster(static_cast<const uint16_t*>(copy)[i],
                        static_cast<const int16_t*>(param)[i]);
    } else {
      return static_cast<const float*>(param)[i];
    }
  }
  // Element i becomes p; `counter` is its stochastic rounding's hash index (the element's
  // index in the whole tensor when the buffers hold a shard of it).
  void Store(int64_t i, float p, int64_t counter) const {
    if constexpr (M == CopyMode::kBf16Split) {
      const SplitMasterBits b = SplitMaster(p);
      static_cast<uint16_t*>(copy)[i] = b.high;
      static_cast<int16_t*>(param)[i] = b.low;
    } else {
      static_cast<float*>(param)[i] = p;
      if constexpr (M == CopyMode::kBf16Stochastic) {
        static_cast<uint16_t*>(copy)[i] = ToBf16Stochastic(p, seed, static_cast<uint64_t>(counter));
      } else {
        StoreCopy<M>(copy, i, p, seed);
      }
    }
  }
  void Store(int64_t i, float p) const { Store(i, p, i); }
  // The same buffers from element k on.
  MasterParams At(int64_t k) const {
    constexpr int64_t kMasterBytes = M == CopyMode::kBf16Split ? 2 : 4;
    return {static_cast<char*>(param) + k * kMasterBytes,
            copy == nullptr ? nullptr : static_cast<char*>(copy) + k * 2, seed};
  }
};

template <CopyMode M>
MasterParams<M> MasterParamsOf(const Tensor& param, const Tensor& param_copy, uint64_t seed) {
  return {param.raw(), param_copy.raw(), seed};
}

// Calls f(std::integral_constant<DType, grad>, std::integral_constant<CopyMode, mode>).
template <typename F>
void DispatchGradCopy(DType grad, CopyMode mode, F&& f) {
  auto with_copy = [&](auto g) {
    switch (mode) {
      case CopyMode::kNone:
        return f(g, std::integral_constant<CopyMode, CopyMode::kNone>{});
      case CopyMode::kBf16:
        return f(g, std::integral_constant<CopyMode, CopyMode::kBf16>{});
      case CopyMode::kF16:
        return f(g, std::integral_constant<CopyMode, CopyMode::kF16>{});
      case CopyMode::kBf16Stochastic:
        return f(g, std::integral_constant<CopyMode, CopyMode::kBf16Stochastic>{});
      case CopyMode::kBf16Split:
        return f(g, std::integral_constant<CopyMode, CopyMode::kBf16Split>{});
    }
  };
  switch (grad) {
    case DType::kBF16:
      return with_copy(std::integral_constant<DType, DType::kBF16>{});
    case DType::kF16:
      return with_copy(std::integral_constant<DType, DType::kF16>{});
    default:
      return with_copy(std::integral_constant<DType, DType::kF32>{});
  }
}

}  // namespace zt::cpu
