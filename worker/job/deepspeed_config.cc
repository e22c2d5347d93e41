#include "worker/job/deepspeed_config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/job/deepspeed_offload.h"
#include "worker/job/deepspeed_section.h"

namespace zt {
namespace {

using job_internal::DsSection;
using zerotrain::JobSpec;
using zerotrain::MemoryConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;

// A ds_config.json is a few kilobytes; anything this large is the wrong file.
constexpr std::uintmax_t kMaxConfigBytes = 16u << 20;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

const char kTrainBatch[] = "train_batch_size";
const char kMicroBatch[] = "train_micro_batch_size_per_gpu";
const char kAccumSteps[] = "gradient_accumulation_steps";

// Equal as the float32 the JobSpec stores them in: DeepSpeed configs write learning rates in
// decimal, and 3e-4 must equal 0.0003.
bool SameRate(double a, double b) { return static_cast<float>(a) == static_cast<float>(b); }

absl::StatusOr<std::optional<int64_t>> IntegerAtLeast(const DsSection& s, const std::string& key,
                                                      int64_t min, int64_t max = kInt32Max) {
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> v, s.Integer(key));
  if (v && (*v < min || *v > max)) {
    return s.Error(key, absl::StrCat("must be in [", min, ", ", max, "] (got ", *v, ")"));
  }
  return v;
}

enum class Bound { kClosed, kOpen };

absl::StatusOr<std::optional<double>> NumberIn(const DsSection& s, const std::string& key,
                                               double min, double max,
                                               Bound lower = Bound::kClosed) {
  ZT_ASSIGN_OR_RETURN(std::optional<double> v, s.Number(key));
  const bool open = lower == Bound::kOpen;
  if (v && (*v < min || *v > max || (open && *v == min))) {
    return s.Error(
        key, absl::StrCat("must be in ", open ? "(" : "[", min, ", ", max, "] (got ", *v, ")"));
  }
  return v;
}

// Learning rates, epsilons and scales: > 0 (or ≥ 0), and within float32, where the JobSpec
// keeps them.
absl::StatusOr<std::optional<double>> Positive(const DsSection& s, const std::string& key) {
  return NumberIn(s, key, 0, std::numeric_limits<float>::max(), Bound::kOpen);
}
absl::StatusOr<std::optional<double>> NonNegative(const DsSection& s, const std::string& key) {
  return NumberIn(s, key, 0, std::numeric_limits<float>::max());
}

// A key whose only value ZeroTrain can honour is `expected`: anything else changes training in
// a way ZeroTrain does not implement, so it is refused with `why`.
absl::Status RequireBool(const DsSection& s, const std::string& key, bool expected,
                         const std::string& why) {
  ZT_ASSIGN_OR_RETURN(std::optional<bool> v, s.Bool(key));
  if (v && *v != expected) return s.Error(key, why);
  return absl::OkStatus();
}

// Keys accepted because they change nothing ZeroTrain computes; their type is still checked.
absl::Status CheckBools(const DsSection& s, const std::vector<std::string>& keys) {
  for (const std::string& key : keys) ZT_RETURN_IF_ERROR(s.Bool(key).status());
  return absl::OkStatus();
}
absl::Status CheckCounts(const DsSection& s, const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    ZT_RETURN_IF_ERROR(IntegerAtLeast(s, key, 0, std::numeric_limits<int64_t>::max()).status());
  }
  return absl::OkStatus();
}

// ---- batch sizes -----------------------------------------------------------------------------

absl::Status ApplyBatch(const DsSection& root, int64_t world, JobSpec* job) {
  constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> train,
                      IntegerAtLeast(root, kTrainBatch, 1, kInt64Max));
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> micro, IntegerAtLeast(root, kMicroBatch, 1));
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> accum, IntegerAtLeast(root, kAccumSteps, 1));
  // "auto" keeps the job's value; for train_batch_size that is whatever the other two give
  // (Hugging Face's integration computes it the same way).
  if (root.IsAuto(kMicroBatch)) {
    if (job->train().micro_batch_size() < 1) {
      return root.Error(kMicroBatch,
                        "\"auto\" keeps the job's train.micro_batch_size, which the job file "
                        "does not set");
    }
    micro = job->train().micro_batch_size();
  }
  if (root.IsAuto(kAccumSteps)) {
    accum = job->train().has_grad_accum_steps() ? job->train().grad_accum_steps() : 1;
  }
  if (!train && !micro && !accum) return absl::OkStatus();
  if (!train && !micro) {
    return root.Error(kAccumSteps,
                      "does not determine a batch alone: DeepSpeed needs train_batch_size or "
                      "train_micro_batch_size_per_gpu beside it");
  }
  const std::string rule =
      "(DeepSpeed's rule: train_batch_size = train_micro_batch_size_per_gpu × "
      "gradient_accumulation_steps × data-parallel world size)";
  // int128: three int32-range factors and an int64 total cannot overflow it.
  using Wide = __int128;
  if (train && micro && accum) {
    const Wide product = Wide{*micro} * *accum * world;
    if (product != *train) {
      return root.Error(
          kTrainBatch,
          absl::StrCat(*train, " does not equal ", kMicroBatch, " ", *micro, " × ", kAccumSteps,
                       " ", *accum, " × world size ", world, " = ",
                       static_cast<int64_t>(std::min<Wide>(product, kInt64Max)), " ", rule));
    }
  } else if (train && (micro || accum)) {
    const bool have_micro = micro.has_value();
    const int64_t given = have_micro ? *micro : *accum;
    const Wide per_step = Wide{given} * world;
    if (*train % per_step != 0) {
      return root.Error(
          kTrainBatch,
          absl::StrCat(*train, " is not a multiple of ", have_micro ? kMicroBatch : kAccumSteps,
                       " ", given, " × world size ", world, ", so no whole ",
                       have_micro ? kAccumSteps : kMicroBatch, " fits ", rule));
    }
    const Wide derived = *train / per_step;
    if (derived > kInt32Max) {
      return root.Error(kTrainBatch,
                        absl::StrCat(*train, " gives ", have_micro ? kAccumSteps : kMicroBatch,
                                     " above ", kInt32Max));
    }
    (have_micro ? accum : micro) = static_cast<int64_t>(derived);
  } else if (train) {
    // DeepSpeed: train_batch_size alone means no accumulation.
    if (*train % world != 0 || *train / world > kInt32Max) {
      return root.Error(kTrainBatch,
                        absl::StrCat(*train, " must be a multiple of the world size ", world,
                                     " (with gradient_accumulation_steps 1, each rank takes "
                                     "train_batch_size / world size) ",
                                     rule));
    }
    accum = 1;
    micro = *train / world;
  } else if (!accum) {
    accum = 1;  // DeepSpeed: a micro batch alone means no accumulation.
  }
  job->mutable_train()->set_micro_batch_size(static_cast<int32_t>(*micro));
  job->mutable_train()->set_grad_accum_steps(static_cast<int32_t>(*accum));
  return absl::OkStatus();
}

// ---- precision ---------------------------------------------------------------------------------

absl::StatusOr<PrecisionConfig::DType> DTypeNamed(const DsSection& s, const std::string& key) {
  ZT_ASSIGN_OR_RETURN(std::optional<std::string> name, s.String(key));
  const std::string lower = absl::AsciiStrToLower(name.value_or(""));
  if (lower == "fp32" || lower == "float32" || lower == "float") return PrecisionConfig::FP32;
  if (lower == "fp16" || lower == "float16" || lower == "half") return PrecisionConfig::FP16;
  if (lower == "bf16" || lower == "bfloat16") return PrecisionConfig::BF16;
  return s.Error(key, absl::StrCat("must be \"fp32\", \"fp16\" or \"bf16\" (got ",
                                   job_internal::Quoted(name.value_or("")), ")"));
}

// DeepSpeed's dynamic loss scaler and ZeroTrain's take the same knobs (proto LossScaleConfig);
// an absent key takes DeepSpeed's default, "auto" keeps the job's.
absl::Status ApplyLossScale(const DsSection& fp16, JobSpec* job) {
  zerotrain::LossScaleConfig& ls = *job->mutable_precision()->mutable_loss_scale();
  ZT_ASSIGN_OR_RETURN(std::optional<double> fixed, NonNegative(fp16, "loss_scale"));
  if (!fp16.IsAuto("loss_scale")) {
    // DeepSpeed: 0 (the default) is dynamic scaling.
    if (fixed.value_or(0) > 0) {
      ls.set_static_scale(static_cast<float>(*fixed));
    } else {
      ls.clear_static_scale();
    }
  }
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> power,
                      IntegerAtLeast(fp16, "initial_scale_power", 0, 64));
  if (!fp16.IsAuto("initial_scale_power")) ls.set_initial_power(power.value_or(16));
  ZT_ASSIGN_OR_RETURN(
      std::optional<int64_t> window,
      IntegerAtLeast(fp16, "loss_scale_window", 1, std::numeric_limits<int64_t>::max()));
  if (!fp16.IsAuto("loss_scale_window")) ls.set_window(window.value_or(1000));
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> hysteresis, IntegerAtLeast(fp16, "hysteresis", 1));
  if (!fp16.IsAuto("hysteresis")) ls.set_hysteresis(static_cast<int32_t>(hysteresis.value_or(2)));
  ZT_ASSIGN_OR_RETURN(std::optional<double> min_scale, Positive(fp16, "min_loss_scale"));
  if (!fp16.IsAuto("min_loss_scale")) ls.set_min_scale(static_cast<float>(min_scale.value_or(1)));
  ZT_ASSIGN_OR_RETURN(std::optional<bool> consecutive, fp16.Bool("consecutive_hysteresis"));
  if (!fp16.IsAuto("consecutive_hysteresis")) {
    ls.set_consecutive_hysteresis(consecutive.value_or(false));
  }
  return absl::OkStatus();
}

// 16-bit training as DeepSpeed runs it: 16-bit parameters and activations, fp32 master weights
// in the optimizer, and gradients held and reduced in the 16-bit type (data_types and
// communication_data_type, applied after this, override the last two).
void SetSixteenBit(PrecisionConfig::DType dtype, JobSpec* job) {
  PrecisionConfig& p = *job->mutable_precision();
  p.set_param_dtype(dtype);
  p.set_compute_dtype(dtype);
  p.set_grad_dtype(dtype);
  p.set_reduce_dtype(dtype);
  p.set_master_weights(true);
}

absl::Status ApplyPrecision(const DsSection& root, JobSpec* job) {
  if (root.Has("bf16") && root.Has("bfloat16")) {
    return root.Error("bfloat16", "is DeepSpeed's other spelling of bf16: give one of them");
  }
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> fp16, root.Object("fp16"));
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> bf16,
                      root.Object(root.Has("bfloat16") ? "bfloat16" : "bf16"));
  std::optional<bool> fp16_on, bf16_on;
  if (fp16) {
    ZT_RETURN_IF_ERROR(fp16->CheckKeys({"enabled", "auto_cast", "loss_scale", "initial_scale_power",
                                        "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                        "min_loss_scale", "fp16_master_weights_and_grads"}));
    ZT_ASSIGN_OR_RETURN(fp16_on, fp16->Bool("enabled"));
    // auto_cast casts floating-point inputs of the forward; a language model's inputs are
    // token ids, so it changes nothing here.
    ZT_RETURN_IF_ERROR(fp16->Bool("auto_cast").status());
    ZT_RETURN_IF_ERROR(RequireBool(
        *fp16, "fp16_master_weights_and_grads", false,
        "true keeps master weights and gradients in fp16; ZeroTrain's optimizer always keeps "
        "fp32 master weights"));
  }
  if (bf16) {
    ZT_RETURN_IF_ERROR(bf16->CheckKeys({"enabled"}));
    ZT_ASSIGN_OR_RETURN(bf16_on, bf16->Bool("enabled"));
  }
  if (fp16_on.value_or(false) && bf16_on.value_or(false)) {
    return bf16->Error("enabled",
                       "fp16.enabled and bf16.enabled are both true; DeepSpeed trains in one "
                       "16-bit format: enable one");
  }
  if (fp16_on.value_or(false)) SetSixteenBit(PrecisionConfig::FP16, job);
  if (bf16_on.value_or(false)) SetSixteenBit(PrecisionConfig::BF16, job);
  // The loss-scale keys count when fp16 is on, or "auto" (the job's dtype decides).
  if (fp16 && (fp16_on.value_or(false) || fp16->IsAuto("enabled"))) {
    ZT_RETURN_IF_ERROR(ApplyLossScale(*fp16, job));
  }

  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> data_types, root.Object("data_types"));
  if (data_types) {
    ZT_RETURN_IF_ERROR(data_types->CheckKeys({"grad_accum_dtype"}));
    if (data_types->Has("grad_accum_dtype") && !data_types->IsAuto("grad_accum_dtype")) {
      ZT_ASSIGN_OR_RETURN(PrecisionConfig::DType dtype,
                          DTypeNamed(*data_types, "grad_accum_dtype"));
      job->mutable_precision()->set_grad_dtype(dtype);
    }
  }
  if (root.Has("communication_data_type") && !root.IsAuto("communication_data_type") &&
      !root.Raw("communication_data_type").is_null()) {
    ZT_ASSIGN_OR_RETURN(PrecisionConfig::DType dtype, DTypeNamed(root, "communication_data_type"));
    job->mutable_precision()->set_reduce_dtype(dtype);
  }
  return absl::OkStatus();
}

// ---- optimizer ---------------------------------------------------------------------------------

// Adam and AdamW (DeepSpeed's FusedAdam/CPUAdam, or torch's with torch_adam). Returns the
// learning rate the config writes, if any, for the scheduler's check.
absl::StatusOr<std::optional<double>> ApplyAdam(const DsSection& params, bool named_adamw,
                                                JobSpec* job) {
  OptimizerConfig& opt = *job->mutable_optimizer();
  ZT_RETURN_IF_ERROR(params.CheckKeys({"lr", "betas", "eps", "weight_decay", "adam_w_mode",
                                       "torch_adam", "bias_correction", "amsgrad"}));
  ZT_ASSIGN_OR_RETURN(std::optional<bool> adam_w_mode, params.Bool("adam_w_mode"));
  ZT_ASSIGN_OR_RETURN(std::optional<bool> torch_adam, params.Bool("torch_adam"));
  ZT_RETURN_IF_ERROR(RequireBool(params, "bias_correction", true,
                                 "false turns Adam's bias correction off; ZeroTrain's AdamW "
                                 "always corrects"));
  ZT_RETURN_IF_ERROR(
      RequireBool(params, "amsgrad", false, "true asks for AMSGrad, which ZeroTrain lacks"));
  // DeepSpeed: type AdamW always decays decoupled; type Adam unless adam_w_mode is false.
  const bool decoupled = named_adamw || adam_w_mode.value_or(true);
  ZT_ASSIGN_OR_RETURN(std::optional<double> lr, Positive(params, "lr"));
  ZT_ASSIGN_OR_RETURN(std::optional<double> eps, Positive(params, "eps"));
  ZT_ASSIGN_OR_RETURN(std::optional<double> weight_decay, NonNegative(params, "weight_decay"));
  // FusedAdam and CPUAdam default weight_decay to 0; torch.optim.AdamW to 0.01.
  const double default_decay = torch_adam.value_or(false) && decoupled ? 0.01 : 0.0;
  const double decay = weight_decay.value_or(default_decay);
  if (!decoupled && decay != 0 && !params.IsAuto("weight_decay")) {
    return params.Error(
        "adam_w_mode",
        "false makes Adam add weight_decay·param to the gradient (L2), which ZeroTrain's "
        "decoupled AdamW does not do; use AdamW (decoupled decay) or weight_decay 0");
  }
  if (!params.IsAuto("lr")) opt.set_lr(static_cast<float>(lr.value_or(1e-3)));
  if (!params.IsAuto("eps")) opt.set_eps(static_cast<float>(eps.value_or(1e-8)));
  if (!params.IsAuto("weight_decay")) opt.set_weight_decay(static_cast<float>(decay));
  double beta1 = 0.9, beta2 = 0.999;
  if (params.Has("betas") && !params.IsAuto("betas")) {
    const nlohmann::json& betas = params.Raw("betas");
    if (!betas.is_array() || betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number()) {
      return params.Error("betas", absl::StrCat("must be [beta1, beta2] (got ", betas.dump(), ")"));
    }
    beta1 = betas[0].get<double>();
    beta2 = betas[1].get<double>();
    if (!(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1)) {
      return params.Error("betas", absl::StrCat("each must be in [0, 1) (got ", betas.dump(), ")"));
    }
  }
  if (!params.IsAuto("betas")) {
    opt.set_beta1(static_cast<float>(beta1));
    opt.set_beta2(static_cast<float>(beta2));
  }
  opt.set_type(OptimizerConfig::ADAMW);
  return lr;
}

// torch.optim.SGD, which DeepSpeed builds for any type it does not implement itself.
absl::StatusOr<std::optional<double>> ApplySgd(const DsSection& params, JobSpec* job) {
  OptimizerConfig& opt = *job->mutable_optimizer();
  ZT_RETURN_IF_ERROR(params.CheckKeys({"lr", "momentum", "weight_decay", "dampening", "nesterov"}));
  ZT_ASSIGN_OR_RETURN(std::optional<double> lr, Positive(params, "lr"));
  if (!lr && !params.IsAuto("lr")) return params.Error("lr", "SGD needs a learning rate");
  ZT_ASSIGN_OR_RETURN(std::optional<double> momentum, NumberIn(params, "momentum", 0, 1));
  if (momentum && *momentum >= 1) return params.Error("momentum", "must be below 1");
  ZT_ASSIGN_OR_RETURN(std::optional<double> weight_decay, NonNegative(params, "weight_decay"));
  if (weight_decay.value_or(0) != 0) {
    return params.Error(
        "weight_decay",
        "torch.optim.SGD adds weight_decay·param to the gradient (L2, carried by momentum), "
        "ZeroTrain's SGD decays decoupled: they train differently; write 0 here and set "
        "optimizer.weight_decay in the job file for decoupled decay");
  }
  ZT_ASSIGN_OR_RETURN(std::optional<double> dampening, params.Number("dampening"));
  if (dampening.value_or(0) != 0) {
    return params.Error("dampening", "must be 0: ZeroTrain's SGD momentum has no dampening");
  }
  ZT_RETURN_IF_ERROR(RequireBool(params, "nesterov", false,
                                 "true asks for Nesterov momentum, which ZeroTrain lacks"));
  if (lr) opt.set_lr(static_cast<float>(*lr));
  if (!params.IsAuto("momentum")) opt.set_momentum(static_cast<float>(momentum.value_or(0)));
  opt.set_weight_decay(0);
  opt.set_type(OptimizerConfig::SGD);
  return lr;
}

absl::StatusOr<std::optional<double>> ApplyOptimizer(const DsSection& root, JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> section, root.Object("optimizer"));
  if (!section) return std::nullopt;
  ZT_RETURN_IF_ERROR(section->CheckKeys({"type", "params"}));
  ZT_ASSIGN_OR_RETURN(std::optional<std::string> type, section->String("type"));
  if (!type) return section->Error("type", "must name the optimizer (Adam, AdamW or SGD)");
  ZT_ASSIGN_OR_RETURN(const DsSection p, section->ObjectOrEmpty("params"));
  // DeepSpeed matches its own optimizer names in any case.
  const std::string lower = absl::AsciiStrToLower(*type);
  if (lower == "adam" || lower == "adamw") return ApplyAdam(p, lower == "adamw", job);
  if (*type == "SGD") return ApplySgd(p, job);
  return section->Error(
      "type", absl::StrCat(job_internal::Quoted(*type),
                           " has no ZeroTrain equivalent; supported: Adam and AdamW (ZeroTrain "
                           "ADAMW), SGD. ZeroTrain's ADAMW_8BIT and ADAFACTOR have no DeepSpeed "
                           "name: set optimizer.type in the job file and leave \"optimizer\" out "
                           "of the DeepSpeed config"));
}

// ---- scheduler ---------------------------------------------------------------------------------

// total_num_steps is where DeepSpeed's decay ends; ZeroTrain's ends at train.max_steps.
absl::Status ApplyTotalSteps(const DsSection& params, JobSpec* job) {
  if (params.IsAuto("total_num_steps")) return absl::OkStatus();
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> total, IntegerAtLeast(params, "total_num_steps", 1));
  if (!total) return params.Error("total_num_steps", "is required by this scheduler");
  const int32_t max_steps = job->train().max_steps();
  if (max_steps == 0) {
    job->mutable_train()->set_max_steps(static_cast<int32_t>(*total));
  } else if (max_steps != *total) {
    return params.Error(
        "total_num_steps",
        absl::StrCat(*total, " differs from the job's train.max_steps ", max_steps,
                     ": DeepSpeed's decay ends at total_num_steps, ZeroTrain's at max_steps; "
                     "make them equal (or leave train.max_steps out of the job file)"));
  }
  return absl::OkStatus();
}

absl::Status ApplyScheduler(const DsSection& root, std::optional<double> optimizer_lr,
                            JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> section, root.Object("scheduler"));
  if (!section) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(section->CheckKeys({"type", "params"}));
  ZT_ASSIGN_OR_RETURN(std::optional<std::string> type, section->String("type"));
  const std::string name = type.value_or("");
  const bool warmup_lr = name == "WarmupLR", decay_lr = name == "WarmupDecayLR",
             cosine_lr = name == "WarmupCosineLR";
  if (!warmup_lr && !decay_lr && !cosine_lr) {
    return section->Error(
        "type", absl::StrCat(job_internal::Quoted(name),
                             " has no ZeroTrain equivalent; supported: WarmupLR, "
                             "WarmupDecayLR, WarmupCosineLR (OneCycle and LRRangeTest are not)"));
  }
  ZT_ASSIGN_OR_RETURN(const DsSection params, section->ObjectOrEmpty("params"));
  if (cosine_lr) {
    ZT_RETURN_IF_ERROR(params.CheckKeys({"total_num_steps", "warmup_min_ratio", "warmup_num_steps",
                                         "cos_min_ratio", "warmup_type", "last_batch_iteration"}));
  } else {
    std::vector<std::string> keys = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                     "warmup_type", "last_batch_iteration"};
    if (decay_lr) keys.push_back("total_num_steps");
    ZT_RETURN_IF_ERROR(params.CheckKeys(keys));
  }
  OptimizerConfig& opt = *job->mutable_optimizer();
  OptimizerConfig::Schedule& schedule = *opt.mutable_schedule();

  if (!params.IsAuto("warmup_type")) {
    ZT_ASSIGN_OR_RETURN(std::optional<std::string> warmup_type, params.String("warmup_type"));
    if (warmup_type.value_or("log") != "linear") {
      return params.Error(
          "warmup_type",
          absl::StrCat(job_internal::Quoted(warmup_type.value_or("log")),
                       warmup_type ? "" : " (DeepSpeed's default when the key is absent)",
                       " warms up logarithmically; ZeroTrain warms up linearly: write "
                       "\"warmup_type\": \"linear\""));
    }
  }
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> iteration,
                      IntegerAtLeast(params, "last_batch_iteration", -1));
  if (iteration.value_or(-1) != -1) {
    return params.Error("last_batch_iteration",
                        "must be -1: ZeroTrain resumes a schedule from its own checkpoint");
  }
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> warmup, IntegerAtLeast(params, "warmup_num_steps", 0));
  // DeepSpeed warms up over at least 2 steps (it divides by log(warmup_num_steps)).
  if (!params.IsAuto("warmup_num_steps")) {
    schedule.set_warmup_steps(static_cast<int32_t>(std::max<int64_t>(2, warmup.value_or(1000))));
  }

  if (cosine_lr) {
    ZT_ASSIGN_OR_RETURN(std::optional<double> min_ratio,
                        NumberIn(params, "warmup_min_ratio", 0, 1));
    if (min_ratio.value_or(0) != 0) {
      return params.Error("warmup_min_ratio", "must be 0: ZeroTrain's warmup starts from 0");
    }
    ZT_ASSIGN_OR_RETURN(std::optional<double> cos_min, NumberIn(params, "cos_min_ratio", 0, 1));
    if (!params.IsAuto("cos_min_ratio")) {
      schedule.set_min_lr_ratio(static_cast<float>(cos_min.value_or(0.0001)));
    }
    schedule.set_decay(OptimizerConfig::COSINE);
    return ApplyTotalSteps(params, job);
  }

  ZT_ASSIGN_OR_RETURN(std::optional<double> min_lr, params.Number("warmup_min_lr"));
  if (min_lr.value_or(0) != 0) {
    return params.Error("warmup_min_lr",
                        "must be 0: ZeroTrain's warmup starts from 0 (and WarmupDecayLR would "
                        "decay to it; use WarmupCosineLR's cos_min_ratio for a floor)");
  }
  ZT_ASSIGN_OR_RETURN(std::optional<double> max_lr, Positive(params, "warmup_max_lr"));
  // WarmupLR's peak defaults to the optimizer's lr; WarmupDecayLR's to 0.001.
  if (decay_lr && !max_lr && !params.IsAuto("warmup_max_lr")) max_lr = 1e-3;
  if (max_lr) {
    if (optimizer_lr && !SameRate(*optimizer_lr, *max_lr)) {
      return params.Error(
          "warmup_max_lr",
          absl::StrCat(*max_lr, params.Has("warmup_max_lr") ? "" : " (DeepSpeed's default)",
                       " is the learning rate DeepSpeed trains at after warmup, not "
                       "optimizer.params.lr ",
                       *optimizer_lr, ": ZeroTrain has one peak learning rate; make them equal"));
    }
    opt.set_lr(static_cast<float>(*max_lr));
  }
  schedule.set_min_lr_ratio(0);
  if (warmup_lr) {
    schedule.set_decay(OptimizerConfig::CONSTANT);
    return absl::OkStatus();
  }
  schedule.set_decay(OptimizerConfig::LINEAR);
  return ApplyTotalSteps(params, job);
}

// ---- ZeRO ------------------------------------------------------------------------------------

int64_t DTypeBytes(PrecisionConfig::DType dtype) {
  return dtype == PrecisionConfig::FP16 || dtype == PrecisionConfig::BF16 ? 2 : 4;
}

absl::Status ApplyZero(const DsSection& root, JobSpec* job) {
  // DeepSpeed's older spelling, still in its config-json example: true is stage 1.
  if (root.Has("zero_optimization") && root.Raw("zero_optimization").is_boolean()) {
    job->mutable_parallel()->set_zero_stage(root.Raw("zero_optimization").get<bool>() ? 1 : 0);
    return absl::OkStatus();
  }
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> zero, root.Object("zero_optimization"));
  if (!zero) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(zero->CheckKeys({"stage",
                                      "overlap_comm",
                                      "contiguous_gradients",
                                      "reduce_bucket_size",
                                      "stage3_prefetch_bucket_size",
                                      "offload_optimizer",
                                      "offload_param",
                                      "cpu_offload",
                                      "allgather_partitions",
                                      "allgather_bucket_size",
                                      "reduce_scatter",
                                      "round_robin_gradients",
                                      "sub_group_size",
                                      "stage3_max_live_parameters",
                                      "stage3_max_reuse_distance",
                                      "stage3_param_persistence_threshold",
                                      "stage3_gather_16bit_weights_on_model_save",
                                      "stage3_gather_fp16_weights_on_model_save",
                                      "elastic_checkpoint",
                                      "ignore_unused_parameters",
                                      "load_from_fp32_weights"}));
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> stage, IntegerAtLeast(*zero, "stage", 0, 3));
  if (stage) job->mutable_parallel()->set_zero_stage(static_cast<int32_t>(*stage));

  ZT_RETURN_IF_ERROR(job_internal::ApplyOffload(*zero, job));  // after the stage: its rule
  ZT_RETURN_IF_ERROR(RequireBool(*zero, "load_from_fp32_weights", true,
                                 "false resumes from the 16-bit weights; ZeroTrain always resumes "
                                 "from the fp32 master weights"));
  // Scheduling and memory knobs of DeepSpeed's own engine: ZeroTrain always overlaps
  // communication with compute and keeps each unit's gradients in one contiguous buffer, and
  // the rest bound buffers ZeroTrain sizes per unit. None changes a value computed.
  ZT_RETURN_IF_ERROR(CheckBools(
      *zero, {"overlap_comm", "contiguous_gradients", "allgather_partitions", "reduce_scatter",
              "round_robin_gradients", "stage3_gather_16bit_weights_on_model_save",
              "stage3_gather_fp16_weights_on_model_save", "elastic_checkpoint",
              "ignore_unused_parameters"}));
  ZT_RETURN_IF_ERROR(
      CheckCounts(*zero, {"allgather_bucket_size", "sub_group_size", "stage3_max_live_parameters",
                          "stage3_max_reuse_distance", "stage3_param_persistence_threshold"}));

  ZT_ASSIGN_OR_RETURN(
      std::optional<int64_t> bucket,
      IntegerAtLeast(*zero, "reduce_bucket_size", 1, std::numeric_limits<int64_t>::max() / 4));
  if (bucket) {
    // DeepSpeed counts elements; ZeroTrain's bucket is bytes of the dtype gradients are
    // reduced in (its default: fp32), so a bucket holds the same number of gradients.
    const PrecisionConfig& p = job->precision();
    const PrecisionConfig::DType reduce =
        p.reduce_dtype() != PrecisionConfig::DTYPE_UNSPECIFIED ? p.reduce_dtype()
        : p.grad_dtype() != PrecisionConfig::DTYPE_UNSPECIFIED ? p.grad_dtype()
                                                               : PrecisionConfig::FP32;
    job->mutable_parallel()->set_bucket_bytes(*bucket * DTypeBytes(reduce));
  }
  ZT_ASSIGN_OR_RETURN(
      std::optional<int64_t> prefetch,
      IntegerAtLeast(*zero, "stage3_prefetch_bucket_size", 0, std::numeric_limits<int64_t>::max()));
  if (prefetch) {
    return zero->Error(
        "stage3_prefetch_bucket_size",
        "ZeroTrain prefetches whole units (parallel.prefetch_units in the job file), not a "
        "number of elements, and a count of elements does not say how many units; write "
        "\"auto\" (keeps the job's prefetch_units) or leave the key out");
  }
  return absl::OkStatus();
}

// ---- activation checkpointing ---------------------------------------------------------------

absl::Status ApplyActivationCheckpointing(const DsSection& root, JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> section, root.Object("activation_checkpointing"));
  if (!section) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(section->CheckKeys({"partition_activations", "cpu_checkpointing",
                                         "contiguous_memory_optimization", "number_checkpoints",
                                         "synchronize_checkpoint_boundary", "profile"}));
  ZT_RETURN_IF_ERROR(RequireBool(*section, "cpu_checkpointing", false,
                                 "true offloads checkpointed activations to the CPU; "
                                 "ZeroTrain's offload tier moves model states, not activations"));
  // partition_activations splits activations across model-parallel ranks (ZeroTrain has none);
  // the rest shape DeepSpeed's own buffers and profiling.
  ZT_RETURN_IF_ERROR(
      CheckBools(*section, {"partition_activations", "contiguous_memory_optimization",
                            "synchronize_checkpoint_boundary", "profile"}));
  if (section->Has("number_checkpoints") && !section->Raw("number_checkpoints").is_null()) {
    ZT_RETURN_IF_ERROR(CheckCounts(*section, {"number_checkpoints"}));
  }
  // Under DeepSpeed the section configures the checkpointing the model's code calls for every
  // block (Megatron's layers): ZeroTrain's FULL. A policy the job file names stands.
  MemoryConfig& memory = *job->mutable_memory();
  if (memory.activation_checkpointing() == MemoryConfig::CHECKPOINTING_UNSPECIFIED) {
    memory.set_activation_checkpointing(MemoryConfig::FULL);
  }
  return absl::OkStatus();
}

// ---- tensor parallelism ----------------------------------------------------------------------

// DeepSpeed's AutoTP training section ({"tensor_parallel": {"autotp_size": N}}): N ranks split
// each layer, ZeRO divides inside the data-parallel groups, as parallel.tensor_parallel does.
absl::Status ApplyTensorParallel(const DsSection& root, JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> section, root.Object("tensor_parallel"));
  if (!section) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(section->CheckKeys({"autotp_size"}));
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> size, IntegerAtLeast(*section, "autotp_size", 1));
  if (size) job->mutable_parallel()->set_tensor_parallel(static_cast<int32_t>(*size));
  return absl::OkStatus();
}

// The data-parallel size of DeepSpeed's batch rule: the world over tensor_parallel ·
// pipeline_parallel (when they do not divide it, validation names that; the world stands here).
int64_t DataParallelSize(int64_t world, const JobSpec& job) {
  const int64_t tp = job.parallel().has_tensor_parallel() ? job.parallel().tensor_parallel() : 1;
  const int64_t pp =
      job.parallel().has_pipeline_parallel() ? job.parallel().pipeline_parallel() : 1;
  return tp * pp >= 1 && world % (tp * pp) == 0 ? world / (tp * pp) : world;
}

// ---- the config ------------------------------------------------------------------------------

// Every top-level key ZeroTrain reads. The second group changes nothing ZeroTrain computes
// (logging, monitoring, profiling, DeepSpeed's own safety switches) and is accepted.
const std::vector<std::string>& TopLevelKeys() {
  static const std::vector<std::string> keys = {
      kTrainBatch, kMicroBatch, kAccumSteps, "gradient_clipping", "fp16", "bf16", "bfloat16",
      "zero_optimization", "optimizer", "scheduler", "activation_checkpointing", "data_types",
      "communication_data_type", "prescale_gradients", "gradient_predivide_factor", "aio",
      "tensor_parallel",
      // Accepted, no numeric effect:
      "steps_per_print", "wall_clock_breakdown", "memory_breakdown", "dump_state",
      "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "tensorboard", "wandb",
      "csv_monitor", "comet", "flops_profiler", "comms_logger"};
  return keys;
}

absl::Status ApplyGradientSettings(const DsSection& root, JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<double> clip, NonNegative(root, "gradient_clipping"));
  if (clip) job->mutable_optimizer()->set_grad_clip(static_cast<float>(*clip));
  ZT_RETURN_IF_ERROR(RequireBool(root, "prescale_gradients", false,
                                 "true divides gradients by the world size before the reduction; "
                                 "ZeroTrain averages after it"));
  ZT_ASSIGN_OR_RETURN(std::optional<double> predivide, root.Number("gradient_predivide_factor"));
  if (predivide.value_or(1.0) != 1.0) {
    return root.Error("gradient_predivide_factor",
                      "must be 1.0: ZeroTrain averages gradients after the reduction, with no "
                      "pre-division");
  }
  return absl::OkStatus();
}

// Monitoring sections are objects of DeepSpeed's own; only their shape is checked.
absl::Status CheckMonitoring(const DsSection& root) {
  for (const char* key :
       {"tensorboard", "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger"}) {
    ZT_RETURN_IF_ERROR(root.Object(key).status());
  }
  ZT_RETURN_IF_ERROR(CheckCounts(root, {"steps_per_print"}));
  return CheckBools(root, {"wall_clock_breakdown", "memory_breakdown", "dump_state",
                           "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"});
}

}  // namespace

absl::StatusOr<JobSpec> ApplyDeepSpeedConfig(std::string_view json_text,
                                             std::string_view source_name, JobSpec job,
                                             const DeepSpeedOptions& options) {
  const std::string source(source_name);
  nlohmann::json config;
  // DeepSpeed loads its config with a hook that refuses a key given twice in one object; here
  // too, the second would otherwise silently win.
  std::vector<std::set<std::string>> keys_seen;
  std::string duplicate;
  auto find_duplicates = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) keys_seen.emplace_back();
    if (event == Event::object_end && !keys_seen.empty()) keys_seen.pop_back();
    if (event == Event::key && !keys_seen.empty() &&
        !keys_seen.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  try {
    config = nlohmann::json::parse(json_text.begin(), json_text.end(), find_duplicates);
  } catch (const nlohmann::json::exception& e) {
    // Syntax errors (parse_error: "[json.exception.parse_error.101] parse error at line 3,
    // column 5: ...") and numbers past double's range (out_of_range.406) alike.
    const std::string what = e.what();
    const size_t tag_end = what.find("] ");
    return absl::InvalidArgumentError(absl::StrCat(
        source,
        ": malformed JSON: ", tag_end == std::string::npos ? what : what.substr(tag_end + 2)));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": a DeepSpeed config is a JSON object (got ", config.type_name(), ")"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": ", job_internal::Quoted(duplicate),
        " is given twice in one object; DeepSpeed refuses duplicate keys, and which one "
        "counts would be a guess"));
  }
  const DsSection root(&config, source, "");
  ZT_RETURN_IF_ERROR(root.CheckKeys(TopLevelKeys()));
  ZT_RETURN_IF_ERROR(CheckMonitoring(root));

  const int64_t world = options.world_size > 0            ? options.world_size
                        : job.parallel().has_world_size() ? job.parallel().world_size()
                                                          : 1;
  // Each section stops at its first violation, but every section is read, so one run names
  // everything the user must change.
  std::vector<std::string> errors;
  auto note = [&errors](const absl::Status& status) {
    if (!status.ok()) errors.emplace_back(status.message());
  };
  note(ApplyTensorParallel(root, &job));  // before the batch: it divides the world
  note(ApplyBatch(root, DataParallelSize(std::max<int64_t>(world, 1), job), &job));
  note(ApplyGradientSettings(root, &job));
  note(ApplyPrecision(root, &job));
  absl::StatusOr<std::optional<double>> optimizer_lr = ApplyOptimizer(root, &job);
  note(optimizer_lr.status());
  note(ApplyScheduler(root, optimizer_lr.value_or(std::nullopt), &job));
  note(ApplyZero(root, &job));  // after precision: the bucket's and the offload ring's dtype
  note(job_internal::ApplyAio(root, &job));
  note(ApplyActivationCheckpointing(root, &job));
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return job;
}

absl::StatusOr<JobSpec> ApplyDeepSpeedConfigFile(const std::string& path, JobSpec job,
                                                 const DeepSpeedOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, ": DeepSpeed config does not exist"));
  }
  if (ec || status.type() != fs::file_type::regular) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": DeepSpeed config is not a regular file"));
  }
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec || size > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": DeepSpeed config is over ",
                                                   kMaxConfigBytes, " bytes (or cannot be sized)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open DeepSpeed config: ", std::strerror(errno)));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  return ApplyDeepSpeedConfig(text, path, std::move(job), options);
}

}  // namespace zt
