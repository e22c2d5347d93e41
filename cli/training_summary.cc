#include "cli/training_summary.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zt::cli {

using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

std::string TrainingSummary(const zerotrain::JobSpec& job) {
  const zerotrain::TrainConfig& train = job.train();
  const zerotrain::ParallelConfig& parallel = job.parallel();
  const int64_t global =
      int64_t{train.micro_batch_size()} * train.grad_accum_steps() * parallel.world_size();
  std::string out = absl::StrFormat(
      "  batch: %d per rank × %d accumulation steps × %d ranks = %d sequences per step, "
      "%d steps\n",
      train.micro_batch_size(), train.grad_accum_steps(), parallel.world_size(), global,
      train.max_steps());

  const PrecisionConfig& p = job.precision();
  absl::StrAppendFormat(
      &out, "  precision: parameters %s, compute %s, gradients %s, reduce %s",
      PrecisionConfig::DType_Name(p.param_dtype()), PrecisionConfig::DType_Name(p.compute_dtype()),
      PrecisionConfig::DType_Name(p.grad_dtype()), PrecisionConfig::DType_Name(p.reduce_dtype()));
  if (p.param_dtype() == PrecisionConfig::FP16 || p.compute_dtype() == PrecisionConfig::FP16) {
    const zerotrain::LossScaleConfig& ls = p.loss_scale();
    if (ls.has_static_scale()) {
      absl::StrAppendFormat(&out, ", static loss scale %g", ls.static_scale());
    } else {
      absl::StrAppendFormat(&out, ", dynamic loss scale 2^%d (window %d, hysteresis %d, min %g)",
                            ls.initial_power(), ls.window(), ls.hysteresis(), ls.min_scale());
    }
  }
  out += "\n";

  const OptimizerConfig& o = job.optimizer();
  absl::StrAppendFormat(&out, "  optimizer: %s lr %g", OptimizerConfig::Type_Name(o.type()),
                        o.lr());
  if (o.type() == OptimizerConfig::SGD) {
    absl::StrAppendFormat(&out, ", momentum %g", o.momentum());
  } else {
    absl::StrAppendFormat(&out, ", betas (%g, %g), eps %g", o.beta1(), o.beta2(), o.eps());
  }
  absl::StrAppendFormat(&out, ", weight decay %g, gradient clip %g\n", o.weight_decay(),
                        o.grad_clip());
  const OptimizerConfig::Schedule& s = o.schedule();
  absl::StrAppendFormat(&out, "  schedule: linear warmup %d steps, then %s", s.warmup_steps(),
                        OptimizerConfig::Decay_Name(s.decay()));
  if (s.decay() != OptimizerConfig::CONSTANT) {
    absl::StrAppendFormat(&out, " to %g × lr at step %d", s.min_lr_ratio(), train.max_steps());
  }
  out += "\n";
  absl::StrAppendFormat(&out,
                        "  sharding: ZeRO stage %d, activation checkpointing %s, gradient "
                        "bucket %d bytes\n",
                        parallel.zero_stage(),
                        zerotrain::MemoryConfig::ActivationCheckpointing_Name(
                            job.memory().activation_checkpointing()),
                        parallel.bucket_bytes());
  return out;
}

}  // namespace zt::cli
