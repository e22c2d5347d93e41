// Compile-time storage dispatch for the optimizers' streaming loops: the gradient's dtype and
// how the updated f32 master parameter is written to its 16-bit copy (none, bf16 or f16 to
// nearest even, or bf16 stochastically) become template arguments, so each combination is
// one vectorized loop with no per-element switch.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cpu/load_store.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace zt::cpu {

enum class CopyMode : uint8_t { kNone, kBf16, kF16, kBf16Stochastic };

inline CopyMode CopyModeFor(const Tensor& param_copy, bool stochastic) {
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
