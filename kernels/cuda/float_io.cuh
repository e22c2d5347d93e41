// Loading and storing f32/bf16/f16 elements in f32 on the device: the CUDA side of
// kernels/cpu/load_store.h, with the same rule. An op loads each element to f32, computes in
// f32 and rounds once, to nearest even, when it stores (cuda_bf16.h's and cuda_fp16.h's _rn
// conversions are IEEE round-to-nearest-even, as dtype.h's FloatToBf16/FloatToHalf are), so
// a GPU op and its CPU twin differ only by the order of their f32 sums.
//
// Two ways in: `FloatPtr`, a pointer that carries its dtype at run time (one warp-uniform
// branch per access; for ops whose tensors may each have their own dtype), and the typed
// `ToFloat`/`FromFloat` for kernels templated on one storage type (DispatchFloatType).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace zt::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) { return __float2half_rn(x); }

// A float tensor's data and its storage dtype (f32, bf16 or f16; the op's entry point has
// checked which).
struct FloatPtr {
  void* data;
  DType dtype;

  __device__ __forceinline__ float Load(int64_t i) const {
    switch (dtype) {
      case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[i]);
      case DType::kF16: return __half2float(static_cast<const __half*>(data)[i]);
      default: return static_cast<const float*>(data)[i];
    }
  }
  __device__ __forceinline__ void Store(int64_t i, float v) const {
    switch (dtype) {
      case DType::kBF16: static_cast<__nv_bfloat16*>(data)[i] = __float2bfloat16_rn(v); break;
      case DType::kF16: static_cast<__half*>(data)[i] = __float2half_rn(v); break;
      default: static_cast<float*>(data)[i] = v; break;
    }
  }
  __device__ __forceinline__ void Add(int64_t i, float v) const { Store(i, Load(i) + v); }
};

// Host side: the view a kernel takes of a float tensor.
inline FloatPtr AsFloatPtr(const Tensor& t) { return FloatPtr{t.raw(), t.dtype()}; }

// Calls f(T{}) with T the storage type of `dtype` (float, __nv_bfloat16 or __half), for
// kernels templated on one type. Host side.
template <typename F>
decltype(auto) DispatchFloatType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBF16: return f(__nv_bfloat16{});
    case DType::kF16: return f(__half{});
    default: return f(float{});
  }
}

}  // namespace zt::cuda
