// The node daemon's Prometheus series: what each local rank measures, labelled
// {job_id, rank, node, device}. The training job is `job_id`, never `job`: Prometheus owns
// `job` (the scrape job) and `instance`, and would rename ours to `exported_job`.
//
//   zt_step                         gauge      the last completed step (alerts on no progress)
//   zt_step_duration_seconds        histogram  one optimizer step's wall time
//   zt_tokens_per_second            gauge      the whole job's tokens per second (last step)
//   zt_model_tflops_per_second      gauge      the whole job's model TFLOP/s (formula below)
//   zt_mfu                          gauge      model FLOP/s ÷ the job's devices' peak, 0..1
//   zt_loss, zt_validation_loss, zt_grad_norm, zt_learning_rate, zt_loss_scale   gauges
//   zt_skipped_steps_total          counter    steps skipped because fp16 gradients overflowed
//   zt_memory_bytes{category, source="plan"|"measured"}   gauge, the 8 categories of
//                                   MemoryCategoryName (measured: the arenas' high-water mark)
//   zt_comm_bytes_total{collective} counter    bytes this rank sent, by CommKindName
//   zt_comm_seconds_total{collective} counter  seconds its communicators ran that kind
//   zt_comm_wait_seconds_total      counter    seconds its compute blocked on communication
//   zt_step_seconds_total{part}     counter    the steps' wall time by part: compute,
//                                              comm_wait, optimizer, data_wait (they add up)
//   zt_offload_bytes_total{direction}  counter  offload.optimizer CPU: bytes the host optimizer
//                                   moved, direction "to_host" (gradients) / "to_device"
//                                   (updated parameters); swap_in / swap_out (offload.optimizer
//                                   or offload.params NVME: the swap store's reads and writes);
//                                   param_upload (offload.params CPU or NVME: the parameter
//                                   shards copied host → device into the gathers' slots)
//   zt_offload_seconds_total{direction} counter  seconds those copies took
//   zt_param_uploads_total{when}    counter    offload.params CPU: the gathers whose shard went
//                                   up "ahead" (off the compute thread, before the gather) or
//                                   "at_gather" (on the compute thread, when it was issued)
//   zt_host_optimizer_seconds_total counter    seconds of the host updates (inside the
//                                              "optimizer" part of zt_step_seconds_total)
//   (the pinned host pool's use is zt_memory_bytes{category="pinned_host"})
//   zt_checkpoint_save_seconds      gauge      the step loop's time in the last save
//   zt_checkpoint_saved_bytes_total counter    bytes of this rank's checkpoint files
//   zt_checkpoint_last_save_timestamp_seconds  gauge  unix time of the last save (or start)
//   zt_checkpoint_last_save_bytes   gauge      bytes of this rank's file in the last save
//   zt_checkpoint_last_step         gauge      the step of the last save (the resumed step
//                                              at start)
//   zt_checkpoint_interval_steps    gauge      checkpoint.interval_steps (0: no periodic saves)
//   zt_checkpoint_load_seconds      gauge      seconds restoring the resumed checkpoint
//
// Model FLOPs per token (PaLM, appendix B): 6·N + 12·L·T·C — N every parameter of the model
// (a tied embedding counted once: its lookup is free, the head's matmul costs 6·V·C), and the
// attention scores and their weighted sum, 2·T·C FLOPs forward per layer per token for each of
// QKᵀ and AV, tripled for backward, without the causal mask's halving. Activation
// checkpointing's recomputation is not counted (MFU measures useful work). The job's peak is
// the reporting rank's device peak × world size: the coordinator places a job on alike devices.
//
// A job's series go away with RemoveJob (called when its attempt ends), so /metrics does not
// grow with every job a node ever ran. Thread-safe: every rank thread records its own series.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace zt {

// 6·params + 12·n_layer·seq_len·d_model (see above).
double ModelFlopsPerToken(const zerotrain::JobSpec& job, int64_t params);

struct RankSeriesKey {
  std::string job;
  int rank = 0;
  std::string node;
  int device = 0;
  auto operator<=>(const RankSeriesKey&) const = default;
};

class NodeMetrics {
 public:
  // Registers the families on `registry` (not owned; outlives this object).
  explicit NodeMetrics(prometheus::Registry& registry);
  ~NodeMetrics();

  // The plan's bytes and the arenas' high-water marks by category.
  void RecordMemory(const RankSeriesKey& key, const MemoryPlan& plan, const Arenas& arenas);
  // One step: its duration, training figures, and the rank's communication counters so far
  // (`comm` is cumulative; the counters advance by the difference). `flops_per_token` from
  // ModelFlopsPerToken, `job_peak_flops` the job's devices together.
  // `unix_time`: when the step ended (the checkpoint's save time when it saved one).
  void RecordStep(const RankSeriesKey& key, const StepRecord& step, const CommStats& comm,
                  double flops_per_token, double job_peak_flops, double unix_time);
  // At the rank's start: the seconds it spent restoring its resumed checkpoint
  // (Trainer::resume_seconds), the step it starts from (its last checkpoint's, 0 when fresh),
  // the job's checkpoint.interval_steps, and the unix time now.
  struct Start {
    double load_seconds = 0;
    int64_t step = 0;
    int64_t checkpoint_interval_steps = 0;
    double unix_time = 0;
  };
  void RecordStart(const RankSeriesKey& key, const Start& start);
  // Removes every series labelled with `job`.
  void RemoveJob(const std::string& job);

 private:
  struct RankSeries;
  RankSeries& SeriesOf(const RankSeriesKey& key);  // requires mu_

  prometheus::Family<prometheus::Histogram>& step_duration_;
  prometheus::Family<prometheus::Gauge>& tokens_per_second_;
  prometheus::Family<prometheus::Gauge>& model_tflops_;
  prometheus::Family<prometheus::Gauge>& mfu_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& validation_loss_;
  prometheus::Family<prometheus::Gauge>& grad_norm_;
  prometheus::Family<prometheus::Gauge>& learning_rate_;
  prometheus::Family<prometheus::Gauge>& loss_scale_;
  prometheus::Family<prometheus::Counter>& skipped_steps_;
  prometheus::Family<prometheus::Gauge>& memory_bytes_;
  prometheus::Family<prometheus::Counter>& comm_bytes_;
  prometheus::Family<prometheus::Counter>& comm_seconds_;
  prometheus::Family<prometheus::Gauge>& checkpoint_save_seconds_;
  prometheus::Family<prometheus::Counter>& checkpoint_saved_bytes_;
  prometheus::Family<prometheus::Gauge>& checkpoint_load_seconds_;
  prometheus::Family<prometheus::Gauge>& checkpoint_last_save_time_;
  prometheus::Family<prometheus::Gauge>& checkpoint_last_save_bytes_;
  prometheus::Family<prometheus::Gauge>& checkpoint_last_step_;
  prometheus::Family<prometheus::Gauge>& checkpoint_interval_steps_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Counter>& comm_wait_seconds_;
  prometheus::Family<prometheus::Counter>& step_seconds_;
  prometheus::Family<prometheus::Counter>& offload_bytes_;
  prometheus::Family<prometheus::Counter>& offload_seconds_;
  prometheus::Family<prometheus::Counter>& param_uploads_;
  prometheus::Family<prometheus::Counter>& host_optimizer_seconds_;

  std::mutex mu_;
  std::map<RankSeriesKey, std::unique_ptr<RankSeries>> series_;  // guarded by mu_
};

}  // namespace zt
