// CUDA element-wise ops: each element's result depends only on that element (and, for the
// stochastic cast, its index), so the GPU gives the CPU's bits exactly — the conversions are
// the CPU's own (elementwise_bits.cuh) and f32 add and multiply are IEEE on both. Kernels are
// grid-stride loops over packs of kVec elements, loaded and stored as whole aligned packs
// (16-byte loads for 16-bit data) when every pointer is aligned to its pack, one element at a
// time otherwise; the last n mod kVec elements are done one at a time.
#include "kernels/cuda/elementwise.h"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise_bits.cuh"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

constexpr int kVec = 8;
constexpr int kThreads = 256;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

bool Aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Pack p of a buffer (kV elements from p · kV).
template <int kV, typename T>
__device__ __forceinline__ Pack<T, kV> LoadPack(const T* x, int64_t p) {
  return reinterpret_cast<const Pack<T, kV>*>(x)[p];
}
template <int kV, typename T>
__device__ __forceinline__ void StorePack(T* x, int64_t p, const Pack<T, kV>& v) {
  reinterpret_cast<Pack<T, kV>*>(x)[p] = v;
}

__device__ __forceinline__ int64_t ThreadIndex() {
  return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ int64_t GridThreads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// out[i] = f(in[i], i). `in` and `out` may be the same buffer (each thread reads its
// elements before it writes them).
template <int kV, typename In, typename Out, typename F>
__global__ void MapKernel(const In* in, Out* out, int64_t n, F f) {
  const int64_t packs = n / kV;
  for (int64_t p = ThreadIndex(); p < packs; p += GridThreads()) {
    const Pack<In, kV> x = LoadPack<kV>(in, p);
    Pack<Out, kV> y;
#pragma unroll
    for (int j = 0; j < kV; ++j) y.v[j] = f(x.v[j], p * kV + j);
    StorePack<kV>(out, p, y);
  }
  for (int64_t i = packs * kV + ThreadIndex(); i < n; i += GridThreads()) out[i] = f(in[i], i);
}

template <typename In, typename Out, typename F>
absl::Status LaunchMap(const DeviceContext& ctx, const char* op, const In* in, Out* out, int64_t n,
                       F f) {
  if (n == 0) return absl::OkStatus();
  if (Aligned(in, sizeof(In) * kVec) && Aligned(out, sizeof(Out) * kVec)) {
    MapKernel<kVec><<<GridFor(n / kVec + 1, kThreads), kThreads, 0, StreamOf(ctx)>>>(in, out, n, f);
  } else {
    MapKernel<1><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(in, out, n, f);
  }
  return LaunchStatus(op);
}

template <typename Out>
struct CastTo {
  template <typename In>
  __device__ __forceinline__ Out operator()(In x, int64_t) const {
    return bits::Narrow<Out>(bits::Widen(x));
  }
};

struct ScaleBy {
  float s;
  template <typename T>
  __device__ __forceinline__ T operator()(T x, int64_t) const {
    return bits::Narrow<T>(__fmul_rn(bits::Widen(x), s));
  }
};

struct StochasticBf16 {
  uint64_t seed;
  __device__ __forceinline__ uint16_t operator()(float x, int64_t i) const {
    return bits::ToBf16Stochastic(x, seed, static_cast<uint64_t>(i));
  }
};

// out[i] = a[i] + b[i] in f32, rounded to out's dtype; out may alias a or b.
template <int kV, typename A, typename B, typename O>
__global__ void AddKernel(const A* a, const B* b, O* out, int64_t n) {
  const int64_t packs = n / kV;
  for (int64_t p = ThreadIndex(); p < packs; p += GridThreads()) {
    const Pack<A, kV> x = LoadPack<kV>(a, p);
    const Pack<B, kV> y = LoadPack<kV>(b, p);
    Pack<O, kV> z;
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      z.v[j] = bits::Narrow<O>(__fadd_rn(bits::Widen(x.v[j]), bits::Widen(y.v[j])));
    }
    StorePack<kV>(out, p, z);
  }
  for (int64_t i = packs * kV + ThreadIndex(); i < n; i += GridThreads()) {
    out[i] = bits::Narrow<O>(__fadd_rn(bits::Widen(a[i]), bits::Widen(b[i])));
  }
}

// The split master's halves; low may be null (the high halves alone).
template <int kV>
__global__ void SplitKernel(const float* src, uint16_t* high, int16_t* low, int64_t n) {
  const int64_t packs = n / kV;
  for (int64_t p = ThreadIndex(); p < packs; p += GridThreads()) {
    const Pack<float, kV> x = LoadPack<kV>(src, p);
    Pack<uint16_t, kV> h;
    Pack<int16_t, kV> l;
#pragma unroll
    for (int j = 0; j < kV; ++j) bits::SplitMaster(x.v[j], &h.v[j], &l.v[j]);
    StorePack<kV>(high, p, h);
    if (low != nullptr) StorePack<kV>(low, p, l);
  }
  for (int64_t i = packs * kV + ThreadIndex(); i < n; i += GridThreads()) {
    uint16_t h;
    int16_t l;
    bits::SplitMaster(src[i], &h, &l);
    high[i] = h;
    if (low != nullptr) low[i] = l;
  }
}

template <int kV>
__global__ void JoinKernel(const uint16_t* high, const int16_t* low, float* dst, int64_t n) {
  const int64_t packs = n / kV;
  for (int64_t p = ThreadIndex(); p < packs; p += GridThreads()) {
    const Pack<uint16_t, kV> h = LoadPack<kV>(high, p);
    const Pack<int16_t, kV> l = LoadPack<kV>(low, p);
    Pack<float, kV> d;
#pragma unroll
    for (int j = 0; j < kV; ++j) d.v[j] = bits::JoinMaster(h.v[j], l.v[j]);
    StorePack<kV>(dst, p, d);
  }
  for (int64_t i = packs * kV + ThreadIndex(); i < n; i += GridThreads()) {
    dst[i] = bits::JoinMaster(high[i], low[i]);
  }
}

// Launches kernel<kVec> when every (pointer, element size) is aligned to its pack, else
// kernel<1>.
bool AllAligned(std::initializer_list<std::pair<const void*, int64_t>> ptrs) {
  for (const auto& [p, size] : ptrs) {
    if (p != nullptr && !Aligned(p, size * kVec)) return false;
  }
  return true;
}

}  // namespace

absl::Status Add(const DeviceContext& ctx, const void* a, DType a_dtype, const void* b,
                 DType b_dtype, void* out, DType out_dtype, int64_t n) {
  if (n == 0) return absl::OkStatus();
  const bool vec =
      AllAligned({{a, DTypeSize(a_dtype)}, {b, DTypeSize(b_dtype)}, {out, DTypeSize(out_dtype)}});
  DispatchFloatType(a_dtype, [&](auto ta) {
    DispatchFloatType(b_dtype, [&](auto tb) {
      DispatchFloatType(out_dtype, [&](auto to) {
        using A = decltype(ta);
        using B = decltype(tb);
        using O = decltype(to);
        const auto* pa = static_cast<const A*>(a);
        const auto* pb = static_cast<const B*>(b);
        auto* po = static_cast<O*>(out);
        if (vec) {
          AddKernel<kVec>
              <<<GridFor(n / kVec + 1, kThreads), kThreads, 0, StreamOf(ctx)>>>(pa, pb, po, n);
        } else {
          AddKernel<1><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(pa, pb, po, n);
        }
      });
    });
  });
  return LaunchStatus("Add");
}

absl::Status Scale(const DeviceContext& ctx, void* t, DType dtype, float s, int64_t n) {
  return DispatchFloatType(dtype, [&](auto tag) {
    using T = decltype(tag);
    return LaunchMap(ctx, "Scale", static_cast<const T*>(t), static_cast<T*>(t), n, ScaleBy{s});
  });
}

absl::Status ZeroBytes(const DeviceContext& ctx, void* data, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  ZT_CUDA_RETURN_IF_ERROR("Zero",
                          cudaMemsetAsync(data, 0, static_cast<size_t>(bytes), StreamOf(ctx)));
  return absl::OkStatus();
}

absl::Status Cast(const DeviceContext& ctx, const void* src, DType src_dtype, void* dst,
                  DType dst_dtype, int64_t n) {
  if (n == 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    if (src == dst) return absl::OkStatus();
    ZT_CUDA_RETURN_IF_ERROR("Cast",
                            cudaMemcpyAsync(dst, src, static_cast<size_t>(n * DTypeSize(src_dtype)),
                                            cudaMemcpyDeviceToDevice, StreamOf(ctx)));
    return absl::OkStatus();
  }
  return DispatchFloatType(src_dtype, [&](auto ts) {
    return DispatchFloatType(dst_dtype, [&](auto td) {
      using S = decltype(ts);
      using D = decltype(td);
      return LaunchMap(ctx, "Cast", static_cast<const S*>(src), static_cast<D*>(dst), n,
                       CastTo<D>{});
    });
  });
}

absl::Status CastStochastic(const DeviceContext& ctx, const float* src, uint16_t* dst,
                            uint64_t seed, int64_t n) {
  return LaunchMap(ctx, "CastStochastic", src, dst, n, StochasticBf16{seed});
}

absl::Status SplitMasterWeights(const DeviceContext& ctx, const float* src, uint16_t* high,
                                int16_t* low, int64_t n) {
  if (n == 0) return absl::OkStatus();
  if (AllAligned({{src, 4}, {high, 2}, {low, 2}})) {
    SplitKernel<kVec>
        <<<GridFor(n / kVec + 1, kThreads), kThreads, 0, StreamOf(ctx)>>>(src, high, low, n);
  } else {
    SplitKernel<1><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(src, high, low, n);
  }
  return LaunchStatus("SplitMasterWeights");
}

absl::Status JoinMasterWeights(const DeviceContext& ctx, const uint16_t* high, const int16_t* low,
                               float* dst, int64_t n) {
  if (n == 0) return absl::OkStatus();
  if (AllAligned({{high, 2}, {low, 2}, {dst, 4}})) {
    JoinKernel<kVec>
        <<<GridFor(n / kVec + 1, kThreads), kThreads, 0, StreamOf(ctx)>>>(high, low, dst, n);
  } else {
    JoinKernel<1><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(high, low, dst, n);
  }
  return LaunchStatus("JoinMasterWeights");
}

}  // namespace zt::cuda
