// The device side of kernels/cpu/param_copy.h for the CUDA optimizers (kernels/cuda/
// {optimizer,adam8bit,adafactor}.cu): how the f32 master parameter is stored with its 16-bit
// copy, as a template argument so that each mode is one kernel with no per-element switch.
// The bit-level conversions are the CPU's (kernels/dtype.h, kernels/cpu/load_store.h), written
// on the bits rather than with cuda_bf16.h's intrinsics so that the copies a GPU writes are
// the CPU's bit for bit, NaN included: bf16 to nearest even; bf16 stochastic from the same
// SplitMix64 hash of (seed, element index); the split master's bf16 high half (ties away from
// zero) and int16 low half. f16 copies use __float2half_rn (IEEE nearest even, as ToHalf).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cpu/param_copy.h"

namespace zt::cuda {

using cpu::CopyMode;

__device__ __forceinline__ uint16_t Bf16Nearest(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ uint64_t HashIndex(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ uint16_t Bf16Stochastic(float f, uint64_t seed, uint64_t index) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t noise = static_cast<uint32_t>(HashIndex(seed, index)) & 0xffffu;
  return static_cast<uint16_t>((u + noise) >> 16);
}

// The master parameters of an update and their 16-bit copy (MasterParams on the CPU).
template <CopyMode M>
struct DeviceMaster {
  void* param = nullptr;
  void* copy = nullptr;
  uint64_t seed = 0;

  __device__ __forceinline__ float Load(int64_t i) const {
    if constexpr (M == CopyMode::kBf16Split) {
      const uint32_t high = static_cast<const uint16_t*>(copy)[i];
      const int32_t low = static_cast<const int16_t*>(param)[i];
      return __uint_as_float((high << 16) + static_cast<uint32_t>(low));
    } else {
      return static_cast<const float*>(param)[i];
    }
  }

  // Element i becomes p; `counter` is its stochastic rounding's hash index (its index in the
  // whole tensor).
  __device__ __forceinline__ void Store(int64_t i, float p, int64_t counter) const {
    uint16_t* c = static_cast<uint16_t*>(copy);
    if constexpr (M == CopyMode::kBf16Split) {
      const uint32_t u = __float_as_uint(p);
      if ((u & 0x7fffffffu) > 0x7f800000u) {
        c[i] = static_cast<uint16_t>((u >> 16) | 0x40u);
        static_cast<int16_t*>(param)[i] = 0;
      } else {
        const uint32_t high = (u + 0x8000u) >> 16;
        c[i] = static_cast<uint16_t>(high);
        static_cast<int16_t*>(param)[i] =
            static_cast<int16_t>(static_cast<uint16_t>(u - (high << 16)));
      }
    } else {
      static_cast<float*>(param)[i] = p;
      if constexpr (M == CopyMode::kBf16) {
        c[i] = Bf16Nearest(p);
      } else if constexpr (M == CopyMode::kF16) {
        c[i] = __half_as_ushort(__float2half_rn(p));
      } else if constexpr (M == CopyMode::kBf16Stochastic) {
        c[i] = Bf16Stochastic(p, seed, static_cast<uint64_t>(counter));
      }
    }
  }
};

// Host side: the view a kernel takes of the master and its copy.
template <CopyMode M>
DeviceMaster<M> DeviceMasterOf(const Tensor& param, const Tensor& param_copy, uint64_t seed) {
  return {param.raw(), param_copy.empty() ? nullptr : param_copy.raw(), seed};
}

// Calls f(G{}, std::integral_constant<CopyMode, mode>{}) with G the gradient's storage type
// (float, __nv_bfloat16 or __half) and the master's mode for these arguments, and returns
// what f returns. Host side.
template <typename F>
decltype(auto) DispatchGradCopy(const Tensor& grad, const Tensor& param, const Tensor& param_copy,
                                bool stochastic, F&& f) {
  const CopyMode mode = cpu::CopyModeFor(param, param_copy, stochastic);
  auto with_grad = [&](auto m) -> decltype(auto) {
    switch (grad.dtype()) {
      case DType::kBF16:
        return f(__nv_bfloat16{}, m);
      case DType::kF16:
        return f(__half{}, m);
      default:
        return f(float{}, m);
    }
  };
  switch (mode) {
    case CopyMode::kNone:
      return with_grad(std::integral_constant<CopyMode, CopyMode::kNone>{});
    case CopyMode::kBf16:
      return with_grad(std::integral_constant<CopyMode, CopyMode::kBf16>{});
    case CopyMode::kF16:
      return with_grad(std::integral_constant<CopyMode, CopyMode::kF16>{});
    case CopyMode::kBf16Stochastic:
      return with_grad(std::integral_constant<CopyMode, CopyMode::kBf16Stochastic>{});
    default:  // CopyMode::kBf16Split
      return with_grad(std::integral_constant<CopyMode, CopyMode::kBf16Split>{});
  }
}

// Adam's per-call scalars (AdamWUpdate and AdamW8bitUpdate), the bias corrections in double
// as the CPU computes them: β2^t for t in the thousands is where f32 pow loses digits.
struct AdamScalars {
  float b1, b2, inv_bc1, inv_bc2, lr, eps, wd, gs;
};

template <typename Args>
AdamScalars AdamScalarsOf(const Args& a) {
  const double t = static_cast<double>(a.step);
  return {
      .b1 = a.beta1,
      .b2 = a.beta2,
      .inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta1), t))),
      .inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta2), t))),
      .lr = a.lr,
      .eps = a.eps,
      .wd = a.weight_decay,
      .gs = a.grad_scale,
  };
}

// The new master value from Adam's new moments m and v and the old value.
__device__ __forceinline__ float AdamStep(const AdamScalars& s, float m, float v, float old) {
  const float update = (m * s.inv_bc1) / (sqrtf(v * s.inv_bc2) + s.eps);
  return old - s.lr * (update + s.wd * old);
}

}  // namespace zt::cuda
