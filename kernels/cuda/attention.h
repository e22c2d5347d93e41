// CUDA flash attention: the twin of kernels/cpu/attention.h, called by AttentionForward and
// AttentionBackward (kernels/attention.cc) after they have checked the arguments and the
// workspace. Head sizes 64 and 128; any other D is refused with InvalidArgument. Packed rows
// (doc_starts) as on the CPU.
#pragma once

#include "absl/status/status.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention.h"
#include "kernels/device.h"

namespace zt::cuda {

absl::Status AttentionForward(const DeviceContext& ctx, const cpu::AttentionDims& dims,
                              const AttentionForwardArgs& args);
absl::Status AttentionBackward(const DeviceContext& ctx, const cpu::AttentionDims& dims,
                               const AttentionBackwardArgs& args);

}  // namespace zt::cuda
