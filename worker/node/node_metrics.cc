#include "worker/node/node_metrics.h"

#include <algorithm>
#include <array>
#include <vector>

namespace zt {
namespace {

// The parts of a step's wall time (StepRecord), as zt_step_seconds_total's `part` label.
enum StepPart { kCompute, kCommWait, kOptimizer, kDataWait, kNumStepParts };
constexpr std::array<const char*, kNumStepParts> kStepPartNames = {"compute", "comm_wait",
                                                                   "optimizer", "data_wait"};
// The directions of the host optimizer's copies, zt_offload_*_total's `direction` label:
// device → host and host → device, (offload.optimizer or params NVME) swap store → host and
// host → swap store, and (offload.params CPU or NVME) the parameter shards' host → device
// uploads into the gathers' slots.
enum OffloadDirection {
  kToHost,
  kToDevice,
  kSwapIn,
  kSwapOut,
  kParamUpload,
  kNumOffloadDirections
};
constexpr std::array<const char*, kNumOffloadDirections> kOffloadDirectionNames = {
    "to_host", "to_device", "swap_in", "swap_out", "param_upload"};
// When a gather's host shard went up (offload.params CPU), zt_param_uploads_total's `when`.
enum ParamUploadWhen { kAhead, kAtGather, kNumParamUploadWhens };
constexpr std::array<const char*, kNumParamUploadWhens> kParamUploadWhenNames = {"ahead",
                                                                                 "at_gather"};

// From a tiny model's 5 ms step to a large offloaded model's minute.
const prometheus::Histogram::BucketBoundaries& StepBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
  return buckets;
}

prometheus::Labels LabelsOf(const RankSeriesKey& key) {
  return {{"job_id", key.job},
          {"rank", std::to_string(key.rank)},
          {"node", key.node},
          {"device", std::to_string(key.device)}};
}

prometheus::Labels With(prometheus::Labels labels, const std::string& name,
                        const std::string& value) {
  labels.emplace(name, value);
  return labels;
}

}  // namespace

double ModelFlopsPerToken(const zerotrain::JobSpec& job, int64_t params) {
  const auto& model = job.model();
  const int64_t seq = job.data().seq_len() > 0 ? job.data().seq_len() : model.max_seq_len();
  return 6.0 * static_cast<double>(params) +
         12.0 * model.n_layer() * static_cast<double>(seq) * model.d_model();
}

struct NodeMetrics::RankSeries {
  prometheus::Histogram* step_duration = nullptr;
  prometheus::Gauge* tokens_per_second = nullptr;
  prometheus::Gauge* model_tflops = nullptr;
  prometheus::Gauge* mfu = nullptr;
  prometheus::Gauge* loss = nullptr;
  prometheus::Gauge* validation_loss = nullptr;  // from the first evaluation on
  prometheus::Gauge* grad_norm = nullptr;
  prometheus::Gauge* learning_rate = nullptr;
  prometheus::Gauge* loss_scale = nullptr;
  prometheus::Counter* skipped_steps = nullptr;
  prometheus::Gauge* checkpoint_save_seconds = nullptr;
  prometheus::Counter* checkpoint_saved_bytes = nullptr;
  prometheus::Gauge* checkpoint_load_seconds = nullptr;
  prometheus::Gauge* checkpoint_last_save_time = nullptr;
  prometheus::Gauge* checkpoint_last_save_bytes = nullptr;
  prometheus::Gauge* checkpoint_last_step = nullptr;
  prometheus::Gauge* checkpoint_interval_steps = nullptr;
  prometheus::Gauge* step = nullptr;
  prometheus::Counter* comm_wait_seconds = nullptr;
  std::array<prometheus::Counter*, kNumStepParts> step_seconds{};
  std::array<prometheus::Counter*, kNumOffloadDirections> offload_bytes{};
  std::array<prometheus::Counter*, kNumOffloadDirections> offload_seconds{};
  std::array<prometheus::Counter*, kNumParamUploadWhens> param_uploads{};
  prometheus::Counter* host_optimizer_seconds = nullptr;
  std::array<prometheus::Gauge*, kMemoryCategoryCount> memory_plan{};
  std::array<prometheus::Gauge*, kMemoryCategoryCount> memory_measured{};
  std::array<prometheus::Counter*, kNumCommKinds> comm_bytes{};
  std::array<prometheus::Counter*, kNumCommKinds> comm_seconds{};
  // What the counters have already been advanced to.
  int64_t skipped_seen = 0;
  CommStats comm_seen;
};

NodeMetrics::NodeMetrics(prometheus::Registry& registry)
    : step_duration_(prometheus::BuildHistogram()
                         .Name("zt_step_duration_seconds")
                         .Help("Wall time of one optimizer step")
                         .Register(registry)),
      tokens_per_second_(prometheus::BuildGauge()
                             .Name("zt_tokens_per_second")
                             .Help("Tokens per second of the whole job at the last step")
                             .Register(registry)),
      model_tflops_(prometheus::BuildGauge()
                        .Name("zt_model_tflops_per_second")
                        .Help("Model TFLOP/s of the whole job: (6*params + 12*layers*seq*d_model)"
                              " * tokens/s / 1e12")
                        .Register(registry)),
      mfu_(prometheus::BuildGauge()
               .Name("zt_mfu")
               .Help("Model FLOP/s over the job's devices' peak FLOP/s (0..1)")
               .Register(registry)),
      loss_(prometheus::BuildGauge()
                .Name("zt_loss")
                .Help("Training loss of the last step")
                .Register(registry)),
      validation_loss_(prometheus::BuildGauge()
                           .Name("zt_validation_loss")
                           .Help("Validation loss of the last evaluation")
                           .Register(registry)),
      grad_norm_(prometheus::BuildGauge()
                     .Name("zt_grad_norm")
                     .Help("Global gradient norm of the last step, before clipping")
                     .Register(registry)),
      learning_rate_(prometheus::BuildGauge()
                         .Name("zt_learning_rate")
                         .Help("Learning rate of the last step")
                         .Register(registry)),
      loss_scale_(prometheus::BuildGauge()
                      .Name("zt_loss_scale")
                      .Help("fp16 loss scale of the last step (1 without fp16)")
                      .Register(registry)),
      skipped_steps_(prometheus::BuildCounter()
                         .Name("zt_skipped_steps_total")
                         .Help("Steps skipped because fp16 gradients overflowed")
                         .Register(registry)),
      memory_bytes_(prometheus::BuildGauge()
                        .Name("zt_memory_bytes")
                        .Help("Memory by category: the plan's bytes (source=plan) and the "
                              "arenas' high-water mark (source=measured)")
                        .Register(registry)),
      comm_bytes_(prometheus::BuildCounter()
                      .Name("zt_comm_bytes_total")
                      .Help("Bytes this rank sent in collectives, by collective")
                      .Register(registry)),
      comm_seconds_(prometheus::BuildCounter()
                        .Name("zt_comm_seconds_total")
                        .Help("Seconds this rank's communicators ran collectives, by collective")
                        .Register(registry)),
      checkpoint_save_seconds_(
          prometheus::BuildGauge()
              .Name("zt_checkpoint_save_seconds")
              .Help("Seconds the step loop spent on the last checkpoint save (with async saves, "
                    "the copy into the staging buffer)")
              .Register(registry)),
      checkpoint_saved_bytes_(prometheus::BuildCounter()
                                  .Name("zt_checkpoint_saved_bytes_total")
                                  .Help("Bytes of this rank's checkpoint files saved")
                                  .Register(registry)),
      checkpoint_load_seconds_(prometheus::BuildGauge()
                                   .Name("zt_checkpoint_load_seconds")
                                   .Help("Seconds the rank spent restoring its resumed checkpoint")
                                   .Register(registry)),
      checkpoint_last_save_time_(
          prometheus::BuildGauge()
              .Name("zt_checkpoint_last_save_timestamp_seconds")
              .Help("Unix time of the rank's last checkpoint save (of its start until the first)")
              .Register(registry)),
      checkpoint_last_save_bytes_(prometheus::BuildGauge()
                                      .Name("zt_checkpoint_last_save_bytes")
                                      .Help("Bytes of this rank's checkpoint file in its last save")
                                      .Register(registry)),
      checkpoint_last_step_(prometheus::BuildGauge()
                                .Name("zt_checkpoint_last_step")
                                .Help("Step of the rank's last checkpoint save (the step it "
                                      "resumed from until the first)")
                                .Register(registry)),
      checkpoint_interval_steps_(prometheus::BuildGauge()
                                     .Name("zt_checkpoint_interval_steps")
                                     .Help("The job's checkpoint.interval_steps (0: no periodic "
                                           "saves)")
                                     .Register(registry)),
      step_(prometheus::BuildGauge()
                .Name("zt_step")
                .Help("The last completed optimizer step")
                .Register(registry)),
      comm_wait_seconds_(prometheus::BuildCounter()
                             .Name("zt_comm_wait_seconds_total")
                             .Help("Seconds this rank's compute blocked waiting for communication "
                                   "(what overlap did not hide)")
                             .Register(registry)),
      step_seconds_(prometheus::BuildCounter()
                        .Name("zt_step_seconds_total")
                        .Help("Steps' wall time by part: compute, comm_wait, optimizer, "
                              "data_wait (the parts add up to the step)")
                        .Register(registry)),
      offload_bytes_(prometheus::BuildCounter()
                         .Name("zt_offload_bytes_total")
                         .Help("Bytes the host optimizer step of offloaded optimizer states "
                               "copied, by direction: to_host (gradients), to_device "
                               "(parameters), swap_in and swap_out (states and parameter "
                               "shards read from and written to the NVMe swap store), "
                               "param_upload (offloaded parameter shards copied to the "
                               "device for their gathers)")
                         .Register(registry)),
      offload_seconds_(prometheus::BuildCounter()
                           .Name("zt_offload_seconds_total")
                           .Help("Seconds the offload copies took, by direction")
                           .Register(registry)),
      param_uploads_(prometheus::BuildCounter()
                         .Name("zt_param_uploads_total")
                         .Help("Gathers of host parameter shards (offload.params CPU) by when "
                               "the shard went up: ahead (off the compute thread) or at_gather")
                         .Register(registry)),
      host_optimizer_seconds_(prometheus::BuildCounter()
                                  .Name("zt_host_optimizer_seconds_total")
                                  .Help("Seconds of the optimizer updates run on the host for "
                                        "offloaded optimizer states")
                                  .Register(registry)) {}

NodeMetrics::~NodeMetrics() {
  std::vector<std::string> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, series] : series_) jobs.push_back(key.job);
  }
  for (const std::string& job : jobs) RemoveJob(job);
}

NodeMetrics::RankSeries& NodeMetrics::SeriesOf(const RankSeriesKey& key) {
  std::unique_ptr<RankSeries>& slot = series_[key];
  if (slot) return *slot;
  slot = std::make_unique<RankSeries>();
  RankSeries& s = *slot;
  const prometheus::Labels labels = LabelsOf(key);
  s.step_duration = &step_duration_.Add(labels, StepBuckets());
  s.tokens_per_second = &tokens_per_second_.Add(labels);
  s.model_tflops = &model_tflops_.Add(labels);
  s.mfu = &mfu_.Add(labels);
  s.loss = &loss_.Add(labels);
  s.grad_norm = &grad_norm_.Add(labels);
  s.learning_rate = &learning_rate_.Add(labels);
  s.loss_scale = &loss_scale_.Add(labels);
  s.skipped_steps = &skipped_steps_.Add(labels);
  s.checkpoint_save_seconds = &checkpoint_save_seconds_.Add(labels);
  s.checkpoint_saved_bytes = &checkpoint_saved_bytes_.Add(labels);
  s.checkpoint_load_seconds = &checkpoint_load_seconds_.Add(labels);
  s.checkpoint_last_save_time = &checkpoint_last_save_time_.Add(labels);
  s.checkpoint_last_save_bytes = &checkpoint_last_save_bytes_.Add(labels);
  s.checkpoint_last_step = &checkpoint_last_step_.Add(labels);
  s.checkpoint_interval_steps = &checkpoint_interval_steps_.Add(labels);
  s.step = &step_.Add(labels);
  s.comm_wait_seconds = &comm_wait_seconds_.Add(labels);
  for (int p = 0; p < kNumStepParts; ++p) {
    s.step_seconds[p] = &step_seconds_.Add(With(labels, "part", kStepPartNames[p]));
  }
  for (int d = 0; d < kNumOffloadDirections; ++d) {
    const auto with_direction = With(labels, "direction", kOffloadDirectionNames[d]);
    s.offload_bytes[d] = &offload_bytes_.Add(with_direction);
    s.offload_seconds[d] = &offload_seconds_.Add(with_direction);
  }
  for (int w = 0; w < kNumParamUploadWhens; ++w) {
    s.param_uploads[w] = &param_uploads_.Add(With(labels, "when", kParamUploadWhenNames[w]));
  }
  s.host_optimizer_seconds = &host_optimizer_seconds_.Add(labels);
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto with_category =
        With(labels, "category", MemoryCategoryName(static_cast<MemoryCategory>(c)));
    s.memory_plan[c] = &memory_bytes_.Add(With(with_category, "source", "plan"));
    s.memory_measured[c] = &memory_bytes_.Add(With(with_category, "source", "measured"));
  }
  for (int k = 0; k < kNumCommKinds; ++k) {
    const auto with_kind = With(labels, "collective", CommKindName(static_cast<CommKind>(k)));
    s.comm_bytes[k] = &comm_bytes_.Add(with_kind);
    s.comm_seconds[k] = &comm_seconds_.Add(with_kind);
  }
  return s;
}

void NodeMetrics::RecordMemory(const RankSeriesKey& key, const MemoryPlan& plan,
                               const Arenas& arenas) {
  std::lock_guard<std::mutex> lock(mu_);
  RankSeries& s = SeriesOf(key);
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    s.memory_plan[c]->Set(static_cast<double>(plan.CategoryBytes(category)));
    s.memory_measured[c]->Set(static_cast<double>(arenas.BytesInUse(category)));
  }
}

void NodeMetrics::RecordStart(const RankSeriesKey& key, const Start& start) {
  std::lock_guard<std::mutex> lock(mu_);
  RankSeries& s = SeriesOf(key);
  s.checkpoint_load_seconds->Set(start.load_seconds);
  s.step->Set(static_cast<double>(start.step));
  s.checkpoint_last_step->Set(static_cast<double>(start.step));
  s.checkpoint_last_save_time->Set(start.unix_time);
  s.checkpoint_interval_steps->Set(static_cast<double>(start.checkpoint_interval_steps));
}

void NodeMetrics::RecordStep(const RankSeriesKey& key, const StepRecord& step,
                             const CommStats& comm, double flops_per_token, double job_peak_flops,
                             double unix_time) {
  std::lock_guard<std::mutex> lock(mu_);
  RankSeries& s = SeriesOf(key);
  s.step->Set(static_cast<double>(step.step));
  s.comm_wait_seconds->Increment(std::max(0.0, step.comm_wait_s));
  const std::array<double, kNumStepParts> parts = {step.compute_s, step.comm_wait_s,
                                                   step.optimizer_s, step.data_wait_s};
  for (int p = 0; p < kNumStepParts; ++p) s.step_seconds[p]->Increment(std::max(0.0, parts[p]));
  const std::array<int64_t, kNumOffloadDirections> offload_bytes = {
      step.offload_bytes_to_host, step.offload_bytes_to_device, step.swap_bytes_in,
      step.swap_bytes_out, step.param_upload_bytes};
  const std::array<double, kNumOffloadDirections> offload_seconds = {
      step.offload_to_host_s, step.offload_to_device_s, step.swap_in_s, step.swap_out_s,
      step.param_upload_s};
  for (int d = 0; d < kNumOffloadDirections; ++d) {
    s.offload_bytes[d]->Increment(static_cast<double>(std::max<int64_t>(0, offload_bytes[d])));
    s.offload_seconds[d]->Increment(std::max(0.0, offload_seconds[d]));
  }
  const std::array<int64_t, kNumParamUploadWhens> uploads = {step.param_uploads_ahead,
                                                             step.param_uploads_at_gather};
  for (int w = 0; w < kNumParamUploadWhens; ++w) {
    s.param_uploads[w]->Increment(static_cast<double>(std::max<int64_t>(0, uploads[w])));
  }
  s.host_optimizer_seconds->Increment(std::max(0.0, step.host_optimizer_s));
  s.step_duration->Observe(step.step_ms / 1e3);
  s.tokens_per_second->Set(step.tokens_per_s);
  const double flops = flops_per_token * step.tokens_per_s;
  s.model_tflops->Set(flops / 1e12);
  s.mfu->Set(job_peak_flops > 0 ? flops / job_peak_flops : 0.0);
  s.loss->Set(step.loss);
  if (step.val_loss) {
    if (s.validation_loss == nullptr) s.validation_loss = &validation_loss_.Add(LabelsOf(key));
    s.validation_loss->Set(*step.val_loss);
  }
  s.grad_norm->Set(step.grad_norm);
  s.learning_rate->Set(step.lr);
  s.loss_scale->Set(step.loss_scale);
  if (step.skipped > s.skipped_seen) {
    s.skipped_steps->Increment(static_cast<double>(step.skipped - s.skipped_seen));
    s.skipped_seen = step.skipped;
  }
  if (step.checkpoint_bytes > 0) {
    s.checkpoint_save_seconds->Set(step.checkpoint_s);
    s.checkpoint_saved_bytes->Increment(static_cast<double>(step.checkpoint_bytes));
    s.checkpoint_last_save_time->Set(unix_time);
    s.checkpoint_last_step->Set(static_cast<double>(step.step));
    s.checkpoint_last_save_bytes->Set(static_cast<double>(step.checkpoint_bytes));
  }
  for (int k = 0; k < kNumCommKinds; ++k) {
    const CommStats::Entry& now = comm.by_kind[k];
    CommStats::Entry& seen = s.comm_seen.by_kind[k];
    if (now.bytes_sent > seen.bytes_sent) {
      s.comm_bytes[k]->Increment(static_cast<double>(now.bytes_sent - seen.bytes_sent));
    }
    if (now.seconds > seen.seconds) s.comm_seconds[k]->Increment(now.seconds - seen.seconds);
    seen = now;
  }
}

void NodeMetrics::RemoveJob(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = series_.begin(); it != series_.end();) {
    if (it->first.job != job) {
      ++it;
      continue;
    }
    RankSeries& s = *it->second;
    step_duration_.Remove(s.step_duration);
    tokens_per_second_.Remove(s.tokens_per_second);
    model_tflops_.Remove(s.model_tflops);
    mfu_.Remove(s.mfu);
    loss_.Remove(s.loss);
    if (s.validation_loss != nullptr) validation_loss_.Remove(s.validation_loss);
    grad_norm_.Remove(s.grad_norm);
    learning_rate_.Remove(s.learning_rate);
    loss_scale_.Remove(s.loss_scale);
    skipped_steps_.Remove(s.skipped_steps);
    checkpoint_save_seconds_.Remove(s.checkpoint_save_seconds);
    checkpoint_saved_bytes_.Remove(s.checkpoint_saved_bytes);
    checkpoint_load_seconds_.Remove(s.checkpoint_load_seconds);
    checkpoint_last_save_time_.Remove(s.checkpoint_last_save_time);
    checkpoint_last_save_bytes_.Remove(s.checkpoint_last_save_bytes);
    checkpoint_last_step_.Remove(s.checkpoint_last_step);
    checkpoint_interval_steps_.Remove(s.checkpoint_interval_steps);
    step_.Remove(s.step);
    comm_wait_seconds_.Remove(s.comm_wait_seconds);
    for (int p = 0; p < kNumStepParts; ++p) step_seconds_.Remove(s.step_seconds[p]);
    for (int d = 0; d < kNumOffloadDirections; ++d) {
      offload_bytes_.Remove(s.offload_bytes[d]);
      offload_seconds_.Remove(s.offload_seconds[d]);
    }
    for (int w = 0; w < kNumParamUploadWhens; ++w) param_uploads_.Remove(s.param_uploads[w]);
    host_optimizer_seconds_.Remove(s.host_optimizer_seconds);
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      memory_bytes_.Remove(s.memory_plan[c]);
      memory_bytes_.Remove(s.memory_measured[c]);
    }
    for (int k = 0; k < kNumCommKinds; ++k) {
      comm_bytes_.Remove(s.comm_bytes[k]);
      comm_seconds_.Remove(s.comm_seconds[k]);
    }
    it = series_.erase(it);
  }
}

}  // namespace zt
