// `zt estimate JOBFILE [--deepspeed DS_CONFIG] [--world-size N] [--zero-stage S] [--json]`:
// where a rank's memory goes, by category, from the memory plan the engine allocates from
// (with --deepspeed, then how the job trains: cli/training_summary.h) (`--plan`: the sharding
// planner's choice instead, cli/estimate_plan.cc). Nothing is allocated, so
// it answers instantly for models far larger than this machine.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/commands.h"
#include "cli/output_format.h"
#include "cli/training_summary.h"
#include "nlohmann/json.hpp"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/gathered_units.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/memory_plan.h"
#include "worker/status_macros.h"

namespace zt::cli {
namespace {

// The pinned host bytes offload.delayed_update adds to the plan (memory_plan.cc): each unit's
// second gradient bank and its updated parameter shard, and with offload.optimizer NVME (whose
// serial step stages the gradients through the ring) the first bank too.
int64_t DelayedUpdateBytes(const zerotrain::JobSpec& job, const MemoryPlan& plan) {
  if (!job.offload().delayed_update().enabled()) return 0;
  const bool nvme = job.offload().optimizer() == zerotrain::OffloadConfig::NVME;
  int64_t bytes = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.name.ends_with(".grads.host.1") || b.name.ends_with(".params.host") ||
        (nvme && b.name.ends_with(".grads.host"))) {
      bytes += b.bytes();
    }
  }
  return bytes;
}

}  // namespace

absl::Status RunEstimate(const EstimateFlags& flags) {
  if (flags.plan) return RunEstimatePlan(flags);
  // Estimating needs neither the data files nor an engine that can run the job yet.
  absl::StatusOr<zerotrain::JobSpec> loaded =
      LoadValidatedJob(flags.job_file, {.check_paths = false,
                                        .check_engine_support = false,
                                        .deepspeed_config = flags.deepspeed,
                                        .deepspeed_world_size = flags.world_size,
                                        .zero_stage = flags.zero_stage});
  if (!loaded.ok()) return loaded.status();
  zerotrain::JobSpec job = *loaded;
  if (flags.world_size > 0) {
    // A new world shards over all its ranks (the job's shard_group_size was for its own).
    job.mutable_parallel()->set_world_size(flags.world_size);
    job.mutable_parallel()->set_shard_group_size(flags.world_size);
  }
  if (flags.zero_stage >= 0) job.mutable_parallel()->set_zero_stage(flags.zero_stage);
  if (job.parallel().zero_stage() > 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--zero-stage: must be in 0..3 (got %d)", job.parallel().zero_stage()));
  }
  const MemoryPlan plan = PlanMemory(job);
  // Every parameter of the model: total_numel counts a quantized base's weights too.
  const ModelLayout layout = BuildModelLayout(job.model());
  const int64_t params = layout.total_numel;
  const std::string name = job.name().empty() ? "job" : job.name();
  // A pipelined job's stages hold different units: each stage's plan (its first rank's; every
  // rank of a stage plans the same bytes), with the ZeRO-3 gathered units apart, since a stage
  // that reshards after each forward holds a pool of them rather than all its units.
  struct StagePlan {
    int64_t total = 0, gathered = 0;
  };
  std::vector<StagePlan> stages;
  if (const int p = job.parallel().pipeline_parallel(); p > 1) {
    const int per_stage = job.parallel().world_size() / p;
    for (int s = 0; s < p; ++s) {
      const MemoryPlan stage_plan = PlanMemory(job, ParallelLayout::ForJob(job, s * per_stage));
      stages.push_back({stage_plan.TotalBytes(), GatheredUnitBytes(stage_plan)});
    }
  }

  if (flags.json) {
    nlohmann::json per_rank;
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const auto category = static_cast<MemoryCategory>(c);
      per_rank[MemoryCategoryName(category)] = plan.CategoryBytes(category);
    }
    per_rank["total"] = plan.TotalBytes();
    nlohmann::json out = {
        {"job", name},
        {"parameters", params},
        {"world_size", job.parallel().world_size()},
        {"zero_stage", job.parallel().zero_stage()},
        {"offload",
         {{"optimizer", zerotrain::OffloadConfig::Device_Name(job.offload().optimizer())},
          {"params", zerotrain::OffloadConfig::Device_Name(job.offload().params())},
          {"delayed_update",
           {{"enabled", job.offload().delayed_update().enabled()},
            {"after_steps", job.offload().delayed_update().after_steps()},
            {"pinned_host_bytes", DelayedUpdateBytes(job, plan)}}}}},
        {"per_rank", per_rank},
        // Of per_rank's parameters: the ZeRO-3 units gathered whole (not a category of its own).
        {"gathered_units_per_rank", GatheredUnitBytes(plan)},
        {"per_rank_by_tier",
         {{"device", plan.DeviceBytes()},
          {"pinned_host", plan.CategoryBytes(MemoryCategory::kPinnedHost)},
          {"nvme", plan.CategoryBytes(MemoryCategory::kNvme)}}}};
    if (!stages.empty()) {
      nlohmann::json per_stage = nlohmann::json::array();
      for (const StagePlan& st : stages) {
        per_stage.push_back({{"total", st.total}, {"gathered_units", st.gathered}});
      }
      out["per_pipeline_stage"] = per_stage;
    }
    if (job.model().has_lora()) {
      const LoraMemoryBreakdown lora = LoraBreakdown(plan);
      out["lora"] = {
          {"base_dtype", zerotrain::ModelConfig::BaseDType_Name(job.model().base_dtype())},
          {"base_bytes", lora.base_bytes},
          {"adapter_parameters", BuildModelLayout(job.model()).lora_numel},
          {"adapter_bytes", lora.adapter_bytes},
          {"adapter_gradient_bytes", lora.adapter_gradient_bytes},
          {"adapter_optimizer_bytes", lora.adapter_optimizer_bytes},
          {"activation_bytes", lora.activation_bytes}};
    }
    if (job.resources().device_memory_bytes() > 0) {
      out["device_memory_bytes"] = job.resources().device_memory_bytes();
    }
    // With a DeepSpeed config, the whole spec it produced (defaults applied), by the JSON
    // mapping, so a script can check every field.
    if (!flags.deepspeed.empty()) {
      ZT_ASSIGN_OR_RETURN(const std::string spec, ToJson(job, /*indent=*/false));
      out["spec"] = nlohmann::json::parse(spec);
    }
    std::cout << out.dump(2) << "\n";
    return absl::OkStatus();
  }
  std::cout << absl::StrFormat("%s: %d parameters, world size %d, ZeRO stage %d — per rank:\n",
                               name, params, job.parallel().world_size(),
                               job.parallel().zero_stage());
  std::cout << absl::StrFormat("  %-14s %18s %12s %14s\n", "category", "bytes", "GiB",
                               "bytes/param");
  auto row = [&](const std::string& label, int64_t bytes) {
    std::cout << absl::StrFormat("  %-14s %18d %12.3f %14.3f\n", label, bytes,
                                 static_cast<double>(bytes) / (1ull << 30),
                                 static_cast<double>(bytes) / static_cast<double>(params));
  };
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    row(MemoryCategoryName(category), plan.CategoryBytes(category));
  }
  row("total", plan.TotalBytes());
  if (job.parallel().zero_stage() == 3) {
    // Of the parameters: the whole units gathered from the shards (a pool of
    // prefetch_units + 1 with reshard_after_forward, every unit without).
    row("gathered units", GatheredUnitBytes(plan));
  }
  if (!stages.empty()) {
    std::cout << "per pipeline stage:\n";
    for (size_t s = 0; s < stages.size(); ++s) {
      row(absl::StrFormat("stage %d", s), stages[s].total);
      if (job.parallel().zero_stage() == 3) row("  gathered", stages[s].gathered);
    }
  }
  if (job.model().has_lora()) {
    // A LoRA job: the frozen base trains nothing; the adapters carry the gradients and states.
    const LoraMemoryBreakdown lora = LoraBreakdown(plan);
    std::cout << absl::StrFormat("LoRA (rank %d on %d adapter parameters; base %s, frozen):\n",
                                 job.model().lora().rank(),
                                 BuildModelLayout(job.model()).lora_numel,
                                 zerotrain::ModelConfig::BaseDType_Name(job.model().base_dtype()));
    row("base", lora.base_bytes);
    row("adapters", lora.adapter_bytes);
    row("adapter grads", lora.adapter_gradient_bytes);
    row("adapter optim", lora.adapter_optimizer_bytes);
    row("activations", lora.activation_bytes);
  }
  // Where those bytes live: the device's arenas, the offload tier's pinned host pool (the
  // offloaded states, its ring, an async checkpoint's staging) and its NVMe swap store.
  std::cout << absl::StrFormat("where (offload.optimizer %s, offload.params %s):\n",
                               zerotrain::OffloadConfig::Device_Name(job.offload().optimizer()),
                               zerotrain::OffloadConfig::Device_Name(job.offload().params()));
  row("device", plan.DeviceBytes());
  row("pinned host", plan.CategoryBytes(MemoryCategory::kPinnedHost));
  row("nvme", plan.CategoryBytes(MemoryCategory::kNvme));
  if (const auto& delayed = job.offload().delayed_update(); delayed.enabled()) {
    // ZeRO-Offload's delayed update (docs/memory.md): its extra host buffers are in pinned host.
    std::cout << absl::StrFormat(
        "delayed update (offload.delayed_update): after step %d, %s of pinned host for its "
        "second gradient bank and parameter shards\n",
        delayed.after_steps(), FormatBytes(DelayedUpdateBytes(job, plan)));
  }
  if (const int64_t budget = job.resources().device_memory_bytes(); budget > 0) {
    std::cout << absl::StrFormat("device budget (resources.device_memory_bytes) %s: %s\n",
                                 FormatBytes(budget),
                                 plan.DeviceBytes() <= budget ? "fits" : "exceeded");
  }
  // What the DeepSpeed config became, so its user can check the mapping (docs/deepspeed.md).
  if (!flags.deepspeed.empty()) {
    std::cout << "training, with " << flags.deepspeed << ":\n" << TrainingSummary(job);
  }
  return absl::OkStatus();
}

}  // namespace zt::cli
