// `zt estimate JOBFILE --plan`: the sharding the planner (worker/plan/sharding_planner.h)
// chooses for the job on devices of a given size, and every alternative with why it lost.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/output_format.h"
#include "worker/job/job_file.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/plan/sharding_planner.h"
#include "worker/status_macros.h"

namespace zt::cli {
namespace {

// MemAvailable of /proc/meminfo: what a new process may take without swapping.
absl::StatusOr<int64_t> MemAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    const std::vector<std::string> parts =
        absl::StrSplit(line, ' ', absl::SkipWhitespace());  // "MemAvailable:", N, "kB"
    int64_t kib = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) return kib * 1024;
  }
  return absl::FailedPreconditionError(
      "--device-memory: not given, and /proc/meminfo has no MemAvailable line to default from");
}

std::string PolicyName(zerotrain::MemoryConfig::ActivationCheckpointing c) {
  return zerotrain::MemoryConfig::ActivationCheckpointing_Name(c);
}

// A plan from before offload was planned leaves the fields unset: NONE.
std::string OffloadName(zerotrain::OffloadConfig::Device d) {
  return d == zerotrain::OffloadConfig::DEVICE_UNSPECIFIED
             ? "NONE"
             : zerotrain::OffloadConfig::Device_Name(d);
}

// A plan from before layouts were planned leaves them 0: one rank.
int Layout(int32_t size) { return size > 0 ? size : 1; }

}  // namespace

absl::Status RunEstimatePlan(const EstimateFlags& flags) {
  ZT_ASSIGN_OR_RETURN(zerotrain::JobSpec job,
                      LoadJobForPlanning(flags.job_file, {.check_paths = false,
                                                          .check_engine_support = false,
                                                          .deepspeed_config = flags.deepspeed,
                                                          .deepspeed_world_size = flags.world_size,
                                                          .zero_stage = flags.zero_stage}));
  if (flags.world_size > 0) {
    // A new world shards over all its data-parallel ranks (the job's shard_group_size was for
    // its own): the planner takes each layout's data-parallel size.
    job.mutable_parallel()->set_world_size(flags.world_size);
    job.mutable_parallel()->clear_shard_group_size();
  }
  if (flags.zero_stage > 3) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--zero-stage: must be in 0..3 (got %d)", flags.zero_stage));
  }
  if (flags.zero_stage >= 0) job.mutable_parallel()->set_zero_stage(flags.zero_stage);
  const int ranks = job.parallel().world_size();

  int64_t device_bytes = 0;
  std::string device_source;
  const absl::StatusOr<int64_t> available = MemAvailableBytes();
  const int64_t job_budget = job.resources().device_memory_bytes();
  if (!flags.device_memory.empty()) {
    ZT_ASSIGN_OR_RETURN(device_bytes, ParseByteSize(flags.device_memory, "--device-memory"));
    device_source = "--device-memory";
  } else if (job_budget > 0) {
    device_bytes = job_budget;
    device_source = "resources.device_memory_bytes";
  } else {
    if (!available.ok()) return available.status();
    device_bytes = *available / ranks;
    device_source = absl::StrCat("this machine's MemAvailable ", FormatBytes(*available), " / ",
                                 ranks, ranks == 1 ? " rank" : " ranks");
  }
  // The offload tier's pinned pool comes out of this machine's memory: each rank's share,
  // less what a CPU device with its own budget takes from the same memory.
  int64_t host_bytes = 0;
  if (available.ok()) {
    host_bytes = *available / ranks;
    if (job.resources().device() == zerotrain::ResourceConfig::CPU && job_budget > 0) {
      host_bytes = std::max<int64_t>(1, host_bytes - std::min(job_budget, device_bytes));
    }
  }
  ZT_ASSIGN_OR_RETURN(const zerotrain::ShardingPlan plan,
                      PlanSharding(job, {.device_memory_bytes = device_bytes,
                                         .host_memory_bytes = host_bytes,
                                         .layouts = LayoutSearch::kAll}));
  if (flags.json) {
    ZT_ASSIGN_OR_RETURN(const std::string text, ToJson(plan));
    std::cout << text << "\n";
    return absl::OkStatus();
  }

  const std::string name = job.name().empty() ? "job" : job.name();
  const zerotrain::PlanCandidate& chosen = plan.chosen();
  std::cout << absl::StrFormat(
      "%s: %d parameters, world size %d, devices of %s (%s), %g%% kept free\n", name,
      BuildModelLayout(job.model()).total_numel, plan.world_size(),
      FormatBytes(plan.device_memory_bytes()), device_source, plan.safety_margin() * 100);
  std::cout << absl::StrFormat(
      "%s: tensor parallel %d × pipeline parallel %d, ZeRO stage %d, activation checkpointing "
      "%s, %s per rank%s\n",
      chosen.fits() ? "chosen" : "nothing fits; smallest", Layout(chosen.tensor_parallel()),
      Layout(chosen.pipeline_parallel()), chosen.zero_stage(),
      PolicyName(chosen.activation_checkpointing()), FormatBytes(chosen.peak_bytes_per_rank()),
      chosen.fits() ? "" : absl::StrCat(" (", chosen.rejected_because(), ")"));
  if (chosen.fits() && (chosen.offload_optimizer() != zerotrain::OffloadConfig::NONE ||
                        chosen.offload_params() != zerotrain::OffloadConfig::NONE)) {
    std::cout << absl::StrFormat(
        "offload: optimizer %s, params %s; %s of pinned host memory and %s of NVMe per rank\n",
        OffloadName(chosen.offload_optimizer()), OffloadName(chosen.offload_params()),
        FormatBytes(chosen.pinned_host_bytes_per_rank()),
        FormatBytes(chosen.nvme_bytes_per_rank()));
  }
  std::cout << "why: " << plan.reason() << "\n";
  std::cout << "pinned by the job: "
            << (plan.pinned().empty() ? "nothing" : absl::StrJoin(plan.pinned(), ", ")) << "\n";
  if (chosen.pipeline_parallel() > 1 || chosen.tensor_parallel() > 1) {
    std::cout << "note: tensor and pipeline parallel layouts train on CPU ranks (what they "
                 "compose with: docs/parallelism.md); the coordinator plans only the job's own "
                 "layout\n";
  }
  for (const std::string& layout : plan.rejected_layouts()) {
    std::cout << "layout not planned: " << layout << "\n";
  }
  std::cout << "\n";
  std::cout << absl::StrFormat("  %-5s %-5s %-5s %-13s %-9s %12s %12s %12s %12s %10s %7s %8s  %s\n",
                               "tp", "pp", "stage", "checkpointing", "offload", "device/rank",
                               "host/rank", "nvme/rank", "comm/step", "recompute", "bubble", "cost",
                               "fits");
  for (const zerotrain::PlanCandidate& c : plan.candidates()) {
    const bool is_chosen = c.tensor_parallel() == chosen.tensor_parallel() &&
                           c.pipeline_parallel() == chosen.pipeline_parallel() &&
                           c.zero_stage() == chosen.zero_stage() &&
                           c.activation_checkpointing() == chosen.activation_checkpointing() &&
                           c.offload_optimizer() == chosen.offload_optimizer() &&
                           c.offload_params() == chosen.offload_params();
    // "optimizer/params": NONE/NONE, CPU/NONE, NVME/NVME.
    const std::string offload =
        absl::StrCat(OffloadName(c.offload_optimizer()), "/", OffloadName(c.offload_params()));
    std::cout << absl::StrFormat(
        "%s %-5d %-5d %-5d %-13s %-9s %12s %12s %12s %12s %9.1f%% %6.1f%% %8.3f  %s\n",
        is_chosen ? "*" : " ", Layout(c.tensor_parallel()), Layout(c.pipeline_parallel()),
        c.zero_stage(), PolicyName(c.activation_checkpointing()), offload,
        FormatBytes(c.peak_bytes_per_rank()), FormatBytes(c.pinned_host_bytes_per_rank()),
        FormatBytes(c.nvme_bytes_per_rank()), FormatBytes(c.comm_bytes_per_step()),
        c.recompute_fraction() * 100, c.bubble_fraction() * 100, c.cost(),
        c.fits() ? "yes" : absl::StrCat("no: ", c.rejected_because()));
  }
  return absl::OkStatus();
}

}  // namespace zt::cli
