// What the Trainer's files (worker/train/trainer*.cc) share: small rules each of them applies.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/device.h"
#include "proto/job.pb.h"

namespace zt {

// The context of the host optimizer step (offload.optimizer CPU or NVME). A CPU rank whose
// arenas are the host's memory steps with its own threads and scratch; any other rank — a GPU,
// or a CPU "device" with memory of its own — steps its host buffers with the job's CPU share,
// since its own context's ops refuse tensors that are not on its device.
inline DeviceContext HostStepContext(const DeviceContext& ctx, const zerotrain::JobSpec& job) {
  return ctx.device == Device{} ? ctx : CpuContext(job.resources().cpu_threads());
}

// A LoRA job's frozen base shard at ZeRO stage 3: what offload.params moves for it.
inline bool IsFrozenBaseShard(const std::string& name) {
  return name.ends_with(".params") || name.ends_with(".qbase");
}

// What a micro-batch's mean loss is divided by so that the sum over the `ranks`
// data-parallel ranks' micro-batches (a step's accumulated ones, or validation's), divided by
// `ranks`, is the mean over all `total` counted targets: its mean weighs by
// counted · ranks / total. A micro-batch with nothing counted has a loss of 0 and adds nothing.
// Plain shards count all B·T targets of each of a step's accum micro-batches: accum.
inline double MicroBatchLossDivisor(int64_t total, int64_t counted, int64_t ranks) {
  return counted == 0 ? 1.0 : static_cast<double>(total) / static_cast<double>(counted * ranks);
}

// The scale of each counted target's loss gradient (dlogits) in a step that counts
// `step_counted` targets over all its micro-batches and ranks: the gradient sums over them, so
// 1 / step_counted (times the fp16 loss scale) makes it the token-level mean's. A step with
// nothing counted has no gradient.
inline float StepGradScale(double loss_scale, int64_t step_counted) {
  return step_counted == 0 ? 0.0f
                           : static_cast<float>(loss_scale / static_cast<double>(step_counted));
}

}  // namespace zt
