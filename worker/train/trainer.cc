// Trainer: construction from the job (Create), the rank's layout groups, the memory report and
// the run loop (Run). The rest of the class lives beside it: trainer_weights.cc (initial weights,
// bases and adapters), trainer_checkpoint.cc (save, resume, whole weights), trainer_step.cc (the
// step, evaluation, metrics) and trainer_pipeline.cc (the pipeline schedule).

#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/job/data_paths.h"
#include "worker/offload/node_swap_store.h"
#include "worker/optim/adafactor_splits.h"
#include "worker/plan/lora_plan.h"
#include "worker/shard/host_step_sums.h"
#include "worker/train/trainer_support.h"

namespace zt {
namespace {

// A model-side collective (tensor parallelism, the vocabulary-sharded embedding) runs to its
// end before the model goes on: the issued operation's handle, waited for.
absl::Status IssueAndWait(absl::StatusOr<CommHandle> h) {
  ZT_RETURN_IF_ERROR(h.status());
  return h->Wait();
}

using Clock = std::chrono::steady_clock;

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

// Per chunk of `m`'s stage, the plan's "comm.pipeline.grad_send.<c>" for a chunk that sends
// gradients back (it does not hold the embedding), checked against what it copies: one slot per
// micro-batch in flight, each the residual gradient's size and dtype. Empty for the chunk
// holding the embedding. A plan without it, or of another size, is an error: the sends would
// otherwise reach past the buffer or live outside the plan.
absl::StatusOr<std::vector<Tensor>> PipelineGradSendsFromPlan(Transformer& m,
                                                              const Arenas& arenas) {
  std::vector<Tensor> sends(m.chunks());
  for (int c = 0; c < m.chunks(); ++c) {
    ZT_RETURN_IF_ERROR(m.SelectMicroBatch(c, 0));
    if (m.chunk_is_first()) continue;
    const std::string name = PipelineGradSendBuffer(c);
    ZT_ASSIGN_OR_RETURN(sends[c], arenas.Get(name));
    const Tensor& g = m.residual_grad();
    if (sends[c].dtype() != g.dtype() || sends[c].ndim() != 2 ||
        sends[c].dim(0) != m.in_flight(c) || sends[c].dim(1) != g.numel()) {
      return absl::InternalError(absl::StrCat(
          "memory plan: \"", name, "\" is ", sends[c].DebugString(), ", the pipeline chunk sends ",
          m.in_flight(c), " micro-batches in flight of its residual gradient ", g.DebugString()));
    }
  }
  ZT_RETURN_IF_ERROR(m.SelectMicroBatch(0, 0));
  return sends;
}

}  // namespace

bool LossScalingEnabled(const zerotrain::PrecisionConfig& precision) {
  using P = zerotrain::PrecisionConfig;
  return precision.param_dtype() == P::FP16 || precision.compute_dtype() == P::FP16 ||
         precision.grad_dtype() == P::FP16;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const zerotrain::JobSpec& job,
                                                         const TrainOptions& options) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->job_ = job;
  t->options_ = options;
  const auto& model = job.model();
  const int B = job.train().micro_batch_size(), T = job.data().seq_len();

  // Data first: a bad path or a token beyond the vocabulary should fail before gigabytes
  // are allocated.
  ZT_ASSIGN_OR_RETURN(const std::vector<std::string> train_paths,
                      ExpandDataPaths(job.data().train(), "data.train"));
  ZT_ASSIGN_OR_RETURN(t->train_batches_, MicroBatches::Open(train_paths, "data.train", job.data(),
                                                            {.B = B,
                                                             .T = T,
                                                             .shuffle = job.data().shuffle(),
                                                             .seed = job.data().seed(),
                                                             .vocab_size = model.vocab_size()}));
  if (!job.data().val().empty()) {
    ZT_ASSIGN_OR_RETURN(const std::vector<std::string> val_paths,
                        ExpandDataPaths(job.data().val(), "data.val"));
    // Validation always reads sequentially from the start: comparable across runs.
    ZT_ASSIGN_OR_RETURN(t->val_batches_, MicroBatches::Open(val_paths, "data.val", job.data(),
                                                            {.B = B,
                                                             .T = T,
                                                             .shuffle = false,
                                                             .seed = job.data().seed(),
                                                             .vocab_size = model.vocab_size()}));
  }

  const int rank = options.rank;
  const int world = job.parallel().world_size();
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside parallel.world_size ", world));
  }
  if (options.store == nullptr && world > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job of ", world, " ranks needs a rendezvous store shared by its ranks"));
  }
  ZT_ASSIGN_OR_RETURN(t->device_, options.make_device
                                      ? options.make_device(job, rank)
                                      : RankDevice::Create(job, rank, options.cuda_device));
  const ParallelLayout layout = ParallelLayout::ForJob(job, rank);
  t->data_size_ = layout.data_size();
  t->data_rank_ = layout.coordinates().data;
  t->plan_ = PlanMemory(job, layout);
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<ArenaAllocator> allocator, t->device_->TakeAllocator());
  ZT_ASSIGN_OR_RETURN(t->arenas_, Arenas::Create(t->plan_, std::move(allocator)));
  ZT_ASSIGN_OR_RETURN(Tensor gemm_workspace, t->arenas_->Get("gemm_workspace"));
  t->device_->mutable_context().workspace = {.data = gemm_workspace.raw(),
                                             .bytes = gemm_workspace.size_bytes()};
  t->ctx_ = t->device_->context();
  // The step loop's host side, taken once: it allocates nothing per step.
  const int64_t tokens_per_micro = int64_t{B} * T;
  ZT_ASSIGN_OR_RETURN(void* tokens, t->device_->AllocateStaging(tokens_per_micro * 4));
  ZT_ASSIGN_OR_RETURN(void* targets, t->device_->AllocateStaging(tokens_per_micro * 4));
  if (t->train_batches_->packed()) {
    // A packed micro-batch's document starts and positions cross with its tokens into the
    // plan's buffers on the rank's device (UploadBatch), which the model reads from there.
    ZT_ASSIGN_OR_RETURN(t->batch_doc_starts_, t->arenas_->Get("batch.doc_starts"));
    ZT_ASSIGN_OR_RETURN(t->batch_positions_, t->arenas_->Get("batch.positions"));
    ZT_ASSIGN_OR_RETURN(void* starts, t->device_->AllocateStaging(tokens_per_micro * 4));
    ZT_ASSIGN_OR_RETURN(void* positions, t->device_->AllocateStaging(tokens_per_micro * 4));
    t->host_doc_starts_ = static_cast<int32_t*>(starts);
    t->host_positions_ = static_cast<int32_t*>(positions);
  }
  ZT_ASSIGN_OR_RETURN(void* stop, t->device_->AllocateStaging(4));
  ZT_ASSIGN_OR_RETURN(void* scalars, t->device_->AllocateStaging(
                                         int64_t{4} * ShardingEngine::kScalarSlots * world));
  t->host_tokens_ = static_cast<int32_t*>(tokens);
  t->host_targets_ = static_cast<int32_t*>(targets);
  t->host_stop_ = static_cast<float*>(stop);
  t->host_scalars_ = static_cast<float*>(scalars);
  // A pipeline rank binds its stage's units only (the plan's partition).
  ZT_ASSIGN_OR_RETURN(Transformer m,
                      layout.pipeline_size() > 1
                          ? Transformer::BindStage(job, layout, *t->arenas_, *t->arenas_, B, T,
                                                   TensorParallelOf(layout, t.get()))
                          : Transformer::Bind(model, *t->arenas_, *t->arenas_, B, T,
                                              TensorParallelOf(layout, t.get())));
  t->model_.emplace(std::move(m));
  if (layout.shard().embedding_row_numel > 0) {
    ZT_RETURN_IF_ERROR(t->model_->BindVocabShardGroup(
        VocabShardGroupOf(layout, t->model_->layout(), t.get()), *t->arenas_));
  }
  t->pipeline_size_ = layout.pipeline_size();
  t->pipeline_stage_ = layout.coordinates().pipeline;
  if (t->pipeline_size_ > 1) {
    // Every stage's statistics (the step's loss is the last stage's, the gradient norm sums
    // over stages), and the gradients in flight to the previous stage (one per micro-batch
    // slot: the model's gradient scratch is reused by the next backward while they go).
    t->pipeline_scalars_.resize(int64_t{ShardingEngine::kScalarSlots} * world);
    ZT_ASSIGN_OR_RETURN(t->pipeline_scalars_gathered_, t->arenas_->Get(kPipelineScalars));
    ZT_ASSIGN_OR_RETURN(t->pipeline_bubble_, t->arenas_->Get(kPipelineBubble));
    ZT_ASSIGN_OR_RETURN(t->pipeline_grad_sends_,
                        PipelineGradSendsFromPlan(*t->model_, *t->arenas_));
  }
  Store* store = options.store;
  if (store == nullptr) {
    t->own_store_ = std::make_unique<InProcessStore>();
    store = t->own_store_.get();
  }
  t->store_ = store;
  ZT_ASSIGN_OR_RETURN(t->comms_, ConnectRank(job, layout, store, *t->arenas_, t->device_->comm()));
  // offload.delayed_update: a summed Adafactor's statistics sums, which its host step issues on
  // the delayed thread, over contexts of their own (worker/shard/host_step_sums.h); in every
  // step, the serial ones too. So too for any host step of a rank whose device memory is not
  // the host's (a GPU's communicators take device buffers; the host step's scratch is host
  // memory). Empty otherwise.
  ZT_ASSIGN_OR_RETURN(const HostStepSums host_step_sums,
                      ConnectHostStepSums(job, layout, store,
                                          /*device_memory_apart=*/!t->device_->host_addressable()));
  t->host_step_comm_stats_ = host_step_sums.stats;
  ZT_ASSIGN_OR_RETURN(t->engine_, ShardingEngine::Create(job, layout, &*t->model_, *t->arenas_,
                                                         t->comms_.view(), &t->device_->copies()));
  // Where the plan keeps the parameter shards the optimizer updates (offload.params CPU: the
  // pinned host pool, which the host step then writes in place). A LoRA job's offloaded shards
  // are its frozen base: the adapters it steps stay on the device.
  const ParamHome param_home = t->model_->layout().lora       ? ParamHome::kDevice
                               : t->engine_->params_swapped() ? ParamHome::kSwapped
                               : t->engine_->params_on_host() ? ParamHome::kHost
                                                              : ParamHome::kDevice;
  std::optional<Optimizer::ShardGroup> shard_group;
  // The rank's communicators take the device's memory: a statistics scratch elsewhere (host
  // memory, for an offloaded host step on a GPU) is summed over the host step's own contexts.
  const auto check_sums = [&](const Tensor& scratch, bool host_sums, const char* group) {
    if (scratch.device() == t->ctx_.device || host_sums) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("Adafactor: its statistics scratch is on ",
                                            DeviceName(scratch.device()), ", not the ", group,
                                            " communicator's ", DeviceName(t->ctx_.device),
                                            ", and no host-step sums were "
                                            "connected for it"));
  };
  if (ShardedAdafactor(job, layout)) {
    ShardingEngine* engine = t->engine_.get();
    ZT_ASSIGN_OR_RETURN(Tensor scratch, t->arenas_->Get("optimizer.reduce_scratch"));
    shard_group = Optimizer::ShardGroup{
        .sum = [engine](float* data, int64_t n) { return engine->SumAcrossShardGroup(data, n); },
        .reduce_scratch = scratch};
    if (host_step_sums.shard_group) shard_group->sum = host_step_sums.shard_group;
    ZT_RETURN_IF_ERROR(check_sums(scratch, bool(host_step_sums.shard_group), "shard group's"));
  }
  if (TensorParallelAdafactor(job, layout)) {
    ZT_ASSIGN_OR_RETURN(Tensor scratch, t->arenas_->Get("optimizer.reduce_scratch"));
    if (!shard_group) shard_group = Optimizer::ShardGroup{.reduce_scratch = scratch};
    Trainer* trainer = t.get();  // the communicators connect later; the sums find them then
    // The statistics are the scratch's (and the kernel's workspace's, for Σ R_i): device
    // memory, summed on the rank's device communicator.
    const Device device = t->ctx_.device;
    shard_group->tensor_sum = [trainer, device](float* data, int64_t n) -> absl::Status {
      ZT_ASSIGN_OR_RETURN(CommHandle h, trainer->comms_.tensor->AllReduce(
                                            Tensor(data, DType::kF32, {n}, device), ReduceOp::kSum,
                                            "optimizer statistics all-reduce (tensor-parallel)"));
      return h.Wait();
    };
    if (host_step_sums.tensor) shard_group->tensor_sum = host_step_sums.tensor;
    ZT_RETURN_IF_ERROR(check_sums(scratch, bool(host_step_sums.tensor), "tensor group's"));
    // A LoRA job steps its adapters: their shares' splits (LoraAdafactorSplits).
    shard_group->splits =
        t->model_->layout().lora
            ? LoraAdafactorSplits(job.model(), t->model_->layout(), layout.tensor_size(),
                                  layout.coordinates().tensor, t->model_->held_units())
            : AdafactorSplits(job.model(), t->model_->layout(), layout.tensor_size(),
                              layout.coordinates().tensor, t->model_->held_units());
  }
  // The optimizer steps the trainable buffers (a LoRA job's adapters: f32, no master copy,
  // so nothing to round stochastically into: precision.stochastic_rounding is the base's
  // dtype's, which nothing steps).
  zerotrain::PrecisionConfig trained_precision = job.precision();
  if (t->model_->layout().lora) {
    trained_precision.set_master_weights(false);
    trained_precision.set_split_master_weights(false);
    trained_precision.set_stochastic_rounding(false);
  }
  const ModelLayout& trained = t->engine_->trainable_layout();
  // ZeRO-Offload's overlap: each unit's reduced gradient comes down as soon as its reduction
  // is issued, into the plan's "<unit>.grads.host", while the backward goes on.
  ZT_ASSIGN_OR_RETURN(t->grad_downloads_,
                      GradientDownloadsFromPlan(*t->arenas_, trained, t->engine_->grad_views(),
                                                &t->device_->copies()));
  const bool nvme = job.offload().optimizer() == zerotrain::OffloadConfig::NVME;
  ZT_ASSIGN_OR_RETURN(Optimizer opt,
                      nvme ? Optimizer::CreateUnbound(job.optimizer(), trained_precision, trained,
                                                      t->engine_->ranges(), shard_group)
                           : Optimizer::Create(job.optimizer(), trained_precision, trained,
                                               *t->arenas_, t->engine_->ranges(), shard_group));
  if (nvme) {
    offload::SwapStore* swap = options.swap_store;
    if (swap == nullptr) {
      ZT_ASSIGN_OR_RETURN(t->own_swap_store_, OpenSwapStore(job, {rank}));
      swap = t->own_swap_store_.get();
    }
    // The ring: the plan's buffers, one after the other in the pinned_host arena.
    const int64_t count = job.offload().buffer_count(), size = job.offload().buffer_size();
    ZT_ASSIGN_OR_RETURN(Tensor ring, t->arenas_->Get("offload.ring.0"));
    for (int64_t k = 1; k < count; ++k) {
      ZT_ASSIGN_OR_RETURN(Tensor next, t->arenas_->Get(absl::StrCat("offload.ring.", k)));
      if (static_cast<char*>(next.raw()) != static_cast<char*>(ring.raw()) + k * size) {
        return absl::InternalError("memory plan: the offload ring's buffers are not contiguous");
      }
    }
    std::vector<std::string> unit_names;
    std::vector<int64_t> master_numel, param_numel;
    DType param_dtype = DType::kF32;
    for (const UnitLayout& u : trained.units) {
      unit_names.push_back(u.name);
      if (param_home == ParamHome::kSwapped) {
        ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, t->arenas_->Spec(u.name + ".params"));
        param_numel.push_back(spec->numel());
        param_dtype = spec->dtype;
      }
      if (!trained_precision.master_weights()) continue;  // a LoRA job's adapters: none
      ZT_ASSIGN_OR_RETURN(const BufferSpec* spec,
                          t->arenas_->Spec(t->MasterName(static_cast<int>(unit_names.size()) - 1)));
      master_numel.push_back(spec->numel());
    }
    const std::string owner = options.checkpoint_owner.empty() ? LocalRunOwner(job.name()).job_id
                                                               : options.checkpoint_owner;
    ZT_ASSIGN_OR_RETURN(
        t->nvme_optimizer_,
        NvmeOptimizer::Create({.optimizer = std::move(opt),
                               .unit_names = std::move(unit_names),
                               .master_numel = std::move(master_numel),
                               .copies = &t->device_->copies(),
                               .store = swap,
                               .store_job = absl::StrCat(owner, "/rank-", rank),
                               .home_file = static_cast<uint32_t>(rank) % swap->file_count(),
                               .ring = static_cast<std::byte*>(ring.raw()),
                               .buffer_count = count,
                               .buffer_size = size,
                               .params = param_home,
                               .param_numel = std::move(param_numel),
                               .param_dtype = param_dtype,
                               .gradients = t->grad_downloads_.get()}));
    NvmeOptimizer* nvme_opt = t->nvme_optimizer_.get();
    if (param_home == ParamHome::kSwapped) {
      // The gathers read the committed shards from the store, through the optimizer's ring,
      // ahead of use. The optimizer's units are the model's here (no LoRA with offload).
      const std::vector<UnitLayout>& model_units = t->model_->layout().units;
      if (model_units.size() != trained.units.size()) {
        return absl::InternalError("offload.params NVME: the trained units are not the model's");
      }
      for (size_t u = 0; u < model_units.size(); ++u) {
        if (model_units[u].name != trained.units[u].name) {
          return absl::InternalError(absl::StrCat("offload.params NVME: trained unit ", u, " is ",
                                                  trained.units[u].name, ", not the model's ",
                                                  model_units[u].name));
        }
      }
      t->engine_->SetSwappedParams(
          {.read_ahead = [nvme_opt](int u) { nvme_opt->ReadShardAhead(u); },
           .with_shard =
               [nvme_opt](int u, const std::function<absl::Status(const void*)>& use) {
                 return nvme_opt->WithShard(u, use);
               },
           .drop_read_ahead = [nvme_opt] { nvme_opt->DropShardReads(); }});
    }
    // The swapped states are the plan's, byte for byte (a checkpoint copies the plan's
    // bytes out of what the store holds): claimed here, each checked against the optimizer's.
    std::map<std::string, int64_t> swapped = t->nvme_optimizer_->SwappedBuffers();
    for (const BufferSpec& b : t->plan_.buffers) {
      if (b.category != MemoryCategory::kNvme) continue;
      // A LoRA job's frozen base is the swapped base's (CreateSwappedBase checks it).
      if (t->model_->layout().lora && IsFrozenBaseShard(b.name)) continue;
      ZT_RETURN_IF_ERROR(t->arenas_->Spec(b.name).status());
      auto it = swapped.find(b.name);
      if (b.bytes() > 0 && (it == swapped.end() || it->second != b.bytes())) {
        return absl::InternalError(absl::StrCat(
            "memory plan: swapped buffer ", b.name, " of ", b.bytes(),
            " bytes is not what the NVMe optimizer swaps (",
            it == swapped.end() ? "nothing" : absl::StrCat(it->second, " bytes"), ")"));
      }
      if (it != swapped.end()) swapped.erase(it);
    }
    if (!swapped.empty()) {
      return absl::InternalError(absl::StrCat("memory plan: the NVMe optimizer swaps ",
                                              swapped.begin()->first,
                                              ", which the plan does not hold"));
    }
    t->host_ctx_ = HostStepContext(t->ctx_, job);
  } else if (param_home == ParamHome::kSwapped) {
    // CheckEngineSupport refuses this job; an engine reached another way says why too.
    return absl::UnimplementedError(
        "offload.params: NVME trains with offload.optimizer NVME only (the shards are swapped "
        "with the states)");
  } else if (job.offload().optimizer() == zerotrain::OffloadConfig::CPU) {
    // The plan's ring (memory_plan.cc): parameters go up through its first buffer unless they
    // live on the host; gradients come down through the next unless they came down during the
    // backward (grad_downloads_).
    Tensor grad_staging, param_staging;
    int ring = 0;
    if (param_home == ParamHome::kDevice) {
      ZT_ASSIGN_OR_RETURN(param_staging, t->arenas_->Get(absl::StrCat("offload.ring.", ring++)));
    }
    if (!t->grad_downloads_) {
      ZT_ASSIGN_OR_RETURN(grad_staging, t->arenas_->Get(absl::StrCat("offload.ring.", ring++)));
    }
    ZT_ASSIGN_OR_RETURN(HostOptimizer host,
                        HostOptimizer::Create({.optimizer = std::move(opt),
                                               .copies = &t->device_->copies(),
                                               .grad_staging = grad_staging,
                                               .param_staging = param_staging,
                                               .params = param_home,
                                               .gradients = t->grad_downloads_.get()}));
    t->host_optimizer_.emplace(std::move(host));
    t->host_ctx_ = HostStepContext(t->ctx_, job);
  } else {
    if (param_home == ParamHome::kHost) {
      // CheckEngineSupport refuses this job; an engine reached another way says why too.
      return absl::UnimplementedError(
          "offload.params: CPU trains with offload.optimizer CPU or NVME only (the step updates "
          "the host shards in place)");
    }
    t->optimizer_.emplace(std::move(opt));
  }
  if (t->model_->layout().lora && t->engine_->params_swapped()) {
    // offload.params NVME: the swapped shards are the frozen base, written once and read by
    // the gathers alone; the optimizer steps the adapters wherever offload.optimizer says.
    ZT_RETURN_IF_ERROR(t->CreateSwappedBase());
  }
  if (GradientDownloads* downloads = t->grad_downloads_.get()) {
    t->engine_->SetGradientReduced([downloads](int u, std::vector<CommHandle> after) {
      downloads->Enqueue(u, std::move(after));
    });
  }
  if (job.offload().delayed_update().enabled()) {
    // CheckEngineSupport refuses the rest; an engine reached another way says why too.
    if ((!t->host_optimizer_ && !t->nvme_optimizer_) || !t->grad_downloads_) {
      return absl::UnimplementedError(
          "offload.delayed_update trains with offload.optimizer CPU or NVME at ZeRO 1-3 only "
          "(its host step reads the gradients copied down during the backward)");
    }
    if (LossScalingEnabled(job.precision())) {
      return absl::UnimplementedError(
          "offload.delayed_update trains without fp16 loss scaling (CheckEngineSupport says "
          "why)");
    }
    // Tensor and pipeline parallelism need nothing more: every collective of a step (the
    // gradient norm's sums over the TP group and the stages, ReadStatistics; the tied
    // embedding's sum between the first and last stage and the replicated KV heads' sums,
    // in the reductions) is issued on the compute thread before DelayedHostUpdate hands the
    // step over, and the parameters' all-gather after Finish, on the compute thread too. The
    // host step issues only a summed Adafactor's statistics sums, over host_step_sums. LoRA:
    // the trained units are the adapters, each with both banks and its params.host in the
    // plan (LoraStateBuffers).
    // The host step's parameters: a host bank uploaded at the switch, unless they are swapped
    // (offload.params NVME), where the host step writes them into a generation of the store
    // that the switch commits (the gathers read the committed one until then).
    std::vector<Tensor> params_host;
    std::function<absl::Status()> on_switch;
    if (param_home == ParamHome::kSwapped) {
      NvmeOptimizer* nvme_opt = t->nvme_optimizer_.get();
      on_switch = [nvme_opt] { return nvme_opt->CommitHostStep(); };
    } else {
      for (const UnitLayout& u : trained.units) {
        ZT_ASSIGN_OR_RETURN(Tensor p, t->arenas_->Get(u.name + ".params.host"));
        params_host.push_back(p);
      }
    }
    DelayedHostStep::Args delayed{.gradients = t->grad_downloads_.get()};
    if (t->host_optimizer_) {
      delayed.host = &*t->host_optimizer_;
    } else {
      // ZeRO-Infinity's optimizer: the delayed thread streams each unit's states through the
      // swap store and commits the step's generation (NvmeOptimizer::StepOnHost).
      NvmeOptimizer* nvme_opt = t->nvme_optimizer_.get();
      delayed.optimizer = &nvme_opt->optimizer();
      delayed.step_on_host = [nvme_opt](const DeviceContext& ctx, const std::vector<Tensor>& params,
                                        const std::vector<Tensor>& grads, float lr,
                                        float grad_scale, uint64_t seed) {
        return nvme_opt->StepOnHost(ctx, params, grads, lr, grad_scale, seed);
      };
    }
    ZT_ASSIGN_OR_RETURN(t->delayed_,
                        DelayedHostStep::Create({.host = delayed.host,
                                                 .optimizer = delayed.optimizer,
                                                 .step_on_host = std::move(delayed.step_on_host),
                                                 .gradients = t->grad_downloads_.get(),
                                                 .copies = &t->device_->copies(),
                                                 .params_host = std::move(params_host),
                                                 .on_switch = std::move(on_switch),
                                                 .host_ctx = t->host_ctx_,
                                                 .on_start = options.on_host_step_start,
                                                 .on_end = options.on_host_step_end}));
  }
  if (t->nvme_optimizer_ || t->grad_downloads_ || options.on_backward_ended) {
    NvmeOptimizer* nvme_opt = t->nvme_optimizer_.get();
    GradientDownloads* downloads = t->grad_downloads_.get();
    Trainer* self = t.get();
    // The first unit's states are read while the step's reductions finish.
    t->engine_->SetBackwardEnded([nvme_opt, downloads, self] {
      // Not while a delayed host step streams the states on its thread: the ring and the
      // store's generation are its own until it is finished.
      if (nvme_opt != nullptr && (self->delayed_ == nullptr || !self->delayed_->pending())) {
        nvme_opt->ReadFirstUnitAhead();
      }
      if (downloads != nullptr) downloads->BackwardEnded();
      if (self->options_.on_backward_ended) self->options_.on_backward_ended(self->step_ + 1);
    });
  }
  ZT_RETURN_IF_ERROR(t->InitializeWeights());
  if (LossScalingEnabled(job.precision())) {
    const auto& ls = job.precision().loss_scale();
    t->loss_scaler_.emplace(
        LossScalerConfig{.initial_power = ls.initial_power(),
                         .window = ls.window(),
                         .hysteresis = ls.hysteresis(),
                         .min_scale = ls.min_scale(),
                         .static_scale = ls.has_static_scale() ? ls.static_scale() : 0.0,
                         .max_overflows_at_min_scale = ls.max_overflows_at_min_scale(),
                         .consecutive_hysteresis = ls.consecutive_hysteresis()});
  }

  const CheckpointOwner owner =
      options.checkpoint_owner.empty()
          ? LocalRunOwner(job.name())
          : CheckpointOwner{.job_id = options.checkpoint_owner, .job_name = job.name()};
  // Another job's checkpoints are never resumed, interleaved with or pruned unless asked for:
  // checked before the resume and any step; the directory is claimed before the first save.
  ZT_RETURN_IF_ERROR(CheckCheckpointOwnership(job.checkpoint().dir(), owner.job_id,
                                              options.take_over_checkpoints));
  if (!options.resume_dir.empty()) {
    const auto resume_start = Clock::now();
    ZT_RETURN_IF_ERROR(t->Resume());
    t->resume_seconds_ = std::chrono::duration<double>(Clock::now() - resume_start).count();
  }
  if (!job.checkpoint().dir().empty()) {
    CheckpointWriter::Download download;
    if (!t->device_->host_addressable()) {
      RankDevice* device = t->device_.get();
      download = [device](void* host, const Tensor& src) { return device->Download(host, src); };
    }
    BufferSource swapped;
    if (t->nvme_optimizer_ || t->swapped_base_) {
      Trainer* self = t.get();
      swapped = [self](const BufferSpec& b) { return self->BufferBytes(b); };
    }
    t->checkpoint_writer_.emplace(job, rank, store, t->plan_, *t->arenas_,
                                  /*replace_existing=*/!options.resume_dir.empty(), owner,
                                  options.take_over_checkpoints, std::move(download),
                                  std::move(swapped));
  }
  // A run that is not continuing the checkpoints in checkpoint.dir must not interleave its
  // saves with them (its `latest` would hide theirs, and pruning would delete them).
  if (const std::string& dir = job.checkpoint().dir();
      !dir.empty() && std::filesystem::path(dir) != std::filesystem::path(options.resume_dir)) {
    absl::StatusOr<std::vector<CheckpointEntry>> existing = ListComplete(dir);
    if (existing.ok() && !existing->empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint.dir: '", dir, "' already holds checkpoints (the newest of step ",
          existing->back().step, "); continue them with --resume, or choose another directory"));
    }
  }

  if (!options.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options.run_dir, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("run directory '", options.run_dir, "': ", ec.message()));
    }
    if (rank == 0) {
      t->metrics_path_ = (std::filesystem::path(options.run_dir) / "metrics.jsonl").string();
      // A new run starts a new file; a resumed one goes on with its own.
      std::FILE* f = std::fopen(t->metrics_path_.c_str(), options.resume_dir.empty() ? "w" : "a");
      if (f == nullptr) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot write '", t->metrics_path_, "': ", std::strerror(errno)));
      }
      std::fclose(f);
    }
    const std::string report =
        rank == 0 ? "memory.json" : absl::StrCat("memory.rank", rank, ".json");
    ZT_RETURN_IF_ERROR(
        t->WriteMemoryReport((std::filesystem::path(options.run_dir) / report).string()));
  }
  return t;
}

TensorParallelGroup Trainer::TensorParallelOf(const ParallelLayout& layout, Trainer* t) {
  TensorParallelGroup tp{.size = layout.tensor_size(), .rank = layout.coordinates().tensor};
  if (tp.size <= 1) return tp;
  // The communicators connect after the model binds: the collectives find them at their call.
  constexpr auto wait = IssueAndWait;
  tp.all_reduce = [t, wait](const Tensor& data, const std::string& label) {
    return wait(t->comms_.tensor->AllReduce(data, ReduceOp::kSum, label));
  };
  tp.all_gather = [t, wait](const Tensor& in, const Tensor& out, const std::string& label) {
    return wait(t->comms_.tensor->AllGather(in, out, label));
  };
  tp.kv_all_reduce = [t, wait](const Tensor& data, const std::string& label) {
    return wait(t->comms_.tensor_kv->AllReduce(data, ReduceOp::kSum, label));
  };
  tp.sequence_parallel = t->job_.parallel().sequence_parallel();
  tp.reduce_scatter = [t, wait](const Tensor& in, const Tensor& out, const std::string& label) {
    return wait(t->comms_.tensor->ReduceScatter(in, out, ReduceOp::kSum, label));
  };
  return tp;
}

VocabShardGroup Trainer::VocabShardGroupOf(const ParallelLayout& layout, const ModelLayout& model,
                                           Trainer* t) {
  const ShardGeometry& g = layout.shard();
  const UnitShard shard = ShardOfUnit(model.embedding(), g);
  VocabShardGroup group{.size = g.group_size,
                        .rank = g.group_rank(),
                        .row_begin = shard.owned.begin / g.embedding_row_numel,
                        .row_end = shard.owned.end / g.embedding_row_numel,
                        .rows_per_rank = shard.shard_numel / g.embedding_row_numel};
  // The communicators connect after the model binds: the collectives find them at their call.
  auto comm = [t] { return t->comms_.view().shard_group; };
  constexpr auto wait = IssueAndWait;
  group.all_gather = [comm, wait](const Tensor& in, const Tensor& out, const std::string& label) {
    return wait(comm()->AllGather(in, out, label));
  };
  group.reduce_scatter = [comm, wait](const Tensor& in, const Tensor& out,
                                      const std::string& label) {
    return wait(comm()->ReduceScatter(in, out, ReduceOp::kSum, label));
  };
  group.all_reduce = [comm, wait](const Tensor& data, const std::string& label) {
    return wait(comm()->AllReduce(data, ReduceOp::kSum, label));
  };
  return group;
}

absl::Status Trainer::WriteMemoryReport(const std::string& path) const {
  nlohmann::json planned, in_use;
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    planned[MemoryCategoryName(category)] = plan_.CategoryBytes(category);
    in_use[MemoryCategoryName(category)] = arenas_->BytesInUse(category);
  }
  planned["total"] = plan_.TotalBytes();
  in_use["total"] = arenas_->TotalBytesInUse();
  const std::string text =
      nlohmann::json{{"plan", planned}, {"arenas_high_water", in_use}}.dump(2) + "\n";
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write '", path, "': ", std::strerror(errno)));
  }
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::UnavailableError(absl::StrCat("write to '", path, "' failed"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Run(const std::function<void(const StepRecord&)>& on_step) {
  const auto& train = job_.train();
  const int64_t last = options_.stop_after_step
                           ? std::min<int64_t>(*options_.stop_after_step, train.max_steps())
                           : train.max_steps();
  const auto start = Clock::now();
  const int64_t first = step_;
  // An asynchronous save still writing when the loop ends (or fails) is waited for.
  absl::Cleanup finish_save = [&] {
    if (checkpoint_writer_) checkpoint_writer_->Finish().IgnoreError();
  };
  while (step_ < last) {
    ZT_ASSIGN_OR_RETURN(StepRecord r, Step());
    const bool eval_due = val_batches_ && train.eval_interval() > 0 &&
                          (r.step % train.eval_interval() == 0 || r.step == train.max_steps());
    if (eval_due) {
      // The evaluation's gathers upload (and with offload.params NVME read) every shard once
      // more: that traffic is reported in the line of the step it follows, beside the step's.
      ZT_ASSIGN_OR_RETURN(double v, Evaluate());
      ReportEvaluationTraffic(r);
      r.val_loss = v;
    }
    ZT_RETURN_IF_ERROR(AppendMetrics(r));
    const auto& ckpt = job_.checkpoint();
    const bool final_save = r.step == train.max_steps() || r.stop == StopKind::kCheckpointThenStop;
    const bool save_due = r.step % ckpt.interval_steps() == 0 || final_save;
    if (!ckpt.dir().empty() && save_due) {
      const auto save_start = Clock::now();
      ZT_RETURN_IF_ERROR(SaveCheckpoint(final_save));
      r.checkpoint_s = std::chrono::duration<double>(Clock::now() - save_start).count();
      for (const BufferSpec* b : CheckpointedBuffers(plan_, !ckpt.save_optimizer())) {
        r.checkpoint_bytes += b->bytes();
      }
    }
    if (options_.progress && options_.rank == 0 &&
        (r.step % train.log_interval() == 0 || r.step == last)) {
      const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      const double eta =
          elapsed / static_cast<double>(r.step - first) * static_cast<double>(last - r.step);
      std::string val = r.val_loss ? absl::StrFormat(" | val %.4f", *r.val_loss) : "";
      std::fprintf(stderr, "step %lld/%lld | loss %.4f%s | lr %.2e | %.0f tok/s | ETA %s\n",
                   static_cast<long long>(r.step), static_cast<long long>(train.max_steps()),
                   r.loss, val.c_str(), r.lr, r.tokens_per_s, FormatDuration(eta).c_str());
    }
    if (on_step) on_step(r);
    if (r.stop != StopKind::kNone && step_ < last) {
      stopped_early_ = true;
      break;
    }
  }
  std::move(finish_save).Cancel();
  // The loop's last step committed its NVMe generation before returning (StateReadAfterStep);
  // settled here as well, so Run never returns with a commit in flight whatever ended the loop.
  if (nvme_optimizer_) ZT_RETURN_IF_ERROR(nvme_optimizer_->SettleCommit());
  return checkpoint_writer_ ? SaveOutcome(checkpoint_writer_->Finish(), last_save_final_)
                            : absl::OkStatus();
}

}  // namespace zt
