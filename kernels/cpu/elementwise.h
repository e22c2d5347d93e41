// CPU element-wise ops on raw flat buffers. Arguments are validated by kernels/elementwise.cc.
#pragma once

#include <cstdint>

#include "kernels/device.h"
#include "kernels/dtype.h"

namespace zt::cpu {

// out = a + b, each buffer f32, bf16 or f16; out may alias a or b.
void Add(const DeviceContext& ctx, const void* a, DType a_dtype, const void* b, DType b_dtype,
         void* out, DType out_dtype, int64_t n);
void Scale(const DeviceContext& ctx, void* t, DType dtype, float s, int64_t n);
// dst (bf16) = src rounded stochastically with the hash of (seed, element index).
void CastStochastic(const DeviceContext& ctx, const float* src, uint16_t* dst, uint64_t seed,
                    int64_t n);
// SplitMaster of each src element (low may be null: the high halves only), and JoinMaster.
void SplitMasterWeights(const DeviceContext& ctx, const float* src, uint16_t* high, int16_t* low,
                        int64_t n);
void JoinMasterWeights(const DeviceContext& ctx, const uint16_t* high, const int16_t* low,
                       float* dst, int64_t n);
void ZeroBytes(const DeviceContext& ctx, void* data, int64_t bytes);
// Between f32, bf16 and f16; src and dst must not overlap unless they are the same dtype and
// the same buffer.
void Cast(const DeviceContext& ctx, const void* src, DType src_dtype, void* dst, DType dst_dtype,
          int64_t n);

}  // namespace zt::cpu
