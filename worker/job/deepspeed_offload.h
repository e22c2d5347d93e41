// DeepSpeed's offload configuration laid over a JobSpec (part of worker/job/deepspeed_config.h;
// docs/deepspeed.md has the table): zero_optimization.offload_optimizer and .offload_param
// (and the older zero_optimization.cpu_offload) become proto/job.proto's `offload`, the
// top-level `aio` section becomes offload.aio. Errors name the config file and the full key
// (InvalidArgument). Used by deepspeed_config.cc only. Stateless and thread-safe.
#pragma once

#include "absl/status/status.h"
#include "proto/job.pb.h"
#include "worker/job/deepspeed_section.h"

namespace zt::job_internal {

// `zero` is the zero_optimization section. Reads precision.param_dtype (DeepSpeed's
// buffer_size counts parameter elements) and parallel.zero_stage, so it runs after both are
// laid over the job. Maps:
//   offload_*.device "none" | "cpu" | "nvme"  → offload.optimizer / offload.params
//   offload_*.nvme_path                       → offload.nvme_path (one store per node: the two
//                                                sections must name the same directory)
//   offload_*.pin_memory                      → offload.pin_memory (the two must agree)
//   offload_*.buffer_count                    → offload.buffer_count (one ring serves both:
//                                                the larger)
//   offload_param.buffer_size (elements)      → offload.buffer_size: × the parameter dtype's
//                                                bytes, rounded up to 4096
//   cpu_offload: true                         → offload.optimizer CPU
// Refused: a device other than those three, "nvme" without nvme_path, offload_optimizer.ratio
// other than 1 (partial offload), a device the job's ZeRO stage does not allow (DeepSpeed's
// rule: offload_optimizer needs stage ≥ 1, offload_param stage 3), cpu_offload: true together
// with an offload_optimizer section.
absl::Status ApplyOffload(const DsSection& zero, zerotrain::JobSpec* job);

// The top-level `aio` section: block_size → offload.aio.block_size, queue_depth →
// offload.aio.queue_depth; thread_count, single_submit, overlap_events and
// intra_op_parallelism shape DeepSpeed's own I/O threads and are accepted (type-checked);
// use_gds: true (GPUDirect Storage) is refused.
absl::Status ApplyAio(const DsSection& root, zerotrain::JobSpec* job);

}  // namespace zt::job_internal
