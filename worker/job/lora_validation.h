// The rules of proto/job.proto's LoraConfig and ModelConfig.base_dtype. Part of
// ValidateJobSpec (worker/job/job_validation.h), kept apart like the offload rules.
// Stateless and thread-safe.
#pragma once

#include <string>
#include <vector>

#include "proto/job.pb.h"

namespace zt {

// Whether the job fine-tunes adapters over a frozen base (model.lora is set).
inline bool UsesLora(const zerotrain::ModelConfig& model) { return model.has_lora(); }

// PEFT's defaults (proto/job.proto, LoraConfig) for a job with model.lora set, and the base
// dtype from precision.param_dtype; nothing for a job without model.lora. Called by
// ApplyJobDefaults after the precision defaults; idempotent.
void ApplyLoraDefaults(zerotrain::JobSpec* spec);

// One line per violated rule, each naming the field, its value and the rule
// ("model.lora.target_modules[2]: 'wq' is not a LLAMA module; use q_proj k_proj …"), on a spec
// ApplyJobDefaults completed. Empty when all hold.
std::vector<std::string> LoraViolations(const zerotrain::JobSpec& spec);

}  // namespace zt
