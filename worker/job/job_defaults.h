// The documented defaults of proto/job.proto, filled in one place so the engine reads every
// field straight from the message.
#pragma once

#include <cstdint>

#include "proto/job.pb.h"

namespace zt {

// The offload tier's defaults, DeepSpeed's (proto/job.proto, OffloadConfig): ring buffers of
// its offload_param and offload_optimizer sections, its aio block size and queue depth. Its
// buffer_size is 1e8 elements; ZeroTrain's counts bytes: 1e8 16-bit elements, rounded up to
// the swap store's 4096-byte unit.
inline constexpr int32_t kDeepSpeedParamBufferCount = 5;
inline constexpr int32_t kDeepSpeedOptimizerBufferCount = 4;
inline constexpr int64_t kDefaultOffloadBufferSize = (int64_t{200'000'000} + 4095) / 4096 * 4096;
inline constexpr int64_t kDeepSpeedAioBlockSize = 1 << 20;
inline constexpr int32_t kDeepSpeedAioQueueDepth = 8;
// Serial steps before ZeRO-Offload's delayed parameter update starts (offload.delayed_update.
// after_steps): the paper turns it on after a warm-up of a few dozen steps, when the
// gradients no longer change fast; DeepSpeed has no setting to copy.
inline constexpr int32_t kDelayedUpdateAfterSteps = 40;

// Default MLP width for `family` and d_model `c`: 4·C for GPT2, 8·C/3 rounded up to a multiple
// of 64 for LLAMA. Returns 0 for FAMILY_UNSPECIFIED and for widths that do not fit in int32;
// ApplyJobDefaults then leaves d_ff unset and ValidateJobSpec reports it.
int64_t DefaultDff(zerotrain::ModelConfig::Family family, int64_t c);

// Sets every unset `optional` field and every enum left at *_UNSPECIFIED to the default its
// .proto comment documents. Defaults that depend on other fields (model.n_kv_head = n_head,
// model.d_ff and model.tie_embeddings by family, data.seed = train.seed) are computed from
// the values present; those that depend on model.family are left unset while the family is
// unspecified (there is no default family). Idempotent; never fails: rules are checked
// afterwards by ValidateJobSpec.
void ApplyJobDefaults(zerotrain::JobSpec* spec);

}  // namespace zt
