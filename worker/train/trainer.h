// The trainer: one rank's step loop over a validated job.
//
// Create() does all the set-up — opens the data, plans memory, allocates the arenas, binds
// the model, connects the rank's communicators, initialises or imports the weights (each rank
// only its own range of sharded states), builds the optimizer — so Run() allocates nothing.
// Each step: zero gradients; for each of grad_accum_steps micro-batches, forward + backward
// through the sharding engine (worker/shard/sharding_engine.h: gathers, reductions; the loss
// is averaged over the global batch of all ranks); global gradient norm and clipping; learning
// rate from the schedule; optimizer update of the rank's range; parameter all-gather where
// the stage needs it. Data-parallel rank r of N reads global micro-batch (step·A + a)·N + r.
// Rank 0 writes <run_dir>/metrics.jsonl, one JSON line per step:
//   {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "loss_scale", "skipped",
//    "comm_bytes", "comm_s", "comm_wait_s", "data_wait_s", "optimizer_s", "compute_s"}  (+
//    "val_loss" every eval_interval steps and after the last; + "offload_bytes_to_host",
//    "offload_bytes_to_device", "offload_to_host_s", "offload_to_device_s",
//    "host_optimizer_s" when the optimizer is offloaded; + "swap_bytes_in", "swap_bytes_out",
//    "swap_in_s", "swap_out_s" when it is offloaded to NVMe; "param_upload_bytes",
//    "param_upload_s", "param_uploads_ahead", "param_uploads_at_gather" always, 0 unless the
//    parameter shards live off the device, offload.params CPU or NVME)
// and every rank its plan beside its arenas' high-water marks by category: memory.json for
// rank 0, memory.rank<r>.json for the others. tokens_per_s counts the whole job's tokens.
// Mixed precision: 16-bit parameters are updated from fp32 master weights by the optimizer;
// with FP16 a dynamic loss scaler multiplies the loss gradient, skips steps whose gradients
// overflow (on any rank) and backs off (worker/optim/loss_scaler.h).
// Device: every crossing between the rank's memory and the host goes through its RankDevice
// (worker/train/rank_device.h): per micro-batch the sampler fills host staging and the tokens
// and targets go up in one copy each; the loss, the gradient norm and the overflow flag stay
// on the device and come back with the other ranks' in one read per step (the step loop's one
// wait); weights are generated on the host and uploaded; checkpoints, resume, FullWeights
// and Evaluate move their bytes through it too. Nothing is allocated in the step loop.
// Offload (offload.optimizer CPU, ZeRO-Offload): the fp32 master weights and optimizer states
// are the plan's pinned_host buffers, apart from the device's arenas; the update runs unit by
// unit on the host (worker/optim/host_optimizer.h): each unit's reduced gradient shard comes
// down through the rank's copy engine into the offload ring, is stepped there, and the updated
// parameters go back up. On the CPU the run is bit for bit the run without offload.
// offload.optimizer NVME (ZeRO-Infinity's optimizer offload): the master weights and states
// live in the node's swap store instead, streamed unit by unit through the plan's ring during
// the step (worker/offload/nvme_optimizer.h), a new generation committed per step; the
// checkpoint reads them from the store and a resume writes them back. Bit for bit too.
// Not thread-safe; one per rank (ranks of one process are threads, each with its Trainer).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "proto/job.pb.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/comm/store.h"
#include "worker/train/micro_batches.h"
#include "worker/model/transformer.h"
#include "worker/offload/nvme_optimizer.h"
#include "worker/offload/swapped_base.h"
#include "worker/optim/delayed_host_step.h"
#include "worker/optim/gradient_downloads.h"
#include "worker/optim/host_optimizer.h"
#include "worker/optim/loss_scaler.h"
#include "worker/optim/optimizer.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"
#include "worker/shard/rank_communicators.h"
#include "worker/shard/sharding_engine.h"
#include "worker/train/stop_request.h"
#include "worker/train/rank_device.h"

namespace zt {

struct TrainOptions {
  // Where metrics.jsonl goes (created if missing). Empty: no files are written.
  std::string run_dir;
  // Stop after this global step (0 ≤ n ≤ max_steps) without changing the schedule;
  // unset: run to max_steps. 0 trains nothing (import → export conversions).
  std::optional<int64_t> stop_after_step;
  // Print a progress line to stderr every train.log_interval steps (rank 0 only).
  bool progress = false;
  // This rank, in [0, parallel.world_size).
  int rank = 0;
  // CUDA jobs: the GPU ordinal a coordinator placed this rank on (RankPlacement.device);
  // -1: local rank % the visible GPUs (worker/train/rank_device.h).
  int cuda_device = -1;
  // The job's rendezvous store, shared by all its ranks; not owned. Null: a one-rank job
  // rendezvouses with itself in a store of its own.
  Store* store = nullptr;
  // Continue from the checkpoint `latest` names in this directory (usually checkpoint.dir):
  // the model states, the step, the optimizer's step count and the loss scaler, so the run
  // goes on exactly as if it had never stopped. metrics.jsonl is appended to.
  std::string resume_dir;
  // When that checkpoint does not verify, take the newest older one that does (and say so on
  // stderr) instead of failing.
  bool resume_fallback = false;
  // Whose checkpoints checkpoint.dir holds (worker/checkpoint/checkpoint_owner.h): a daemon
  // job's id; empty: LocalRunOwner(name), a `zt train` run. A run refuses a directory that
  // holds another job's checkpoints, and claims it before its first save.
  std::string checkpoint_owner;
  // Continue another job's checkpoints in checkpoint.dir: an explicit request (`zt train
  // --resume`, `zt resume DIR --job FILE`); the run claims the directory.
  bool take_over_checkpoints = false;
  // Polled at every step; not owned, may be null. Run() stops after the step at which any
  // rank of the job saw a request (all ranks agree on that step), first saving a checkpoint
  // when one was asked for and checkpoint.dir is set.
  const StopRequest* stop = nullptr;
  // offload.optimizer NVME: the node's swap store (worker/offload/node_swap_store.h), shared
  // by the process's ranks; not owned. Null: the rank opens one of its own (a one-rank process).
  offload::SwapStore* swap_store = nullptr;
  // Makes the rank's device (worker/train/rank_device.h); null: RankDevice::Create, the job's
  // resources.device. Tests inject one to count or reroute the host ↔ device crossings.
  std::function<absl::StatusOr<std::unique_ptr<RankDevice>>(const zerotrain::JobSpec& job,
                                                            int rank)>
      make_device;
  // Probes of offload.delayed_update for tests (worker/optim/delayed_host_step.h), or null:
  // called on the host step's thread as the host update of step `step` starts and once it has
  // ended, and on the rank's thread when step `step`'s last backward has ended.
  std::function<void(int64_t step)> on_host_step_start;
  std::function<void(int64_t step)> on_host_step_end;
  std::function<void(int64_t step)> on_backward_ended;
};

// What one optimizer step measured.
struct StepRecord {
  int64_t step = 0;  // 1-based
  double loss = 0;
  float lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double step_ms = 0;
  std::optional<double> val_loss;
  double loss_scale = 1;   // the scale this step's backward ran with (1 without fp16)
  int64_t skipped = 0;     // steps skipped so far because fp16 gradients overflowed
  // Bytes this rank sent in the step: its collectives and a pipeline stage's point-to-point
  // activations and gradients.
  int64_t comm_bytes = 0;
  double comm_s = 0;       // seconds its communicators spent running them
  double comm_wait_s = 0;  // seconds its compute waited for them (not hidden by overlap)
  // The step's wall time in parts (they add up to step_ms): waiting for the sampler to fill
  // the micro-batches, the optimizer update with its parameter all-gather and the loss
  // scaler, communication waits (comm_wait_s), and the rest, compute.
  double data_wait_s = 0;
  double optimizer_s = 0;
  double compute_s = 0;
  // Pipeline parallelism: the share of the schedule's stage-time no stage computed in,
  // 1 − Σ_stages busy / (p · the slowest stage's schedule wall time); busy is a stage's
  // forwards and backwards, the rest its waits for the neighbours (the bubble, and transfers).
  // The unit-time model's (p − 1)/(v·m + p − 1) is worker/plan/pipeline_bubble.h's.
  std::optional<double> pipeline_bubble;
  // This stage's part of it: its forwards' and backwards' seconds, and its schedule's wall time.
  double pipeline_busy_s = 0;
  double pipeline_span_s = 0;
  // offload.optimizer CPU: this step's host optimizer (part of optimizer_s) — bytes its copy
  // engine moved device → host (gradients) and host → device (parameters), the seconds
  // those copies took, and the seconds of the host updates. Zero without offload. With
  // offload.delayed_update, once it has started: the host updates that finished in this step
  // (the previous step's, ran beside this step's compute; and this step's own when it
  // drains), the uploads of their parameters and this step's gradients' copies.
  int64_t offload_bytes_to_host = 0;
  int64_t offload_bytes_to_device = 0;
  double offload_to_host_s = 0;
  double offload_to_device_s = 0;
  double host_optimizer_s = 0;
  // offload.optimizer NVME: this step's bytes read from and written to the swap store, and
  // the seconds the copy queue spent on them (writes include the commit).
  int64_t swap_bytes_in = 0;
  int64_t swap_bytes_out = 0;
  double swap_in_s = 0;
  double swap_out_s = 0;
  // offload.params CPU or NVME (stage 3): this step's host → device copies of the rank's
  // parameter shards into the gathers' slots (ShardingEngine::param_upload_bytes), the seconds
  // those copies took (on the upload thread when ahead, so not a part of step_ms), and how
  // many of the step's gathers found their shard uploaded ahead (a pass's first gathers at the
  // step's start or between micro-batches, later ones a use before their gather) vs uploaded
  // it themselves on the compute thread (offload.params CPU; with NVME the gather uploads from
  // the ring buffer its shard was read into, and the counts of reads ahead are the swap's).
  int64_t param_upload_bytes = 0;
  double param_upload_s = 0;
  int64_t param_uploads_ahead = 0;
  int64_t param_uploads_at_gather = 0;
  StopKind stop = StopKind::kNone;  // the stop request the ranks agreed on at this step
  // Seconds the step loop spent saving a checkpoint after this step (0 when none was due;
  // with checkpoint.async, the copy into the staging buffer), and the bytes of this rank's
  // file.
  double checkpoint_s = 0;
  int64_t checkpoint_bytes = 0;
};

// FP16 anywhere in the precision settings turns dynamic loss scaling on.
bool LossScalingEnabled(const zerotrain::PrecisionConfig& precision);

class Trainer {
 public:
  // `job` must have defaults applied and be validated (worker/job/).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const zerotrain::JobSpec& job,
                                                         const TrainOptions& options);

  // Runs to stop_after_step (or max_steps), calling `on_step` after each step if set, or
  // until a stop request (TrainOptions::stop) ends it early: then stopped_early() is true.
  absl::Status Run(const std::function<void(const StepRecord&)>& on_step = nullptr);

  // One optimizer step (the unit Run() is made of). With offload.delayed_update past its
  // warm-up, the step's host update still runs when Step returns, unless the step drains
  // (a checkpoint, evaluation, max_steps, stop_after_step or a stop request is due at it).
  absl::StatusOr<StepRecord> Step();
  // offload.delayed_update: waits for a host update still running and uploads its parameters
  // (a collective at ZeRO stages 1-2: the parameters' all-gather). Evaluate, SaveCheckpoint and
  // FullWeights call it first; so must anything else that reads the weights or the optimizer's
  // state after a Step that did not drain. OK at once when nothing is pending.
  absl::Status FinishDelayedUpdate();
  // Host updates launched beside the next step's compute so far (0 without the delayed update).
  int64_t delayed_host_steps() const { return delayed_ ? delayed_->launched() : 0; }
  // Validation loss: the mean over every target counted (DocumentSampler::CountedTargets) in
  // the eval_steps micro-batches of each data-parallel rank from the start of data.val, as
  // the training loss is a token-level mean over the step (each rank evaluates its share; a
  // collective). Its offload traffic (offload.params uploads and swap reads) is reported in
  // a step's record: under Run the evaluated step's, called between steps the next step's.
  absl::StatusOr<double> Evaluate();

  const MemoryPlan& plan() const { return plan_; }
  const Arenas& arenas() const { return *arenas_; }
  // The bytes of the plan's buffer `b` wherever they live: its arena, or (a swapped buffer)
  // the swap store's committed generation, read into a ring buffer valid until the next
  // step or call. Between steps, on the rank's thread.
  absl::StatusOr<const void*> BufferBytes(const BufferSpec& b);
  // offload.optimizer NVME: the rank's swap step (its stats, its store); null otherwise.
  const NvmeOptimizer* nvme_optimizer() const { return nvme_optimizer_.get(); }
  const SwappedBase* swapped_base() const { return swapped_base_.get(); }
  // The rank's sharding engine (its counters, for tests); null before Create finished.
  const ShardingEngine* sharding_engine() const { return engine_.get(); }
  const GradientDownloads* gradient_downloads() const { return grad_downloads_.get(); }
  Transformer& model() { return *model_; }
  // The whole model's weights in fp32, one vector per unit, on every rank: the master
  // weights when the parameters are 16-bit, else the parameters, gathered from the shards
  // (and, with tensor parallelism, joined from the TP ranks' shares: BuildModelLayout's units,
  // not model().layout()'s). A collective: every rank of the job calls it. What export writes.
  absl::StatusOr<std::vector<std::vector<float>>> FullWeights();
  // A LoRA job (model.lora): each unit's adapters ("<unit>.lora", f32, lora_numel elements;
  // empty for units without adapters), whole on every rank — what a PEFT export writes —
  // indexed by BuildModelLayout's units. Not a collective without pipeline parallelism; with
  // it every rank calls it (each block's adapters are broadcast from their stage). FullWeights
  // refuses a LoRA job.
  absl::StatusOr<std::vector<std::vector<float>>> FullAdapters();
  // Bytes and seconds of this rank's collectives so far.
  // Every communicator of the rank: the sharding engine's, the tensor-parallel groups', the
  // pipeline's point-to-point links and the host step's own statistics sums.
  CommStats comm_stats() const {
    CommStats total = engine_->stats();
    total += comms_.OutsideEngineStats();
    total += host_step_comm_stats_();
    return total;
  }
  // Seconds this rank's compute waited for communication (what overlap did not hide).
  double comm_wait_seconds() const { return engine_->waited_seconds(); }
  int rank() const { return options_.rank; }
  const DeviceContext& context() const { return ctx_; }
  // Which CPU GEMM the ops use (benchmarks compare them).
  void set_cpu_gemm(CpuGemm gemm) { ctx_.cpu_gemm = gemm; }
  int64_t step() const { return step_; }
  bool stopped_early() const { return stopped_early_; }
  // Seconds Create() spent restoring the resumed checkpoint (0 for a fresh start).
  double resume_seconds() const { return resume_seconds_; }
  const zerotrain::JobSpec& job() const { return job_; }

 private:
  Trainer() = default;
  absl::Status AppendMetrics(const StepRecord& r);
  // The offload counters a step's record reports the differences of, cumulative: the swap
  // store's traffic (the NVMe optimizer's queue, a swapped LoRA base's) and the sharding
  // engine's parameter-shard uploads (offload.params).
  struct OffloadCounters {
    NvmeOptimizer::Stats swap;
    SwappedBase::Stats base;
    int64_t upload_bytes = 0;
    double upload_s = 0;
    int64_t uploads_ahead = 0;
    int64_t uploads_at_gather = 0;
  };
  OffloadCounters OffloadCountersNow() const;
  // Adds what moved since `before` to r's swap_* and param_upload* fields: the step's own
  // traffic (Step), and an evaluation's (Evaluate, into evaluation_traffic_).
  void AddOffloadTraffic(const OffloadCounters& before, StepRecord& r) const;
  // The offload traffic (the swap_* and param_upload* fields only) of evaluations that no
  // step's record has reported yet: Evaluate adds its own here, and ReportEvaluationTraffic
  // moves it into a record — Run's into the line of the step the evaluation follows, Step's
  // (an Evaluate called between steps outside Run) into the next step's line.
  StepRecord evaluation_traffic_;
  void ReportEvaluationTraffic(StepRecord& r);
  // <run_dir>/memory.json: the plan's bytes by category beside the arenas' high-water marks.
  absl::Status WriteMemoryReport(const std::string& path) const;
  // The model's tensor-parallel group: its collectives run on t's comms_ (connected after the
  // model binds).
  static TensorParallelGroup TensorParallelOf(const ParallelLayout& layout, Trainer* t);
  // The shard group a tied embedding is split over by rows (VocabularyShardedEmbedding): the
  // rank's rows are its ZeRO shard of the embedding (ShardOfUnit).
  static VocabShardGroup VocabShardGroupOf(const ParallelLayout& layout, const ModelLayout& model,
                                           Trainer* t);
  // FullWeights of a tensor-parallel rank: its units (its shares) become the whole model's.
  absl::Status JoinTensorParallelShares(std::vector<std::vector<float>>& units);
  // Sets the weights from the initialisation or the imported checkpoint: each rank its ranges.
  absl::Status InitializeWeights();
  // A LoRA job's adapters (PEFT's init from train.seed, then model.lora.init_from when set)
  // and its NF4 or INT8 base weights (the seeded init, quantized one tensor at a time).
  absl::Status InitializeAdapters();
  // offload.optimizer NVME of a LoRA job: the store's first generation of the adapters'
  // optimizer states (zeros). Nothing without an NVMe optimizer.
  absl::Status InitializeSwappedAdapterStates();
  // A LoRA job with offload.params NVME: its frozen base in the swap store, read by the gathers
  // (worker/offload/swapped_base.h).
  absl::Status CreateSwappedBase();
  // Saves the step just taken into checkpoint.dir (every rank takes part; worker/
  // checkpoint_writer.h), then applies checkpoint.on_save_error to the outcome.
  // `final`: the save at max_steps or of a stop (see SaveOutcome).
  absl::Status SaveCheckpoint(bool final);
  // Whether something reads the weights and optimizer states after step `step` (1-based):
  // Run's checkpoint or evaluation, the run's last step, a stop the ranks agreed on. Such a
  // step finishes its delayed host update (offload.delayed_update) and commits its NVMe
  // generation before it returns. A function of the job, the options and the agreed stop
  // alone, so every rank drains at the same steps.
  bool StateReadAfterStep(int64_t step, StopKind stop) const;
  // The delayed update at the end of a step's backward and statistics: the previous step's
  // host update is waited for and its parameters uploaded and gathered, then this step's
  // starts beside the next step's compute (and is finished at once when `drain`). Adds what
  // finished to `r`.
  struct DelayedUpdateArgs {
    float lr = 0;
    float grad_scale = 1;
    uint64_t seed = 0;
    bool drain = false;
  };
  absl::Status DelayedHostUpdate(const DelayedUpdateArgs& args, StepRecord& r);
  // Finish's outcome into `r` and the parameters' all-gather (ZeRO stages 1-2).
  absl::Status LandDelayedUpdate(StepRecord* r);
  // `saved` as the run's outcome: with on_save_error CONTINUE a failed save is reported and
  // training goes on, unless it is the `final` one (at max_steps, or the checkpoint of a
  // stop): a run whose last state is not saved never succeeds.
  absl::Status SaveOutcome(absl::Status saved, bool final);
  // Restores the state options_.resume_dir's checkpoint holds (each rank its own file).
  absl::Status Resume();

  // Resume's restore of a device whose memory the host cannot address: the checkpoint is read
  // into host copies of the checkpointed buffers, then uploaded.
  absl::Status RestoreThroughHost(bool weights_only,
                                  const std::function<absl::Status(const Arenas& into)>& read);
  // A pipeline stage's part of the step (pipeline_parallel > 1): its forwards and backwards in
  // the schedule's order (worker/plan/pipeline_schedule.h), activations received from the
  // previous stage and sent to the next, their gradients back; then the tied embedding's
  // copies summed and the stage's gradients reduced in its data-parallel group.
  struct PipelineTiming {
    double busy_s = 0;  // this stage's forwards and backwards
    double span_s = 0;  // the schedule's wall time on this stage, to its last send's end
  };
  // The last stage's loss gradient takes loss_scale / step_counted per counted target, every
  // micro-batch's loss its share of the step's counted targets (Step).
  absl::Status RunPipelineSchedule(double loss_scale, int64_t step_counted, double* data_wait_s,
                                   PipelineTiming* timing);
  // Evaluate's part on a pipeline stage: the forwards of validation micro-batches 0..n − 1
  // (each data-parallel rank its own) through the stage's chunks, activations received from
  // the previous stage and sent to the next; the last stage adds each one's loss to the
  // engine's accumulator, weighed by its counted targets out of `total_counted`, the targets
  // of every rank's n micro-batches (the token-level mean, as Evaluate's).
  absl::Status RunPipelineEvaluation(int64_t n, int64_t total_counted);
  // StepRecord::pipeline_bubble from every stage's timing (an all-gather over the pipeline).
  absl::StatusOr<double> PipelineBubble(const PipelineTiming& timing);
  // Fills host staging with `batches`' micro-batch k and uploads it into the model's tokens
  // and targets (one copy each); a packed batch's document starts and positions too, into the
  // plan's batch buffers, which the model then reads (SetDocuments). Returns how many targets
  // count (B·T unless documents mask some).
  absl::StatusOr<int64_t> UploadBatch(MicroBatches& batches, int64_t k);
  // Puts the stop request in this rank's slot, all-gathers the ranks' step statistics and
  // reads them back in one copy: the wait of the step.
  absl::StatusOr<StepTotals> ReadStatistics(int stop_request, double loss_divisor);
  // The rank's optimizer: the host optimizer's when the optimizer is offloaded.
  Optimizer& optimizer() {
    return host_optimizer_   ? host_optimizer_->optimizer()
           : nvme_optimizer_ ? nvme_optimizer_->optimizer()
                             : *optimizer_;
  }
  // A LoRA job's NF4 or INT8 base from a Hugging Face model.init_from, quantized while it streams
  // in: each quantized weight is assembled in f32 from its tensors (q/k/v, gate/up fill rows
  // of one fused weight) and quantized as soon as it is whole; every other tensor goes,
  // a piece at a time, into the rank's part of its unit's parameters. The host holds the
  // quantized base, one f32 weight and one piece, never the file. A tensor-parallel rank
  // reads the whole model's tensors: each quantized weight whole (it keeps its share,
  // Transformer::QuantizeBaseWeight), the rest into whole f32 units whose shares it uploads
  // after the stream.
  absl::Status StreamQuantizedBase(std::vector<float>& values, const Tensor& chunk);
  // The sets of the initialisation for unit u: its parameters (the model's, or
  // `swapped_params` when set: a swapped shard's ring buffer), and `master` (the rank's range
  // of its master weights; empty when the parameters are their own master).
  absl::Status InitializeUnit(int u, const Tensor& master,
                              const std::vector<std::vector<float>>& imported,
                              std::vector<float>& values, const Tensor& chunk,
                              const Tensor& swapped_params = Tensor());
  // Resume's restore of the swapped states (offload.optimizer NVME): unit by unit through a
  // host copy of that unit's swapped buffers, written to the store as a new generation.
  absl::Status RestoreSwapped(
      bool weights_only,
      const std::function<absl::Status(const MemoryPlan& plan, const Arenas& into)>& read);
  // The plan's name of unit u's master weights ("<unit>.master", or ".master_low" split).
  std::string MasterName(int u) const;
  // `plan_` without its swapped (kNvme) buffers: what the arenas hold.
  MemoryPlan ArenaPlan() const;

  // First: destroyed last, after everything that uses its stream and memory.
  std::unique_ptr<RankDevice> device_;
  zerotrain::JobSpec job_;
  TrainOptions options_;
  DeviceContext ctx_;
  // Host staging (the device's, page-locked on CUDA): a micro-batch's tokens and targets, the
  // stop request, and every rank's step statistics read back.
  int32_t* host_tokens_ = nullptr;
  int32_t* host_targets_ = nullptr;
  // data.packing: a micro-batch's document starts and positions, staged on the host (B·T i32
  // each: the starts' B·S ≤ B·T) and the plan's device buffers they are uploaded into
  // (batch.doc_starts, batch.positions); null and empty otherwise.
  int32_t* host_doc_starts_ = nullptr;
  int32_t* host_positions_ = nullptr;
  Tensor batch_doc_starts_, batch_positions_;
  float* host_stop_ = nullptr;
  float* host_scalars_ = nullptr;
  MemoryPlan plan_;
  std::unique_ptr<Arenas> arenas_;
  std::optional<Transformer> model_;
  // One of the two: the optimizer over device arenas, or (offload.optimizer CPU) the host
  // optimizer over the pinned host buffers, with the context its host threads run on.
  std::optional<Optimizer> optimizer_;
  std::optional<HostOptimizer> host_optimizer_;
  // offload.optimizer NVME: the step through the swap store, and the store when the rank
  // opened its own (destroyed after the optimizer, declared before it).
  std::shared_ptr<offload::SwapStore> own_swap_store_;
  std::unique_ptr<NvmeOptimizer> nvme_optimizer_;
  // A LoRA job's offload.params NVME: its frozen base's shards in the store.
  std::unique_ptr<SwappedBase> swapped_base_;
  DeviceContext host_ctx_;
  std::unique_ptr<Store> own_store_;  // a one-rank job's, when no store was given
  Store* store_ = nullptr;            // the job's rendezvous store (options' or own_store_)
  RankCommunicators comms_;
  // The host step's statistics sums' counters (worker/shard/host_step_sums.h).
  std::function<CommStats()> host_step_comm_stats_ = [] { return CommStats{}; };
  std::unique_ptr<ShardingEngine> engine_;
  // offload.optimizer CPU / NVME: the reduced gradients' copies to the host during the
  // backward (after the engine and communicators whose handles its thread waits on).
  std::unique_ptr<GradientDownloads> grad_downloads_;
  // offload.delayed_update: the host update's own thread (after what it reads: destroyed
  // first, waiting for a pending update).
  std::unique_ptr<DelayedHostStep> delayed_;
  // Last: destroyed first, so a background save stops before the arenas it reads go.
  std::optional<CheckpointWriter> checkpoint_writer_;
  std::optional<LossScaler> loss_scaler_;
  std::unique_ptr<MicroBatches> train_batches_, val_batches_;
  int64_t step_ = 0;  // optimizer steps done
  // The rank's data-parallel group (ParallelLayout): its members read different batches, the
  // ranks of a tensor-parallel group the same one.
  int data_size_ = 1, data_rank_ = 0;
  bool stopped_early_ = false;
  int pipeline_size_ = 1, pipeline_stage_ = 0;
  std::vector<float> pipeline_scalars_;                  // every stage's statistics (host)
  // The plan's kPipelineScalars and kPipelineBubble: where those statistics and the stages'
  // (busy, span) seconds are gathered, on the device.
  Tensor pipeline_scalars_gathered_, pipeline_bubble_;
  // Per chunk, the plan's "comm.pipeline.grad_send.<c>" ([in_flight, residual gradient]: the
  // copy each micro-batch slot sends back from); empty for the chunk holding the embedding.
  std::vector<Tensor> pipeline_grad_sends_;
  // Whether the last save begun was a final one (its outcome comes from Finish() when async).
  bool last_save_final_ = false;
  double resume_seconds_ = 0;
  std::string metrics_path_;
};

}  // namespace zt
