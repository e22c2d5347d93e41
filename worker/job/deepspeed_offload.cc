#include "worker/job/deepspeed_offload.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/job/offload_validation.h"

namespace zt::job_internal {
namespace {

using zerotrain::JobSpec;
using zerotrain::OffloadConfig;
using zerotrain::PrecisionConfig;

constexpr int64_t kAlignment = kSwapAlignment;
// DeepSpeed's offload_param.buffer_size is at most this many elements here: the bytes (× 4
// at most) stay far inside int64 and inside the validated 1 TiB.
constexpr int64_t kMaxBufferElements = int64_t{1} << 40;

// One DeepSpeed offload section, read.
struct Section {
  OffloadConfig::Device device = OffloadConfig::DEVICE_UNSPECIFIED;
  std::optional<std::string> nvme_path;
  std::optional<bool> pin_memory;
  std::optional<int64_t> buffer_count;
};

absl::StatusOr<std::optional<int64_t>> CountIn(const DsSection& s, const std::string& key,
                                               int64_t min, int64_t max) {
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> v, s.Integer(key));
  if (v && (*v < min || *v > max)) {
    return s.Error(key, absl::StrCat("must be in [", min, ", ", max, "] (got ", *v, ")"));
  }
  return v;
}

absl::StatusOr<std::optional<Section>> ReadSection(const DsSection& zero, const std::string& key,
                                                   const std::vector<std::string>& keys) {
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> s, zero.Object(key));
  if (!s) return std::optional<Section>();
  ZT_RETURN_IF_ERROR(s->CheckKeys(keys));
  Section out;
  ZT_ASSIGN_OR_RETURN(std::optional<std::string> device, s->String("device"));
  const std::string name = device.value_or("none");
  if (name == "none") {
    out.device = OffloadConfig::NONE;
  } else if (name == "cpu") {
    out.device = OffloadConfig::CPU;
  } else if (name == "nvme") {
    out.device = OffloadConfig::NVME;
  } else {
    return s->Error("device",
                    absl::StrCat("must be \"none\", \"cpu\" or \"nvme\" (got ", Quoted(name), ")"));
  }
  ZT_ASSIGN_OR_RETURN(out.nvme_path, s->String("nvme_path"));
  if (out.device == OffloadConfig::NVME && (!out.nvme_path || out.nvme_path->empty())) {
    return s->Error("nvme_path", "required with device \"nvme\": the swap store's directory");
  }
  ZT_ASSIGN_OR_RETURN(out.pin_memory, s->Bool("pin_memory"));
  ZT_ASSIGN_OR_RETURN(out.buffer_count, CountIn(*s, "buffer_count", 1, 1024));
  // Read-pipelining and initialisation knobs of DeepSpeed's own swapper: ZeroTrain's copy
  // queues always read ahead and write behind.
  for (const char* flag : {"pipeline_read", "pipeline_write", "fast_init"}) {
    if (s->Has(flag)) ZT_RETURN_IF_ERROR(s->Bool(flag).status());
  }
  // How many parameter elements DeepSpeed keeps in host memory with device "nvme": a cache
  // of its own, no effect on what is computed.
  if (s->Has("max_in_cpu")) {
    ZT_RETURN_IF_ERROR(CountIn(*s, "max_in_cpu", 0, std::numeric_limits<int64_t>::max()).status());
  }
  return std::optional<Section>(out);
}

std::string DeviceName(OffloadConfig::Device d) {
  switch (d) {
    case OffloadConfig::CPU:
      return "\"cpu\"";
    case OffloadConfig::NVME:
      return "\"nvme\"";
    default:
      return "\"none\"";
  }
}

int64_t ParamBytes(const JobSpec& job) {
  const PrecisionConfig::DType d = job.precision().param_dtype();
  return d == PrecisionConfig::BF16 || d == PrecisionConfig::FP16 ? 2 : 4;
}

}  // namespace

absl::Status ApplyOffload(const DsSection& zero, JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<Section> optimizer,
                      ReadSection(zero, "offload_optimizer",
                                  {"device", "nvme_path", "pin_memory", "buffer_count",
                                   "pipeline_read", "pipeline_write", "fast_init", "ratio"}));
  ZT_ASSIGN_OR_RETURN(
      std::optional<Section> params,
      ReadSection(zero, "offload_param",
                  {"device", "nvme_path", "pin_memory", "buffer_count", "buffer_size", "max_in_cpu",
                   "pipeline_read", "pipeline_write", "fast_init"}));
  if (optimizer) {
    const DsSection section = *zero.Object("offload_optimizer").value();
    ZT_ASSIGN_OR_RETURN(std::optional<double> ratio, section.Number("ratio"));
    if (ratio && *ratio != 1.0) {
      return section.Error("ratio",
                           absl::StrCat("must be 1 (got ", *ratio,
                                        "): ZeroTrain offloads the whole optimizer state, not a "
                                        "fraction of it"));
    }
  }
  ZT_ASSIGN_OR_RETURN(std::optional<bool> cpu_offload, zero.Bool("cpu_offload"));
  if (cpu_offload.value_or(false)) {
    if (optimizer) {
      return zero.Error("cpu_offload",
                        "true is the older spelling of offload_optimizer {device: \"cpu\"}; give "
                        "one of the two, not both");
    }
    optimizer = Section{.device = OffloadConfig::CPU};
  }
  if (!optimizer && !params) return absl::OkStatus();

  // DeepSpeed's rule, checked here so the error names the DeepSpeed keys; a stage the
  // config leaves to the job file is checked by validation (offload.*) after defaults.
  if (job->parallel().has_zero_stage()) {
    const int stage = job->parallel().zero_stage();
    if (optimizer && optimizer->device != OffloadConfig::NONE && stage < 1) {
      return zero.Error(
          cpu_offload.value_or(false) ? "cpu_offload" : "offload_optimizer.device",
          absl::StrCat(DeviceName(optimizer->device), " needs zero_optimization.stage >= 1 (got ",
                       stage, "): the offloaded optimizer state is the rank's shard"));
    }
    if (params && params->device != OffloadConfig::NONE && stage != 3) {
      return zero.Error(
          "offload_param.device",
          absl::StrCat(DeviceName(params->device), " needs zero_optimization.stage 3 (got ", stage,
                       "): only stage 3 shards the parameters"));
    }
  }
  const bool optimizer_nvme = optimizer && optimizer->device == OffloadConfig::NVME;
  const bool params_nvme = params && params->device == OffloadConfig::NVME;
  if (optimizer_nvme && params_nvme && *optimizer->nvme_path != *params->nvme_path) {
    return zero.Error("offload_param.nvme_path",
                      absl::StrCat(Quoted(*params->nvme_path),
                                   " differs from offload_optimizer."
                                   "nvme_path ",
                                   Quoted(*optimizer->nvme_path),
                                   ": ZeroTrain keeps one swap store per node, in one directory"));
  }
  if (optimizer && params && optimizer->pin_memory && params->pin_memory &&
      *optimizer->pin_memory != *params->pin_memory) {
    return zero.Error("offload_param.pin_memory",
                      "differs from offload_optimizer.pin_memory: ZeroTrain pins (or not) one "
                      "host pool for both");
  }

  OffloadConfig& offload = *job->mutable_offload();
  if (optimizer) offload.set_optimizer(optimizer->device);
  if (params) offload.set_params(params->device);
  if (optimizer_nvme) offload.set_nvme_path(*optimizer->nvme_path);
  if (params_nvme) offload.set_nvme_path(*params->nvme_path);
  for (const std::optional<Section>& s : {optimizer, params}) {
    if (!s) continue;
    if (s->pin_memory) offload.set_pin_memory(*s->pin_memory);
    if (s->buffer_count) {
      const int32_t count = static_cast<int32_t>(*s->buffer_count);
      offload.set_buffer_count(offload.has_buffer_count() ? std::max(offload.buffer_count(), count)
                                                          : count);
    }
  }
  if (params) {
    const DsSection section = *zero.Object("offload_param").value();
    ZT_ASSIGN_OR_RETURN(std::optional<int64_t> elements,
                        CountIn(section, "buffer_size", 1, kMaxBufferElements));
    if (elements) {
      const int64_t bytes = *elements * ParamBytes(*job);
      offload.set_buffer_size((bytes + kAlignment - 1) / kAlignment * kAlignment);
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyAio(const DsSection& root, JobSpec* job) {
  ZT_ASSIGN_OR_RETURN(std::optional<DsSection> aio, root.Object("aio"));
  if (!aio) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(aio->CheckKeys({"block_size", "queue_depth", "thread_count", "single_submit",
                                     "overlap_events", "intra_op_parallelism", "use_gds"}));
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> block,
                      CountIn(*aio, "block_size", 1, int64_t{1} << 30));
  if (block && *block % kAlignment != 0) {
    return aio->Error("block_size",
                      absl::StrCat("must be a multiple of ", kAlignment,
                                   " bytes, the swap store's O_DIRECT unit (got ", *block, ")"));
  }
  ZT_ASSIGN_OR_RETURN(std::optional<int64_t> depth, CountIn(*aio, "queue_depth", 1, 4096));
  ZT_RETURN_IF_ERROR(CountIn(*aio, "thread_count", 1, 1024).status());
  ZT_RETURN_IF_ERROR(CountIn(*aio, "intra_op_parallelism", 1, 1024).status());
  for (const char* flag : {"single_submit", "overlap_events"}) {
    if (aio->Has(flag)) ZT_RETURN_IF_ERROR(aio->Bool(flag).status());
  }
  ZT_ASSIGN_OR_RETURN(std::optional<bool> gds, aio->Bool("use_gds"));
  if (gds.value_or(false)) {
    return aio->Error("use_gds",
                      "true reads NVMe straight into GPU memory (GPUDirect Storage), which "
                      "ZeroTrain's swap store does not do; it stages through pinned host buffers");
  }
  if (block) job->mutable_offload()->mutable_aio()->set_block_size(*block);
  if (depth) job->mutable_offload()->mutable_aio()->set_queue_depth(static_cast<int32_t>(*depth));
  return absl::OkStatus();
}

}  // namespace zt::job_internal
