// Deterministic block-wide reductions for the row kernels of the norms, quantization and the
// optimizers (kernels/cuda/{norm,quantization,adam8bit,adafactor}.cu).
//
// A sum is a fixed tree: each warp folds its 32 lanes with an xor butterfly, lane 0 of each
// warp leaves its value in shared memory, and every warp then folds those values the same
// way. The order of additions depends only on blockDim, never on timing, so a launch with the
// same configuration gives the same bits every time. Every thread gets the result (an xor
// butterfly gives every lane the same value: a + b and b + a are the same float).
//
// Every thread of the block must call these (they contain __syncthreads), blockDim.x must be
// a multiple of 32, and `scratch` is 32 elements of shared memory the caller owns; a call may
// reuse the scratch of the previous call (the leading barrier orders the reads before).
#pragma once

namespace zt::cuda {

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};
// max ignores a NaN operand (fmax), as std::max(acc, x) with acc first does in the CPU twins'
// loops; max is exact, so its order does not matter.
struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return fmax(a, b);
  }
};

template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// `identity` fills the lanes past the last warp: 0 for a sum, and for a max of values ≥ 0.
template <typename T, typename Op>
__device__ __forceinline__ T BlockReduce(T v, T* scratch, Op op) {
  v = WarpReduce(v, op);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return WarpReduce(lane < warps ? scratch[lane] : T(0), op);
}

template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* scratch) {
  return BlockReduce(v, scratch, SumOp{});
}

// The maximum over the block, of values ≥ 0.
template <typename T>
__device__ __forceinline__ T BlockMax(T v, T* scratch) {
  return BlockReduce(v, scratch, MaxOp{});
}

}  // namespace zt::cuda
