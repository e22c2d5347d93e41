// CPU flash attention (kernels/attention.h). Internal to kernels/: kernels/attention.cc checks
// the arguments and derives the dimensions, so these functions cannot fail.
#pragma once

#include <cstdint>

#include "kernels/attention.h"
#include "kernels/device.h"

namespace zt::cpu {

// The tile buffers live on each thread's stack and are sized for this head size: the forward
// takes about 0.3 MiB of stack per thread and the backward about 0.55 MiB, so callers need
// thread stacks of at least 1 MiB (glibc's and libgomp's defaults are several MiB).
// A 16-bit dqkv also takes T·(H/Hkv)·D floats of per-thread heap scratch for summing dQ
// (kernels/cpu/load_store.h's ScratchRow: grown on first use and kept).
constexpr int kAttentionMaxHeadDim = 256;

struct AttentionDims {
  int64_t batch = 0;  // B
  int64_t seq = 0;    // T
  int n_head = 0;     // H
  int n_kv_head = 0;  // Hkv
  int head_dim = 0;   // D ≤ kAttentionMaxHeadDim
};

void AttentionForward(const DeviceContext& ctx, const AttentionDims& dims,
                      const AttentionForwardArgs& args);
void AttentionBackward(const DeviceContext& ctx, const AttentionDims& dims,
                       const AttentionBackwardArgs& args);

}  // namespace zt::cpu
