#include "worker/trainer.h"

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
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/checkpoint_export.h"
#include "worker/checkpoint_writer.h"
#include "worker/job/data_paths.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/offload/node_swap_store.h"
#include "worker/optim/adafactor_splits.h"
#include "worker/optim/lr_schedule.h"
#include "worker/pipeline_full_weights.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/pipeline_schedule.h"
#include "worker/rank_state.h"
#include "worker/shard/host_step_sums.h"

namespace zt {
namespace {

// The context of the host optimizer step (offload.optimizer CPU or NVME). A CPU rank whose
// arenas are the host's memory steps with its own threads and scratch; any other rank — a GPU,
// or a CPU "device" with memory of its own — steps its host buffers with the job's CPU share,
// since its own context's ops refuse tensors that are not on its device.
DeviceContext HostStepContext(const DeviceContext& ctx, const zerotrain::JobSpec& job) {
  return ctx.device == Device{} ? ctx : CpuContext(job.resources().cpu_threads());
}

// A model-side collective (tensor parallelism, the vocabulary-sharded embedding) runs to its
// end before the model goes on: the issued operation's handle, waited for.
absl::Status IssueAndWait(absl::StatusOr<CommHandle> h) {
  ZT_RETURN_IF_ERROR(h.status());
  return h->Wait();
}

// A LoRA job's frozen base shard at ZeRO stage 3: what offload.params moves for it.
bool IsFrozenBaseShard(const std::string& name) {
  return name.ends_with(".params") || name.ends_with(".qbase");
}

// The rank's unit `mine` (its stage's unit held_unit of the whole model) from the whole model's
// units `read` (`whole`'s layout): its tensor-parallel share of every unquantized tensor (the
// whole tensor at t = 1), a head stage's copy of the tied wte from the embedding's. Quantized
// weights are not in the flat buffer and stay out.
std::vector<float> RankUnitFromWhole(const zerotrain::ModelConfig& model, const UnitLayout& mine,
                                     int held_unit, const ModelLayout& whole,
                                     const std::vector<std::vector<float>>& read,
                                     const TensorParallelGroup& tp) {
  std::vector<float> share(static_cast<size_t>(mine.numel), 0.0f);
  for (const ParamSpec& p : mine.params) {
    if (p.quantized) continue;
    int from = held_unit;
    const ParamSpec* w = whole.units[from].Find(p.name);
    if (w == nullptr) {
      from = 0;
      w = whole.units[0].Find("wte");
    }
    ExtractSlice(SliceOf(model, w->name, w->shape, tp.size, tp.rank), read[from].data() + w->offset,
                 share.data() + p.offset);
  }
  return share;
}

using Clock = std::chrono::steady_clock;

// What a validation micro-batch's mean loss is divided by so that the sum over the `ranks`
// data-parallel ranks' micro-batches, divided by `ranks`, is the mean over all `total` counted
// targets: its mean weighs by counted · ranks / total. A micro-batch with nothing counted has
// a loss of 0 and adds nothing.
double EvaluationLossDivisor(int64_t total, int64_t counted, int64_t ranks) {
  return counted == 0 ? 1.0 : static_cast<double>(total) / static_cast<double>(counted * ranks);
}

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
  if (t->train_batches_->packed() && t->ctx_.device.kind != DeviceKind::kCpu) {
    // The document starts and positions live in host memory the model reads directly.
    return absl::UnimplementedError(
        "data.packing: packed documents train on the CPU backend only for now");
  }
  // The step loop's host side, taken once: it allocates nothing per step.
  const int64_t tokens_per_micro = int64_t{B} * T;
  ZT_ASSIGN_OR_RETURN(void* tokens, t->device_->AllocateStaging(tokens_per_micro * 4));
  ZT_ASSIGN_OR_RETURN(void* targets, t->device_->AllocateStaging(tokens_per_micro * 4));
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
    ZT_ASSIGN_OR_RETURN(t->pipeline_grad_sends_, PipelineGradSendsFromPlan(*t->model_, *t->arenas_));
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
  ZT_ASSIGN_OR_RETURN(
      t->engine_, ShardingEngine::Create(job, layout, &*t->model_, *t->arenas_, t->comms_.view(),
                                         &t->device_->copies()));
  // Where the plan keeps the parameter shards the optimizer updates (offload.params CPU: the
  // pinned host pool, which the host step then writes in place). A LoRA job's offloaded shards
  // are its frozen base: the adapters it steps stay on the device.
  const ParamHome param_home = t->model_->layout().lora        ? ParamHome::kDevice
                               : t->engine_->params_swapped()   ? ParamHome::kSwapped
                               : t->engine_->params_on_host()   ? ParamHome::kHost
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
    shard_group->tensor_sum = [trainer](float* data, int64_t n) -> absl::Status {
      ZT_ASSIGN_OR_RETURN(CommHandle h, trainer->comms_.tensor->AllReduce(
                                            Tensor(data, DType::kF32, {n}), ReduceOp::kSum,
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
      delayed.step_on_host = [nvme_opt](const DeviceContext& ctx,
                                        const std::vector<Tensor>& params,
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

absl::Status Trainer::InitializeWeights() {
  const zerotrain::ModelConfig& model = job_.model();
  const ModelLayout& layout = model_->layout();
  // A quantized (NF4 or INT8) base streams in (StreamQuantizedBase). Other imports read the
  // whole model's units (set-up memory outside the plan); a tensor-parallel rank then keeps its
  // share of each.
  const bool stream_quantized =
      layout.base_quantization != BaseQuantization::kNone && !model.init_from().empty();
  if (stream_quantized && IsCheckpoint(model.init_from())) {
    const std::string base = zerotrain::ModelConfig::BaseDType_Name(model.base_dtype());
    return absl::FailedPreconditionError(
        absl::StrCat("model.init_from: ", model.init_from(),
                     " is a ZeroTrain checkpoint; a quantized base "
                     "(model.base_dtype: ",
                     base,
                     ") streams in from a Hugging Face safetensors file or "
                     "directory only (export the checkpoint with zt export first)"));
  }
  std::vector<std::vector<float>> imported;
  if (!model.init_from().empty() && !stream_quantized) {
    const ModelLayout whole = BuildModelLayout(model);
    // A pipeline stage reads only the units it holds (and the embedding, whose wte a head
    // stage's tied copy starts as); every other rank the whole model.
    const std::vector<int>& held = model_->held_units();
    std::vector<bool> wanted(whole.units.size(), false);
    for (int w : held) wanted[w] = true;
    if (layout.units.back().Find("lm_head.weight") != nullptr &&
        whole.units.back().Find("lm_head.weight") == nullptr) {
      wanted[0] = true;
    }
    std::vector<std::vector<float>> read(whole.units.size());
    std::vector<float*> units;
    for (size_t u = 0; u < whole.units.size(); ++u) {
      if (wanted[u]) read[u].resize(whole.units[u].numel);
      units.push_back(wanted[u] ? read[u].data() : nullptr);
    }
    // A ZeroTrain checkpoint (another job's, started from explicitly) or a Hugging Face
    // model directory.
    ZT_RETURN_IF_ERROR(IsCheckpoint(model.init_from())
                           ? ReadCheckpointWeights(model.init_from(), model, units)
                           : ImportHuggingFace(model.init_from(), model, whole, units));
    // Each of the rank's units from the whole one: its tensor-parallel share of every tensor
    // (the whole tensor at t = 1), a head stage's copy of the tied wte from the embedding's.
    for (size_t local = 0; local < layout.units.size(); ++local) {
      imported.push_back(RankUnitFromWhole(model, layout.units[local], held[local], whole, read,
                                           model_->tensor_parallel()));
    }
  }
  // The fp32 values pass through a bounded buffer, a chunk at a time, so set-up never holds
  // a whole unit beside the arenas (the memory plan is the peak).
  // Generated (or imported) on the host, then uploaded into a device chunk the casts read.
  constexpr int64_t kChunk = int64_t{1} << 18;
  std::vector<float> values(kChunk);
  ZT_ASSIGN_OR_RETURN(ScratchTensor chunk, device_->AllocateScratchF32(kChunk));
  if (stream_quantized) {
    ZT_RETURN_IF_ERROR(StreamQuantizedBase(values, chunk.tensor));
    ZT_RETURN_IF_ERROR(InitializeAdapters());
    return InitializeSwappedAdapterStates();
  }
  if (swapped_base_) {
    // The frozen base's shards go through the base ring's staging buffer into the store, one
    // at a time: the seeded (or imported) parameters and the seeded quantized bytes.
    ZT_RETURN_IF_ERROR(swapped_base_->Initialize(
        [&](int u, SwappedBase::Part part, std::byte* data) -> absl::Status {
          if (part == SwappedBase::Part::kQuantized) {
            ZT_ASSIGN_OR_RETURN(const BufferSpec* spec,
                                arenas_->Spec(QuantizedShardName(layout.units[u])));
            return model_->InitializeQuantizedShard(ctx_, job_.train().seed(), u,
                                                    Tensor(data, spec->dtype, {spec->numel()}));
          }
          const Tensor shard = model_->unit_params()[u];
          return InitializeUnit(u, Tensor(), imported, values, chunk.tensor,
                                Tensor(data, shard.dtype(), {shard.numel()}));
        }));
    ZT_RETURN_IF_ERROR(InitializeAdapters());
    return InitializeSwappedAdapterStates();
  }
  if (nvme_optimizer_ && !layout.lora) {
    // The master weights go straight into the unit's ring buffer, and on to the store.
    return nvme_optimizer_->Initialize([&](int u, const Tensor& master, const Tensor& params) {
      return InitializeUnit(u, master, imported, values, chunk.tensor, params);
    });
  }
  const std::vector<Tensor>& master = optimizer().master_weights();
  for (size_t u = 0; u < layout.units.size(); ++u) {
    ZT_RETURN_IF_ERROR(InitializeUnit(static_cast<int>(u), master.empty() ? Tensor() : master[u],
                                      imported, values, chunk.tensor));
  }
  if (layout.lora) {
    ZT_RETURN_IF_ERROR(InitializeAdapters());
    return InitializeSwappedAdapterStates();
  }
  return absl::OkStatus();
}

absl::Status Trainer::CreateSwappedBase() {
  offload::SwapStore* swap = options_.swap_store;
  if (swap == nullptr) {
    if (!own_swap_store_) {
      ZT_ASSIGN_OR_RETURN(own_swap_store_, OpenSwapStore(job_, {options_.rank}));
    }
    swap = own_swap_store_.get();
  }
  // The base's ring: the plan's buffers, one after the other in the pinned_host arena.
  const int64_t count = job_.offload().buffer_count(), size = job_.offload().buffer_size();
  ZT_ASSIGN_OR_RETURN(Tensor ring, arenas_->Get("offload.base_ring.0"));
  for (int64_t k = 1; k < count; ++k) {
    ZT_ASSIGN_OR_RETURN(Tensor next, arenas_->Get(absl::StrCat("offload.base_ring.", k)));
    if (static_cast<char*>(next.raw()) != static_cast<char*>(ring.raw()) + k * size) {
      return absl::InternalError("memory plan: the base ring's buffers are not contiguous");
    }
  }
  const ModelLayout& layout = model_->layout();
  std::vector<SwappedBase::Unit> units;
  for (const UnitLayout& unit : layout.units) {
    SwappedBase::Unit& out = units.emplace_back();
    out.name = unit.name;
    const auto part = [&](SwappedBase::Part p, const std::string& name, int64_t numel) {
      absl::StatusOr<const BufferSpec*> spec = arenas_->Spec(name);
      if (!spec.ok() || (*spec)->category != MemoryCategory::kNvme) return;
      // The key's range: the rank's shard of the unit's flat buffer (f32 words of the
      // quantized bytes).
      const UnitShard shard = ShardOf(numel, engine_->geometry());
      out.bytes[static_cast<int>(p)] = (*spec)->bytes();
      out.range[static_cast<int>(p)] = {shard.offset, shard.offset + shard.shard_numel};
    };
    part(SwappedBase::Part::kParams, unit.name + ".params", unit.numel);
    part(SwappedBase::Part::kQuantized, QuantizedShardName(unit),
         QuantizedBytesOf(layout, unit).words());
  }
  const std::string owner = options_.checkpoint_owner.empty() ? LocalRunOwner(job_.name()).job_id
                                                              : options_.checkpoint_owner;
  ZT_ASSIGN_OR_RETURN(
      swapped_base_,
      SwappedBase::Create({.units = std::move(units),
                           .store = swap,
                           .store_job = absl::StrCat(owner, "/rank-", options_.rank, "/base"),
                           .home_file = static_cast<uint32_t>(options_.rank) % swap->file_count(),
                           .ring = static_cast<std::byte*>(ring.raw()),
                           .buffer_count = count,
                           .buffer_size = size}));
  // The plan's swapped base shards are the swapped base's, byte for byte.
  std::map<std::string, int64_t> held = swapped_base_->SwappedBuffers();
  for (const BufferSpec& b : plan_.buffers) {
    if (b.category != MemoryCategory::kNvme || !IsFrozenBaseShard(b.name) || b.bytes() == 0) {
      continue;
    }
    auto it = held.find(b.name);
    if (it == held.end() || it->second != b.bytes()) {
      return absl::InternalError(absl::StrCat("memory plan: swapped buffer ", b.name, " of ",
                                              b.bytes(), " bytes is not what the base swaps"));
    }
    held.erase(it);
  }
  if (!held.empty()) {
    return absl::InternalError(absl::StrCat("memory plan: the base swaps ", held.begin()->first,
                                            ", which the plan does not hold"));
  }
  SwappedBase* base = swapped_base_.get();
  engine_->SetSwappedParams(
      {.read_ahead = [base](int u) { base->ReadAhead(u); },
       .with_shard =
           [base](int u, const std::function<absl::Status(const void*)>& use) {
             return base->WithShard(u, SwappedBase::Part::kParams, use);
           },
       .drop_read_ahead = [base] { base->DropReads(); },
       .with_quantized =
           [base](int u, const std::function<absl::Status(const void*)>& use) {
             return base->WithShard(u, SwappedBase::Part::kQuantized, use);
           }});
  return absl::OkStatus();
}

absl::Status Trainer::InitializeSwappedAdapterStates() {
  if (!nvme_optimizer_) return absl::OkStatus();
  // The adapters are their own master (f32) and stay on the rank: the store's first
  // generation is their zeroed states alone.
  return nvme_optimizer_->Initialize(
      [](int, const Tensor&, const Tensor&) { return absl::OkStatus(); });
}

absl::Status Trainer::InitializeUnit(int u, const Tensor& master,
                                     const std::vector<std::vector<float>>& imported,
                                     std::vector<float>& values, const Tensor& chunk,
                                     const Tensor& swapped_params) {
  const ModelLayout& layout = model_->layout();
  const bool has_master = optimizer().has_master();
  const bool split = optimizer().split_master();
  const int stage = engine_->stage();
  const int64_t kChunk = static_cast<int64_t>(values.size());
  const int64_t numel = layout.units[u].numel;
  // A LoRA job's base has no master copy and no optimizer range (the engine's ranges are
  // its adapters'); at stage 3 the rank holds its shard of it.
  const FlatRange range = !layout.lora ? engine_->ranges()[u]
                          : stage == 3 ? ShardOfUnit(layout.units[u], engine_->geometry()).owned
                                       : FlatRange{0, numel};
  // The part of the unit this rank stores: all of it while the parameters are whole
  // (stages 0–2), else the rank's range (stage 3, where "<unit>.params" is the shard).
  const bool whole = stage < 3;
  const int64_t first = whole ? 0 : range.begin, end = whole ? numel : range.end;
  for (int64_t begin = first; begin < end; begin += kChunk) {
    const int64_t stop = std::min(end, begin + kChunk);
    if (imported.empty()) {
      model_->InitializeUnitRange(job_.train().seed(), u, begin, stop, values.data());
    } else {
      std::copy(imported[u].begin() + begin, imported[u].begin() + stop, values.begin());
    }
    // Swapped shards (offload.params NVME) are written into their ring buffer, on their way
    // to the store; host shards (offload.params CPU) are the pinned pool's.
    const Tensor params = swapped_params.empty() ? model_->unit_params()[u] : swapped_params;
    // Offloaded parameters and master weights are host memory, which a device's ops do not
    // touch: they take the host's f32 values on the host (offload refuses a split master, so
    // both are a plain cast there, as on the device).
    const DeviceContext host_ctx = HostStepContext(ctx_, job_);
    const auto host_values = [&](int64_t from, int64_t to) {
      return Tensor(values.data() + (from - begin), DType::kF32, {to - from}, Device{});
    };
    const Tensor v = chunk.Slice(0, stop - begin);
    if (params.device() == ctx_.device) {
      ZT_RETURN_IF_ERROR(device_->Upload(v, values.data()));
      // A split master's high halves are the parameters on every rank that holds them
      // (rounded as SplitMaster rounds, which on ties is not Cast's way).
      ZT_RETURN_IF_ERROR(
          split ? SplitMasterWeights(ctx_, v, params.Slice(begin - first, stop - first), Tensor())
                : Cast(ctx_, v, params.Slice(begin - first, stop - first)));
    } else {
      ZT_RETURN_IF_ERROR(
          Cast(host_ctx, host_values(begin, stop), params.Slice(begin - first, stop - first)));
    }
    // The master copy holds the rank's range (the whole unit at stage 0).
    const int64_t lo = std::max(begin, range.begin), hi = std::min(stop, range.end);
    if (!has_master || lo >= hi) continue;
    const Tensor master_range = master.Slice(lo - range.begin, hi - range.begin);
    if (!(master.device() == ctx_.device)) {
      ZT_RETURN_IF_ERROR(Cast(host_ctx, host_values(lo, hi), master_range));
      continue;
    }
    if (!(params.device() == ctx_.device)) {
      return absl::InternalError(
          absl::StrCat("initializing ", model_->layout().units[u].name,
                       ": its parameters are host memory and its master weights device memory"));
    }
    const Tensor mine = v.Slice(lo - begin, hi - begin);
    ZT_RETURN_IF_ERROR(
        split ? SplitMasterWeights(ctx_, mine, params.Slice(lo - first, hi - first), master_range)
              : Cast(ctx_, mine, master_range));
  }
  return absl::OkStatus();
}

absl::Status Trainer::StreamQuantizedBase(std::vector<float>& values, const Tensor& chunk) {
  const ModelLayout& layout = model_->layout();
  // A LoRA job's base has no master copy; its optimizer is the adapters' (f32, no master).
  if (optimizer().has_master()) {
    return absl::InternalError(
        "a quantized model.base_dtype: the base streams into parameters without a master copy, but "
        "this job's optimizer keeps one");
  }
  if (!device_->host_addressable()) {
    return absl::UnimplementedError(
        "a quantized model.base_dtype: the base is quantized on the host into memory the device "
        "shares; this device's memory is not host-addressable");
  }
  const int stage = engine_->stage();
  const int64_t kChunk = static_cast<int64_t>(values.size());
  // A tensor-parallel rank or a pipeline stage reads the whole model's tensors (`read_layout`,
  // whose units are the whole model's: unit held[u] is the rank's unit u): each quantized weight
  // whole, to quantize as one rank does and keep its share (QuantizeBaseWeight), and the
  // unquantized rest into whole units (`whole_units`), whose shares (RankUnitFromWhole) are
  // uploaded at the end. A stage streams only its own units' tensors, and the embedding's wte
  // when its head holds the tied copy ("lm_head.weight" of its head unit), as the f32 import does.
  const TensorParallelGroup& tp = model_->tensor_parallel();
  const std::vector<int>& held = model_->held_units();
  const bool by_whole = tp.size > 1 || model_->pipelined();
  const ModelLayout whole = by_whole ? BuildModelLayout(job_.model()) : ModelLayout{};
  const ModelLayout& read_layout = by_whole ? whole : layout;
  std::vector<int> local_of(read_layout.units.size(), -1);
  for (size_t l = 0; l < held.size(); ++l) local_of[held[l]] = static_cast<int>(l);
  const bool tied_copy = layout.units.back().Find("lm_head.weight") != nullptr &&
                         read_layout.units.back().Find("lm_head.weight") == nullptr;
  const auto wanted = [&](int w) { return local_of[w] >= 0 || (w == 0 && tied_copy); };
  std::vector<std::vector<float>> whole_units(by_whole ? whole.units.size() : 0);
  for (size_t u = 0; u < whole_units.size(); ++u) {
    if (wanted(static_cast<int>(u))) whole_units[u].resize(whole.units[u].numel);
  }
  // offload.params NVME: the base's shards are the store's, which takes whole shards. The
  // stream lands in host staging of a unit's shard parts (its "<unit>.params" and
  // "<unit>.qbase" bytes, zeroed, so padding stays zero) — set-up memory beside the plan, as
  // the weight being assembled below is, for the units whose tensors are still arriving — and
  // each unit goes to the store whole once all its tensors arrived (a tensor-parallel rank's
  // unquantized shares arrive at the end), as the base's first generation.
  struct Staged {
    std::vector<float> part[SwappedBase::kParts];  // f32 words: aligned for any dtype
    int64_t rows_left = 0;  // of the unit's tensors, as the stream hands them over
    bool begun = false, written = false;
  };
  std::vector<Staged> staged(swapped_base_ ? layout.units.size() : 0);
  const auto part_name = [&](int u, SwappedBase::Part part) {
    return part == SwappedBase::Part::kParams ? layout.units[u].name + ".params"
                                              : QuantizedShardName(layout.units[u]);
  };
  const auto staging = [&](int u) -> absl::StatusOr<Staged*> {
    Staged& st = staged[u];
    if (st.written) {
      return absl::InternalError(absl::StrCat("model.init_from: ", layout.units[u].name,
                                              " received a tensor after it was swapped out"));
    }
    if (!st.begun) {
      st.begun = true;
      for (int p = 0; p < SwappedBase::kParts; ++p) {
        const std::string name = part_name(u, static_cast<SwappedBase::Part>(p));
        if (!swapped_base_->Holds(name)) continue;
        ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, arenas_->Spec(name));
        st.part[p].assign(static_cast<size_t>((spec->bytes() + 3) / 4), 0.0f);
      }
      for (const ParamSpec& p : read_layout.units[held[u]].params) st.rows_left += p.shape[0];
    }
    return &st;
  };
  const auto swap_out = [&](int u) -> absl::Status {
    Staged& st = staged[u];
    for (int p = 0; p < SwappedBase::kParts; ++p) {
      const std::string name = part_name(u, static_cast<SwappedBase::Part>(p));
      if (!swapped_base_->Holds(name)) continue;
      ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, arenas_->Spec(name));
      ZT_RETURN_IF_ERROR(swapped_base_->WriteBuffer(name, st.part[p].data(), spec->bytes()));
    }
    st = Staged{.written = true};
    return absl::OkStatus();
  };
  // Counts `rows` of unit u's tensors in, and swaps the unit out when they were its last.
  const auto arrived = [&](int u, int64_t rows) -> absl::Status {
    if (staged.empty()) return absl::OkStatus();
    ZT_ASSIGN_OR_RETURN(Staged * st, staging(u));
    st->rows_left -= rows;
    if (st->rows_left > 0 || by_whole) return absl::OkStatus();
    return swap_out(u);
  };
  if (swapped_base_) swapped_base_->BeginRestore();
  // Elements [b, b + n) of unit u's flat buffer from `from`: the rank stores all of it at
  // stages 0–2, its shard at stage 3 ("<unit>.params" is then the shard, or its staging).
  const auto upload = [&](int u, int64_t b, const float* from, int64_t n) -> absl::Status {
    const int64_t numel = layout.units[u].numel;
    const FlatRange mine =
        stage == 3 ? ShardOfUnit(layout.units[u], engine_->geometry()).owned : FlatRange{0, numel};
    Tensor params = model_->unit_params()[u];
    if (swapped_base_) {
      ZT_ASSIGN_OR_RETURN(Staged * st, staging(u));
      params = Tensor(st->part[static_cast<int>(SwappedBase::Part::kParams)].data(), params.dtype(),
                      {params.numel()});
    }
    for (int64_t lo = std::max(b, mine.begin); lo < std::min(b + n, mine.end); lo += kChunk) {
      const int64_t hi = std::min({b + n, mine.end, lo + kChunk});
      std::copy(from + (lo - b), from + (hi - b), values.begin());
      const Tensor v = chunk.Slice(0, hi - lo);
      ZT_RETURN_IF_ERROR(device_->Upload(v, values.data()));
      ZT_RETURN_IF_ERROR(Cast(ctx_, v, params.Slice(lo - mine.begin, hi - mine.begin)));
    }
    return absl::OkStatus();
  };
  // The f32 weight being assembled, per (unit, name); a weight is quantized and dropped once
  // all its rows arrived (Llama's fused q/k/v and gate/up arrive as consecutive tensors, so
  // one is in flight at a time).
  struct Pending {
    std::vector<float> values;
    int64_t rows_left = 0;
  };
  std::map<std::pair<int, std::string>, Pending> pending;
  auto sink = [&](const HfTensor& t, int64_t row, absl::Span<const float> piece) -> absl::Status {
    if (!wanted(t.unit)) {
      return absl::InternalError(absl::StrCat("model.init_from: the stream handed over ", t.name,
                                              ", a tensor of another pipeline stage's unit"));
    }
    // The rank's own unit (-1: the embedding a head stage reads its tied copy of wte from).
    const int u = local_of[t.unit];
    const ParamSpec& p = *t.param;
    const int64_t cols = p.shape.size() < 2 ? 1 : p.numel / p.shape[0];
    const int64_t rows = static_cast<int64_t>(piece.size()) / cols;
    if (p.quantized) {
      Pending& w = pending[{t.unit, p.name}];
      if (w.values.empty()) {
        w.values.resize(p.numel);
        w.rows_left = p.shape[0];
      }
      std::copy(piece.begin(), piece.end(), w.values.begin() + (t.row_offset + row) * cols);
      w.rows_left -= rows;
      if (w.rows_left > 0) return arrived(u, rows);
      const Tensor weight(w.values.data(), DType::kF32, {p.numel});
      absl::Status quantized;
      if (swapped_base_) {
        ZT_ASSIGN_OR_RETURN(Staged * st, staging(u));
        std::vector<float>& q = st->part[static_cast<int>(SwappedBase::Part::kQuantized)];
        quantized = model_->QuantizeBaseWeightIntoShard(
            ctx_, u, p.name, weight,
            Tensor(q.data(), DType::kF32, {static_cast<int64_t>(q.size())}));
      } else {
        // The model's own indexing is the whole model's (t.unit), its shards' the stage's.
        quantized = model_->QuantizeBaseWeight(ctx_, t.unit, p.name, weight);
      }
      pending.erase({t.unit, p.name});
      ZT_RETURN_IF_ERROR(quantized);
      return arrived(u, rows);
    }
    const int64_t b = t.unit_begin() + row * cols, n = static_cast<int64_t>(piece.size());
    if (by_whole) {
      std::copy(piece.begin(), piece.end(), whole_units[t.unit].begin() + b);
      return u < 0 ? absl::OkStatus() : arrived(u, rows);
    }
    ZT_RETURN_IF_ERROR(upload(u, b, piece.data(), n));
    return arrived(u, rows);
  };
  ZT_RETURN_IF_ERROR(StreamHuggingFace(job_.model().init_from(), job_.model(), read_layout, sink,
                                       kHfStreamPieceElements,
                                       [&](const HfTensor& t) { return wanted(t.unit); }));
  // A tensor-parallel rank's or a stage's units: their shares of the unquantized tensors.
  for (size_t u = 0; by_whole && u < layout.units.size(); ++u) {
    const std::vector<float> share =
        RankUnitFromWhole(job_.model(), layout.units[u], held[u], whole, whole_units, tp);
    ZT_RETURN_IF_ERROR(upload(static_cast<int>(u), 0, share.data(), layout.units[u].numel));
  }
  if (!swapped_base_) return absl::OkStatus();
  // The units still staged (a tensor-parallel rank's, whose unquantized shares came last) go
  // whole now; a unit the stream never reached would be zeros in the store, and is an error.
  for (size_t u = 0; u < staged.size(); ++u) {
    if (staged[u].written) continue;
    if (!staged[u].begun) {
      return absl::InternalError(absl::StrCat("model.init_from: ", job_.model().init_from(),
                                              " streamed nothing into ", layout.units[u].name,
                                              "'s swapped base shard"));
    }
    ZT_RETURN_IF_ERROR(swap_out(static_cast<int>(u)));
  }
  return swapped_base_->FinishRestore();
}

absl::Status Trainer::InitializeAdapters() {
  const zerotrain::ModelConfig& model = job_.model();
  // The adapters are f32 buffers the host fills (PEFT's init, or a PEFT directory); a device
  // whose memory the host cannot address has no LoRA kernels yet (docs/lora.md).
  if (!device_->host_addressable()) {
    return absl::UnimplementedError(
        "model.lora: the adapters are initialised and run on CPU ranks only so far");
  }
  // NF4 or INT8: the quantized weights come from the same seeded init as the rest of the base,
  // one tensor at a time, unless model.init_from streamed them in (StreamQuantizedBase).
  if (model.init_from().empty() && !swapped_base_) {  // a swapped one is written with its shards
    ZT_RETURN_IF_ERROR(model_->InitializeQuantizedBase(ctx_, job_.train().seed()));
  }
  model_->InitializeLora(job_.train().seed());
  if (!model.lora().init_from().empty()) {
    if (model_->tensor_parallel().size <= 1) {
      return ReadPeftAdapter(model, model_->layout(), model.lora().init_from(),
                             model_->unit_lora());
    }
    // A tensor-parallel rank reads the whole model's adapters and keeps its shares.
    const ModelLayout whole = BuildModelLayout(model);
    std::vector<std::vector<float>> adapters(whole.units.size());
    std::vector<Tensor> buffers;
    for (size_t u = 0; u < whole.units.size(); ++u) {
      adapters[u].resize(static_cast<size_t>(whole.units[u].lora_numel));
      buffers.push_back(adapters[u].empty()
                            ? Tensor()
                            : Tensor(adapters[u].data(), DType::kF32, {whole.units[u].lora_numel}));
    }
    ZT_RETURN_IF_ERROR(ReadPeftAdapter(model, whole, model.lora().init_from(), buffers));
    model_->SetLoraFromWhole(adapters);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> Trainer::FullAdapters() {
  std::vector<std::vector<float>> out;
  const ModelLayout& layout = model_->layout();
  for (size_t u = 0; u < layout.units.size(); ++u) {
    out.emplace_back(static_cast<size_t>(layout.units[u].lora_numel));
    if (out.back().empty()) continue;
    // Whole on every rank after each step (stages 0–2 all-gather them).
    ZT_RETURN_IF_ERROR(device_->Download(
        out.back().data(), model_->unit_lora()[u].Slice(0, layout.units[u].lora_numel)));
  }
  if (comms_.tensor && comms_.tensor->size() > 1) {
    // Each rank holds its shares (worker/model/lora_tensor_parallel.h): all-gathered over the
    // tensor-parallel group and each matrix's slice put in its place; replicated matrices
    // from TP rank 0 (the same on every rank).
    const int t = comms_.tensor->size();
    const ModelLayout whole = BuildModelLayout(job_.model());
    for (size_t u = 0; u < out.size(); ++u) {
      const int64_t n = layout.units[u].lora_numel;
      if (n == 0) continue;
      std::vector<float> all(static_cast<size_t>(n * t));
      ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.tensor->AllGather(
                                            Tensor(out[u].data(), DType::kF32, {n}),
                                            Tensor(all.data(), DType::kF32, {n * t}),
                                            layout.units[u].name + " adapters all-gather"));
      ZT_RETURN_IF_ERROR(h.Wait());
      // A pipeline stage's unit u is the whole model's held_units()[u].
      const UnitLayout& whole_unit =
          whole.units[model_->pipelined() ? model_->held_units()[u] : u];
      std::vector<float> joined(static_cast<size_t>(whole_unit.lora_numel), 0.0f);
      for (int k = 0; k < t; ++k) {
        for (size_t s = 0; s < whole_unit.lora.size(); ++s) {
          const LoraSite& local = layout.units[u].lora[s];
          const LoraSite& site = whole_unit.lora[s];
          for (const bool a : {true, false}) {
            const TensorParallelSlice slice = LoraSliceOf(job_.model(), site, a, t, k);
            if (!slice.split && k > 0) continue;
            PlaceSlice(slice, all.data() + k * n + (a ? local.a.offset : local.b.offset),
                       joined.data() + (a ? site.a.offset : site.b.offset));
          }
        }
      }
      out[u] = std::move(joined);
    }
  }
  if (!model_->pipelined()) return out;
  // A pipeline stage holds its own blocks' adapters: each block's are broadcast over the
  // pipeline group from the stage the plan gave it, so every rank ends with the whole model's,
  // the very values that stage trained (a broadcast copies bits).
  const ModelLayout whole = BuildModelLayout(job_.model());
  const std::vector<int> stage_of = StageOfEachUnit(job_);
  std::vector<std::vector<float>> joined(whole.units.size());
  for (size_t k = 0; k < out.size(); ++k) joined[model_->held_units()[k]] = std::move(out[k]);
  for (size_t u = 0; u < whole.units.size(); ++u) {
    const int64_t n = whole.units[u].lora_numel;
    if (n == 0) continue;
    joined[u].resize(static_cast<size_t>(n));
    ZT_ASSIGN_OR_RETURN(CommHandle h,
                        comms_.pipeline->Broadcast(Tensor(joined[u].data(), DType::kF32, {n}),
                                                   stage_of[u],
                                                   whole.units[u].name + " adapters from its stage"));
    ZT_RETURN_IF_ERROR(h.Wait());
  }
  return joined;
}

namespace {

// Sequences per optimizer step over all ranks: what a resumed job must keep.
int64_t GlobalBatchSequences(const zerotrain::JobSpec& job) {
  // The ranks of a tensor-parallel group, and the stages of a pipeline, read the same
  // sequences.
  const int64_t tp = std::max(1, job.parallel().tensor_parallel());
  const int64_t pp = std::max(1, job.parallel().pipeline_parallel());
  return int64_t{job.parallel().world_size()} / (tp * pp) * job.train().micro_batch_size() *
         job.train().grad_accum_steps();
}

std::string ProtoJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Only unset fields differ between equal configurations: both sides have defaults applied.
  if (!google::protobuf::util::MessageToJsonString(m, &out, options).ok()) return "?";
  return out;
}

// The sharding engine's counts of parameter-shard uploads so far (offload.params), which a
// step's record takes the difference of.
struct ParamUploads {
  int64_t bytes = 0;
  double seconds = 0;
  int64_t ahead = 0;
  int64_t at_gather = 0;
};

ParamUploads ParamUploadsOf(const ShardingEngine& engine) {
  return {.bytes = engine.param_upload_bytes(),
          .seconds = engine.param_upload_seconds(),
          .ahead = engine.param_uploads_ahead(),
          .at_gather = engine.param_uploads_at_gather()};
}

}  // namespace

absl::Status Trainer::SaveCheckpoint(bool final) {
  // A consistent state: no host update half done (Step drains at checkpoint steps already).
  ZT_RETURN_IF_ERROR(FinishDelayedUpdate());
  nlohmann::json state = {{"step", step_},
                          {"optimizer_steps", optimizer().steps_taken()},
                          {"world_size", job_.parallel().world_size()},
                          {"zero_stage", job_.parallel().zero_stage()},
                          {"shard_group_size", job_.parallel().shard_group_size()},
                          {"tensor_parallel", std::max(1, job_.parallel().tensor_parallel())},
                          {"pipeline_parallel", pipeline_size_},
                          // Which units each stage holds: the schedule's chunks.
                          {"pipeline_schedule", zerotrain::ParallelConfig::PipelineSchedule_Name(
                                                    job_.parallel().pipeline_schedule())},
                          {"virtual_stages", std::max(1, job_.parallel().virtual_stages())},
                          {"global_batch_sequences", GlobalBatchSequences(job_)},
                          {"model", ProtoJson(job_.model())},
                          {"precision", ProtoJson(job_.precision())},
                          {"optimizer", ProtoJson(job_.optimizer())},
                          {"optimizer_saved", job_.checkpoint().save_optimizer()}};
  if (loss_scaler_) {
    const LossScalerState& ls = loss_scaler_->state();
    state["loss_scaler"] = {{"scale", ls.scale},
                            {"hysteresis_left", ls.hysteresis_left},
                            {"clean_steps", ls.clean_steps},
                            {"overflows_at_min_scale", ls.overflows_at_min_scale},
                            {"skipped_steps", ls.skipped_steps}};
  }
  // Synchronous: the outcome is this save's. Asynchronous: the previous save's (never the
  // final one: that is the last); Finish() gives this one's.
  const bool synchronous = !job_.checkpoint().async();
  last_save_final_ = final;
  return SaveOutcome(checkpoint_writer_->Save(step_, std::move(state)), synchronous && final);
}

absl::Status Trainer::SaveOutcome(absl::Status saved, bool final) {
  if (saved.ok()) return saved;
  if (final) {
    return absl::Status(saved.code(),
                        absl::StrCat("the final checkpoint (step ", step_,
                                     ") failed, so the run did not succeed (on_save_error: "
                                     "CONTINUE covers the periodic saves only): ",
                                     saved.message()));
  }
  if (job_.checkpoint().on_save_error() == zerotrain::CheckpointConfig::CONTINUE) {
    // The previous checkpoint is intact; the next save tries again.
    std::fprintf(stderr, "zt: rank %d: checkpoint failed, training goes on: %s\n", options_.rank,
                 std::string(saved.message()).c_str());
    return absl::OkStatus();
  }
  return saved;
}

absl::Status Trainer::Resume() {
  // Rank 0 picks the checkpoint and verifies every file once; the others open the manifest
  // it names instead of each reading every rank's file again.
  const std::string key = absl::StrCat("resume/", options_.resume_dir);
  std::unique_ptr<Checkpoint> opened;
  if (options_.rank == 0) {
    absl::StatusOr<LoadableCheckpoint> loadable = FindLoadable(
        options_.resume_dir,
        options_.resume_fallback ? CheckpointFallback::kOlderVerified : CheckpointFallback::kNone);
    ZT_RETURN_IF_ERROR(store_->Set(key, loadable.ok()
                                            ? "ok:" + loadable->checkpoint->path()
                                            : absl::StrCat("error:", loadable.status().message())));
    if (!loadable.ok()) return loadable.status();
    if (!loadable->note.empty()) {
      std::fprintf(stderr, "zt: resuming from %s: %s\n", loadable->checkpoint->path().c_str(),
                   loadable->note.c_str());
    }
    opened = std::move(loadable->checkpoint);
  } else {
    ZT_RETURN_IF_ERROR(store_->Wait({key}, absl::Seconds(job_.parallel().comm_timeout_s())));
    ZT_ASSIGN_OR_RETURN(std::string choice, store_->Get(key));
    if (choice.starts_with("error:")) {
      return absl::AbortedError(absl::StrCat("rank 0 found no loadable checkpoint in '",
                                             options_.resume_dir, "': ", choice.substr(6)));
    }
    ZT_ASSIGN_OR_RETURN(opened, OpenCheckpoint(choice.substr(3)));
  }
  const Checkpoint& ckpt = *opened;
  const nlohmann::json& state = ckpt.state();
  // What must not change across a resume: the model, its precision and optimizer (the
  // states' meaning), and the global batch (the data position is the step).
  for (const auto& [key, now] :
       {std::pair<const char*, std::string>{"model", ProtoJson(job_.model())},
        {"precision", ProtoJson(job_.precision())},
        {"optimizer", ProtoJson(job_.optimizer())}}) {
    if (state.value(key, std::string()) != now) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint '", ckpt.path(), "' was written for another ", key,
          " configuration: ", state.value(key, std::string("(none)")), " — this job has ", now));
    }
  }
  if (state.value("global_batch_sequences", int64_t{0}) != GlobalBatchSequences(job_)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint '%s' was written with a global batch of %d sequences; this job's "
        "world_size × micro_batch_size × grad_accum_steps is %d — keep the global batch to "
        "resume",
        ckpt.path(), state.value("global_batch_sequences", int64_t{0}),
        GlobalBatchSequences(job_)));
  }
  // A weights-only checkpoint (checkpoint.save_optimizer false) restarts the optimizer: its
  // moments stay zero and its step count starts again.
  const bool weights_only = !state.value("optimizer_saved", true);
  if (weights_only && options_.rank == 0) {
    std::fprintf(stderr, "zt: %s holds weights only: the optimizer starts afresh\n",
                 ckpt.path().c_str());
  }
  zerotrain::JobSpec saved = job_;
  saved.mutable_parallel()->set_world_size(state.value("world_size", 0));
  saved.mutable_parallel()->set_zero_stage(state.value("zero_stage", -1));
  saved.mutable_parallel()->set_shard_group_size(state.value("shard_group_size", 0));
  const auto& parallel = job_.parallel();
  auto rank_file = [&](int r) {
    return (std::filesystem::path(ckpt.path()) / absl::StrFormat("rank-%05d.safetensors", r))
        .string();
  };
  // Each rank's file holds its tensor-parallel shares of its pipeline stage's units: with
  // tensor or pipeline parallelism on either side and another layout, every buffer is rebuilt
  // from the saved shares (worker/checkpoint/tensor_parallel_reshard.h), the stages' units
  // being the chunks of the schedule the manifest records.
  const int saved_pp = state.value("pipeline_parallel", 1);
  saved.mutable_parallel()->set_pipeline_parallel(saved_pp);
  if (saved_pp > 1) {
    zerotrain::ParallelConfig::PipelineSchedule schedule = zerotrain::ParallelConfig::ONE_F_ONE_B;
    zerotrain::ParallelConfig::PipelineSchedule_Parse(
        state.value("pipeline_schedule", std::string("ONE_F_ONE_B")), &schedule);
    saved.mutable_parallel()->set_pipeline_schedule(schedule);
    saved.mutable_parallel()->set_virtual_stages(std::max(1, state.value("virtual_stages", 1)));
  }
  const int saved_tp = state.value("tensor_parallel", 1),
            tp = std::max(1, parallel.tensor_parallel());
  saved.mutable_parallel()->set_tensor_parallel(saved_tp);
  const bool same_chunks =
      saved_pp == pipeline_size_ &&
      (saved_pp <= 1 ||
       (saved.parallel().pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED) ==
               (parallel.pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED) &&
           saved.parallel().virtual_stages() == std::max(1, parallel.virtual_stages()));
  const bool same_layout = saved_tp == tp && same_chunks &&
                           saved.parallel().world_size() == parallel.world_size() &&
                           saved.parallel().zero_stage() == parallel.zero_stage() &&
                           saved.parallel().shard_group_size() == parallel.shard_group_size();
  const bool layout_valid = [&] {
    const int w = saved.parallel().world_size(), g = saved.parallel().shard_group_size();
    const int tp_pp = saved_tp * saved_pp;
    return w >= 1 && g >= 1 && saved_tp >= 1 && saved_pp >= 1 && w % tp_pp == 0 &&
           (w / tp_pp) % g == 0 && saved.parallel().zero_stage() >= 0 &&
           saved.parallel().zero_stage() <= 3;
  }();
  if (!same_layout && !layout_valid) {
    return absl::DataLossError(
        absl::StrCat("checkpoint '", ckpt.path(), "': the manifest's parallel layout is invalid"));
  }
  // The checkpointed buffers of `plan` (the arenas', or one unit's swapped ones) into `into`.
  const auto read = [&](const MemoryPlan& plan, const Arenas& into) {
    if (same_layout) return ReadRankState(rank_file(options_.rank), plan, into, weights_only);
    if (saved_tp > 1 || tp > 1 || saved_pp > 1 || pipeline_size_ > 1) {
      return ReshardTensorParallelState(saved, rank_file, job_, options_.rank, plan, into,
                                        weights_only);
    }
    return ReshardRankState(saved, rank_file, job_, options_.rank, plan, into, weights_only);
  };
  const MemoryPlan arena_plan = ArenaPlan();
  ZT_RETURN_IF_ERROR(
      RestoreThroughHost(weights_only, [&](const Arenas& into) { return read(arena_plan, into); }));
  if (nvme_optimizer_ || swapped_base_) ZT_RETURN_IF_ERROR(RestoreSwapped(weights_only, read));
  step_ = state.value("step", int64_t{0});
  optimizer().RestoreStepsTaken(weights_only ? 0 : state.value("optimizer_steps", int64_t{0}));
  if (loss_scaler_ && state.contains("loss_scaler")) {
    const nlohmann::json& ls = state["loss_scaler"];
    loss_scaler_->Restore({.scale = ls.value("scale", 1.0),
                           .hysteresis_left = ls.value("hysteresis_left", 0),
                           .clean_steps = ls.value("clean_steps", int64_t{0}),
                           .overflows_at_min_scale = ls.value("overflows_at_min_scale", int64_t{0}),
                           .skipped_steps = ls.value("skipped_steps", int64_t{0})});
  }
  return absl::OkStatus();
}

absl::Status Trainer::RestoreThroughHost(
    bool weights_only, const std::function<absl::Status(const Arenas& into)>& read) {
  if (device_->host_addressable()) return read(*arenas_);
  // Host copies of the buffers a checkpoint holds (set-up, not the step loop), read into as
  // the arenas would be, then each uploaded whole.
  MemoryPlan host_plan;
  const MemoryPlan arena_plan = ArenaPlan();
  for (const BufferSpec* b : CheckpointedBuffers(arena_plan, weights_only)) {
    host_plan.buffers.push_back(*b);
  }
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Arenas> host, Arenas::Create(host_plan));
  ZT_RETURN_IF_ERROR(read(*host));
  for (const BufferSpec& b : host_plan.buffers) {
    ZT_ASSIGN_OR_RETURN(Tensor from, host->Get(b.name));
    ZT_ASSIGN_OR_RETURN(Tensor to, arenas_->Get(b.name));
    ZT_RETURN_IF_ERROR(device_->Upload(to, from.raw()));
  }
  return absl::OkStatus();
}

absl::StatusOr<const void*> Trainer::BufferBytes(const BufferSpec& b) {
  if (b.category == MemoryCategory::kNvme) {
    if (swapped_base_ && swapped_base_->Holds(b.name)) return swapped_base_->ReadBuffer(b.name);
    if (!nvme_optimizer_) {
      return absl::FailedPreconditionError(
          absl::StrCat("buffer ", b.name, " is swapped but the rank has no NVMe optimizer"));
    }
    return nvme_optimizer_->ReadBuffer(b.name);
  }
  ZT_ASSIGN_OR_RETURN(Tensor t, arenas_->Get(b.name));
  return static_cast<const void*>(t.raw());
}

std::string Trainer::MasterName(int u) const {
  return model_->layout().units[u].name +
         (job_.precision().split_master_weights() ? ".master_low" : ".master");
}

MemoryPlan Trainer::ArenaPlan() const {
  MemoryPlan out;
  for (const BufferSpec& b : plan_.buffers) {
    if (b.category != MemoryCategory::kNvme) out.buffers.push_back(b);
  }
  return out;
}

absl::Status Trainer::RestoreSwapped(
    bool weights_only,
    const std::function<absl::Status(const MemoryPlan& plan, const Arenas& into)>& read) {
  // One unit's swapped buffers at a time, as host (optimizer-state) buffers: set-up holds
  // one unit's states beside the ring, not the rank's.
  if (nvme_optimizer_) nvme_optimizer_->BeginRestore();
  if (swapped_base_) swapped_base_->BeginRestore();
  for (const UnitLayout& u : model_->layout().units) {
    MemoryPlan unit_plan;
    for (const BufferSpec& b : plan_.buffers) {
      if (b.category != MemoryCategory::kNvme || !b.name.starts_with(u.name + ".")) continue;
      BufferSpec host = b;
      host.category = b.role();
      host.offloaded_from.reset();
      unit_plan.buffers.push_back(std::move(host));
    }
    if (CheckpointedBuffers(unit_plan, weights_only).empty()) continue;
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<Arenas> host, Arenas::Create(unit_plan));
    ZT_RETURN_IF_ERROR(read(unit_plan, *host));
    for (const BufferSpec* b : CheckpointedBuffers(unit_plan, weights_only)) {
      if (b->bytes() == 0) continue;
      ZT_ASSIGN_OR_RETURN(Tensor t, host->Get(b->name));
      if (swapped_base_ && swapped_base_->Holds(b->name)) {
        ZT_RETURN_IF_ERROR(swapped_base_->WriteBuffer(b->name, t.raw(), b->bytes()));
        continue;
      }
      if (!nvme_optimizer_) {
        return absl::InternalError(absl::StrCat("restore: ", b->name, " is swapped by nothing"));
      }
      ZT_RETURN_IF_ERROR(nvme_optimizer_->WriteBuffer(b->name, t.raw(), b->bytes()));
    }
  }
  if (swapped_base_) ZT_RETURN_IF_ERROR(swapped_base_->FinishRestore());
  return nvme_optimizer_ ? nvme_optimizer_->FinishRestore() : absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> Trainer::FullWeights() {
  ZT_RETURN_IF_ERROR(FinishDelayedUpdate());  // the master weights are being written
  if (model_->layout().lora) {
    return absl::FailedPreconditionError(
        "FullWeights: a LoRA job trains its adapters (FullAdapters); its base is frozen");
  }
  // The fp32 source of each unit: the master weights when the parameters are 16-bit, else the
  // parameters; sharded (the rank's range) where the stage shards it.
  const std::vector<Tensor>& bound_master = optimizer().master_weights();
  const bool has_master = optimizer().has_master();
  const int stage = engine_->stage();
  const bool split = has_master && optimizer().split_master();
  const bool sharded = !has_master ? stage == 3 : stage >= 1;
  const size_t n_units = model_->layout().units.size();
  int64_t largest_padded = 0, largest_master = 0;
  for (size_t u = 0; u < n_units; ++u) {
    largest_padded = std::max(largest_padded, engine_->shard(static_cast<int>(u)).padded);
    if (has_master) {
      ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, arenas_->Spec(MasterName(static_cast<int>(u))));
      largest_master = std::max(largest_master, spec->numel());
    }
  }
  // Device buffers outside the plan (export is not the step loop): the gathered unit, and a
  // split master's joined range (a shard's padding stays zero), and with the master weights
  // in the swap store, a unit's master read back from it.
  ScratchTensor gathered, joined, swapped;
  if (sharded) {
    ZT_ASSIGN_OR_RETURN(gathered, device_->AllocateScratchF32(largest_padded));
  }
  if (split) {
    ZT_ASSIGN_OR_RETURN(joined, device_->AllocateScratchF32(largest_master));
  }
  // Parameters that are their own master and swapped (offload.params NVME, fp32): the shard
  // is read back from the store as the master would be.
  const bool params_swapped = !has_master && engine_->params_swapped();
  // Sources in host memory (offload.optimizer CPU's master weights, offload.params CPU's f32
  // shards) go up into that scratch too: the gather and the read-back take device memory.
  const auto on_host = [&](const std::vector<Tensor>& ts) {
    return !ts.empty() && !(ts.front().device() == ctx_.device);
  };
  const bool host_master = has_master && !nvme_optimizer_ && on_host(bound_master);
  const bool host_params = !has_master && !params_swapped && on_host(model_->unit_params());
  if ((has_master && nvme_optimizer_) || params_swapped || host_master || host_params) {
    int64_t largest = largest_master;
    for (const Tensor& p : model_->unit_params()) largest = std::max(largest, p.numel());
    ZT_ASSIGN_OR_RETURN(swapped, device_->AllocateScratchF32(largest));
  }
  std::vector<std::vector<float>> out;
  for (size_t u = 0; u < n_units; ++u) {
    const int unit = static_cast<int>(u);
    Tensor unit_master;
    if (has_master && !nvme_optimizer_) unit_master = bound_master[u];
    if (host_master) {
      const Tensor host = bound_master[u];
      unit_master =
          Tensor(swapped.tensor.raw(), host.dtype(), {host.numel()}, swapped.tensor.device());
      if (host.numel() > 0) ZT_RETURN_IF_ERROR(device_->Upload(unit_master, host.raw()));
    }
    if (has_master && nvme_optimizer_) {
      ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, arenas_->Spec(MasterName(unit)));
      unit_master =
          Tensor(swapped.tensor.raw(), spec->dtype, {spec->numel()}, swapped.tensor.device());
      if (spec->numel() > 0) {
        ZT_ASSIGN_OR_RETURN(const void* bytes, nvme_optimizer_->ReadBuffer(spec->name));
        ZT_RETURN_IF_ERROR(device_->Upload(unit_master, bytes));
      }
    }
    Tensor source = !has_master ? model_->unit_params()[u] : unit_master;
    if (params_swapped) {
      const Tensor shape = model_->unit_params()[u];
      source =
          Tensor(swapped.tensor.raw(), shape.dtype(), {shape.numel()}, swapped.tensor.device());
      if (shape.numel() > 0) {
        ZT_ASSIGN_OR_RETURN(const void* bytes, nvme_optimizer_->ReadBuffer(
                                                   model_->layout().units[u].name + ".params"));
        ZT_RETURN_IF_ERROR(device_->Upload(source, bytes));
      }
    } else if (host_params) {
      const Tensor host = model_->unit_params()[u];
      source = Tensor(swapped.tensor.raw(), host.dtype(), {host.numel()}, swapped.tensor.device());
      if (host.numel() > 0) ZT_RETURN_IF_ERROR(device_->Upload(source, host.raw()));
    }
    if (split) {
      const FlatRange range = engine_->ranges()[u];
      const int64_t n = range.end - range.begin;
      source = joined.tensor.Slice(0, unit_master.numel());
      ZT_RETURN_IF_ERROR(Zero(ctx_, source));
      const Tensor params = model_->unit_params()[u];
      ZT_RETURN_IF_ERROR(JoinMasterWeights(
          ctx_, stage == 3 ? params.Slice(0, n) : params.Slice(range.begin, range.end),
          unit_master.Slice(0, n), source.Slice(0, n)));
    }
    const int64_t numel = engine_->shard(unit).numel;
    if (source.dtype() != DType::kF32) {
      return absl::InvalidArgumentError("FullWeights: the weights' source must be f32");
    }
    Tensor whole = source;
    if (sharded) {
      ZT_RETURN_IF_ERROR(engine_->AllGatherUnit(unit, source, gathered.tensor));
      whole = gathered.tensor;
    }
    std::vector<float> host(static_cast<size_t>(numel));
    ZT_RETURN_IF_ERROR(device_->Download(host.data(), whole.Slice(0, numel)));
    out.push_back(std::move(host));
  }
  // A stage's units (tensor-parallel shares or not) at the whole model's layout, then every
  // stage's units on every rank.
  if (comms_.tensor || pipeline_size_ > 1) ZT_RETURN_IF_ERROR(JoinTensorParallelShares(out));
  if (pipeline_size_ > 1) {
    ZT_RETURN_IF_ERROR(JoinPipelineStages(
        *comms_.pipeline, pipeline_stage_, BuildModelLayout(job_.model()), StageOfEachUnit(job_),
        model_->held_units(), out, device_->host_addressable() ? nullptr : device_.get()));
  }
  return out;
}

absl::Status Trainer::JoinTensorParallelShares(std::vector<std::vector<float>>& units) {
  // Every TP rank's shares of a unit (equal sizes: the layout is the same on each), gathered,
  // each tensor's slice put in its place; replicated tensors come from TP rank 0. A pipeline
  // stage's unit u is the whole model's held_units()[u]; a head stage's copy of a tied wte is
  // left out (the embedding's wte is the model's).
  const int t = comms_.tensor ? comms_.tensor->size() : 1;
  const ModelLayout whole = BuildModelLayout(job_.model());
  const ModelLayout& local = model_->layout();
  // A device the host cannot address (CUDA) has a communicator of device buffers (NCCL, or
  // staged through the host on its copy engine): the shares go up into device scratch outside
  // the plan (export is not the step loop), are gathered there and come back down.
  const bool on_device = t > 1 && !device_->host_addressable();
  ScratchTensor share_dev, all_dev;
  if (on_device) {
    int64_t largest = 0;
    for (const std::vector<float>& v : units) {
      largest = std::max(largest, static_cast<int64_t>(v.size()));
    }
    ZT_ASSIGN_OR_RETURN(share_dev, device_->AllocateScratchF32(largest));
    ZT_ASSIGN_OR_RETURN(all_dev, device_->AllocateScratchF32(largest * t));
  }
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t n = static_cast<int64_t>(units[u].size());
    const UnitLayout& whole_unit = whole.units[model_->pipelined() ? model_->held_units()[u] : u];
    std::vector<float> all;
    if (t > 1) {
      all.resize(static_cast<size_t>(n * t));
      Tensor in(units[u].data(), DType::kF32, {n}), out(all.data(), DType::kF32, {n * t});
      if (on_device) {
        in = share_dev.tensor.Slice(0, n);
        out = all_dev.tensor.Slice(0, n * t);
        ZT_RETURN_IF_ERROR(device_->Upload(in, units[u].data()));
      }
      ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.tensor->AllGather(
                                            in, out, local.units[u].name + " shares all-gather"));
      ZT_RETURN_IF_ERROR(h.Wait());
      if (on_device) ZT_RETURN_IF_ERROR(device_->Download(all.data(), out));
    } else {
      all = std::move(units[u]);
    }
    std::vector<float> joined(static_cast<size_t>(whole_unit.numel), 0.0f);
    for (int k = 0; k < t; ++k) {
      for (const ParamSpec& p : local.units[u].params) {
        if (whole_unit.Find(p.name) == nullptr) continue;  // the tied wte's copy
        const ParamSpec& w = *whole_unit.Find(p.name);
        const TensorParallelSlice s = SliceOf(job_.model(), p.name, w.shape, t, k);
        if (!s.split && k > 0) continue;
        PlaceSlice(s, all.data() + k * n + p.offset, joined.data() + w.offset);
      }
    }
    units[u] = std::move(joined);
  }
  return absl::OkStatus();
}

bool Trainer::DelayedUpdateDrains(int64_t step, StopKind stop) const {
  const auto& train = job_.train();
  const auto& ckpt = job_.checkpoint();
  return step >= train.max_steps() ||
         (options_.stop_after_step && step >= *options_.stop_after_step) ||
         stop != StopKind::kNone ||
         (!ckpt.dir().empty() && ckpt.interval_steps() > 0 && step % ckpt.interval_steps() == 0) ||
         (val_batches_ && train.eval_interval() > 0 && step % train.eval_interval() == 0);
}

absl::Status Trainer::LandDelayedUpdate(StepRecord* r) {
  ZT_ASSIGN_OR_RETURN(const DelayedHostStep::Finished f, delayed_->Finish(engine_->param_views()));
  if (f.step == 0) return absl::OkStatus();
  if (r != nullptr) {
    r->host_optimizer_s += f.update_seconds;
    r->offload_bytes_to_device += f.bytes_to_device;
    r->offload_to_device_s += f.upload_seconds;
    r->offload_bytes_to_host += f.bytes_to_host;
    r->offload_to_host_s += f.download_seconds;
  }
  // ZeRO stages 1-2: every rank's updated range into everyone's parameters.
  return engine_->FinishStep(ctx_);
}

absl::Status Trainer::DelayedHostUpdate(const DelayedUpdateArgs& args, StepRecord& r) {
  // This step's gradients are all in the downloads' current bank once they drain; the bank
  // changes at Launch, so the next backward's copies never touch what this host step reads.
  ZT_RETURN_IF_ERROR(grad_downloads_->Drain());
  // The previous step's host update ran beside this step's forward and backward, which read
  // the parameters from before it; they land now, before anything reads them again.
  ZT_RETURN_IF_ERROR(LandDelayedUpdate(&r));
  ZT_RETURN_IF_ERROR(
      delayed_->Launch(engine_->param_views(), step_ + 1, args.lr, args.grad_scale, args.seed));
  if (!args.drain) return absl::OkStatus();
  // Something reads the weights after this step: its own update lands too, and the next step
  // starts the overlap again from fresh parameters.
  return LandDelayedUpdate(&r);
}

absl::Status Trainer::FinishDelayedUpdate() {
  if (delayed_ == nullptr || !delayed_->pending()) return absl::OkStatus();
  return LandDelayedUpdate(nullptr);
}

absl::StatusOr<StepRecord> Trainer::Step() {
  const auto start = Clock::now();
  const auto& train = job_.train();
  const int64_t accum = train.grad_accum_steps();
  // Data-parallel ranks: each reads its own batches (a tensor-parallel group shares one).
  const int64_t ranks = data_size_;
  const int64_t tokens_per_micro = model_->batch() * model_->seq_len();
  const CommStats comm_before = comm_stats();
  const double waited_before = engine_->waited_seconds();
  // The swap of the whole step: the gathers' shard reads (offload.params NVME) as well as the
  // optimizer's pass.
  const NvmeOptimizer::Stats swap_before =
      nvme_optimizer_ ? nvme_optimizer_->stats() : NvmeOptimizer::Stats{};
  const SwappedBase::Stats base_before =
      swapped_base_ ? swapped_base_->stats() : SwappedBase::Stats{};
  const GradientDownloads::Stats downloads_before =
      grad_downloads_ ? grad_downloads_->stats() : GradientDownloads::Stats{};
  const ParamUploads uploads_before = ParamUploadsOf(*engine_);

  ZT_RETURN_IF_ERROR(engine_->BeginStep(ctx_));
  ZT_RETURN_IF_ERROR(engine_->BeginStatistics(ctx_));
  // The loss scale multiplies the gradient at its source (dlogits) so small fp16 gradients
  // survive the backward; the optimizer divides it back out.
  const double loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0;
  double data_wait_s = 0;
  std::optional<double> pipeline_bubble;
  PipelineTiming pipeline_timing;
  if (model_->pipelined()) {
    // Plain shards only (validation refuses packing with pipeline parallelism): every
    // micro-batch counts all B·T targets.
    const float grad_scale =
        static_cast<float>(loss_scale / static_cast<double>(ranks * accum * tokens_per_micro));
    PipelineTiming timing;
    ZT_RETURN_IF_ERROR(RunPipelineSchedule(grad_scale, &data_wait_s, &timing));
    ZT_ASSIGN_OR_RETURN(pipeline_bubble, PipelineBubble(timing));
    pipeline_timing = timing;
  }
  // The step's loss is the mean over every target it counts, on every rank and in every
  // micro-batch: the loss of the one large batch that gradient accumulation and data
  // parallelism split, however unevenly documents (prompts masked, padding) spread the counted
  // targets. Every rank works the total out alone from the document plan, no collective.
  int64_t step_counted = 0;
  if (!model_->pipelined()) {
    for (int64_t k = step_ * accum * ranks; k < (step_ + 1) * accum * ranks; ++k) {
      ZT_ASSIGN_OR_RETURN(const int64_t counted, train_batches_->CountedTargets(k));
      step_counted += counted;
    }
  }
  for (int64_t micro = 0; micro < accum && !model_->pipelined(); ++micro) {
    const int64_t global = (step_ * accum + micro) * ranks + data_rank_;
    const auto fill_start = Clock::now();
    ZT_ASSIGN_OR_RETURN(const int64_t counted, UploadBatch(*train_batches_, global));
    data_wait_s += std::chrono::duration<double>(Clock::now() - fill_start).count();
    // The gradient sums over the micro-batch's counted targets at grad_scale each, so
    // 1 / step_counted makes the step's gradient the token-level mean's. The loss kernel
    // averages over the micro-batch's own counted targets: dividing that by
    // step_counted / (counted · ranks) weighs it by its share of the step, and the ranks' sum
    // is divided by `ranks` below. Plain shards count all B·T targets: 1 / (N·accum·B·T) and
    // accum, as always. A micro-batch with nothing counted adds nothing.
    const float grad_scale =
        step_counted == 0 ? 0.0f
                          : static_cast<float>(loss_scale / static_cast<double>(step_counted));
    const double loss_divisor =
        counted == 0 ? 1.0
                     : static_cast<double>(step_counted) / static_cast<double>(counted * ranks);
    // The adapters' dropout masks: a function of the job's seed and the global micro-batch,
    // so a resumed run draws the masks the uninterrupted one did.
    if (model_->layout().lora) {
      model_->SetLoraDropoutSeed(job_.train().seed() * 0x9E3779B97F4A7C15ull +
                                 static_cast<uint64_t>(global));
    }
    // The step's loss is summed on the device, each micro-batch weighed as above.
    ZT_RETURN_IF_ERROR(engine_->ForwardBackward(ctx_,
                                                {.write_grad = true,
                                                 .grad_scale = grad_scale,
                                                 .loss_sum = engine_->loss_accumulator(),
                                                 .loss_divisor = loss_divisor},
                                                /*last=*/micro + 1 == accum));
  }
  ZT_RETURN_IF_ERROR(
      engine_->AccumulateGradientStatistics(ctx_, /*check_finite=*/loss_scaler_.has_value()));
  const int stop_request = options_.stop ? static_cast<int>(options_.stop->kind()) : 0;
  ZT_ASSIGN_OR_RETURN(StepTotals totals, ReadStatistics(stop_request, /*loss_divisor=*/1.0));
  StepRecord r;
  r.stop = static_cast<StopKind>(totals.stop_request);
  r.loss = totals.loss_sum / static_cast<double>(ranks);
  r.lr = LearningRate(job_.optimizer(), step_, train.max_steps());
  r.loss_scale = loss_scale;
  const auto optimizer_start = Clock::now();
  const double waited_in_step_before_optimizer = engine_->waited_seconds();
  // ZeRO-Offload's delayed update, past its warm-up (steps 1..after_steps are serial).
  const bool delayed =
      delayed_ != nullptr && step_ + 1 > job_.offload().delayed_update().after_steps();
  if (totals.nonfinite) {
    // A scaled gradient overflowed: skip the update, let the scaler back off. The step still
    // counts (data and schedule move on), as DeepSpeed counts it.
    ZT_RETURN_IF_ERROR(loss_scaler_->Update(/*overflow=*/true));
    r.grad_norm = std::numeric_limits<double>::infinity();
  } else {
    r.grad_norm = std::sqrt(totals.grad_sum_sq) / loss_scale;
    if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss)) {
      return absl::AbortedError(absl::StrFormat(
          "step %d: loss %g, gradient norm %g are not finite (lower optimizer.lr or enable "
          "optimizer.grad_clip)",
          step_ + 1, r.loss, r.grad_norm));
    }
    const float clip = job_.optimizer().grad_clip();
    const float clip_scale =
        clip > 0 && r.grad_norm > clip ? static_cast<float>(clip / (r.grad_norm + 1e-6)) : 1.0f;
    // Stochastic rounding draws a new stream every step, reproducibly from the job's seed.
    const uint64_t rounding_seed = job_.train().seed() * 0x9E3779B97F4A7C15ull + step_;
    const float grad_scale_step = static_cast<float>(clip_scale / loss_scale);
    if (delayed) {
      ZT_RETURN_IF_ERROR(DelayedHostUpdate(
          {.lr = r.lr,
           .grad_scale = grad_scale_step,
           .seed = rounding_seed,
           .drain = DelayedUpdateDrains(step_ + 1, static_cast<StopKind>(totals.stop_request))},
          r));
    } else if (host_optimizer_) {
      const HostOptimizer::Stats before = host_optimizer_->stats();
      ZT_RETURN_IF_ERROR(host_optimizer_->Step(host_ctx_, engine_->param_views(),
                                               engine_->grad_views(), r.lr, grad_scale_step,
                                               rounding_seed));
      const HostOptimizer::Stats& after = host_optimizer_->stats();
      r.offload_bytes_to_host = after.bytes_to_host - before.bytes_to_host;
      r.offload_bytes_to_device = after.bytes_to_device - before.bytes_to_device;
      r.offload_to_host_s = after.seconds_to_host - before.seconds_to_host;
      r.offload_to_device_s = after.seconds_to_device - before.seconds_to_device;
      r.host_optimizer_s = after.seconds_update - before.seconds_update;
    } else if (nvme_optimizer_) {
      const NvmeOptimizer::Stats before = nvme_optimizer_->stats();
      ZT_RETURN_IF_ERROR(nvme_optimizer_->Step(host_ctx_, engine_->param_views(),
                                               engine_->grad_views(), r.lr, grad_scale_step,
                                               rounding_seed));
      const NvmeOptimizer::Stats after = nvme_optimizer_->stats();
      r.offload_bytes_to_host = after.bytes_to_host - before.bytes_to_host;
      r.offload_bytes_to_device = after.bytes_to_device - before.bytes_to_device;
      r.offload_to_host_s = after.seconds_to_host - before.seconds_to_host;
      r.offload_to_device_s = after.seconds_to_device - before.seconds_to_device;
      r.host_optimizer_s = after.seconds_update - before.seconds_update;
    } else {
      ZT_RETURN_IF_ERROR(optimizer_->Step(ctx_, engine_->param_views(), engine_->grad_views(), r.lr,
                                          grad_scale_step, rounding_seed));
    }
    // The delayed update gathers the parameters when it uploads them.
    if (!delayed) ZT_RETURN_IF_ERROR(engine_->FinishStep(ctx_));
    if (loss_scaler_) ZT_RETURN_IF_ERROR(loss_scaler_->Update(/*overflow=*/false));
  }
  if (grad_downloads_) {
    // A skipped step's copies finish before the next backward writes the gradients again.
    ZT_RETURN_IF_ERROR(grad_downloads_->Drain());
    if (delayed) {
      r.offload_bytes_to_host += grad_downloads_->stats().bytes - downloads_before.bytes;
    }
    // The gradients' copies ran beside the backward: their seconds, outside optimizer_s.
    r.offload_to_host_s +=
        grad_downloads_->stats().copy_seconds - downloads_before.copy_seconds;
  }
  if (nvme_optimizer_) {
    const NvmeOptimizer::Stats after = nvme_optimizer_->stats();
    r.swap_bytes_in = after.swap_bytes_in - swap_before.swap_bytes_in;
    r.swap_bytes_out = after.swap_bytes_out - swap_before.swap_bytes_out;
    r.swap_in_s = after.swap_seconds_in - swap_before.swap_seconds_in;
    r.swap_out_s = after.swap_seconds_out - swap_before.swap_seconds_out;
  }
  if (swapped_base_) {
    // The gathers' reads of the frozen base (written once: nothing goes out in a step).
    const SwappedBase::Stats after = swapped_base_->stats();
    r.swap_bytes_in += after.swap_bytes_in - base_before.swap_bytes_in;
    r.swap_in_s += after.swap_seconds_in - base_before.swap_seconds_in;
  }
  // The parameter shards' uploads into the gathers (offload.params): every pass of the step
  // has ended, so every upload it started has been waited for and counted.
  const ParamUploads uploads_after = ParamUploadsOf(*engine_);
  r.param_upload_bytes = uploads_after.bytes - uploads_before.bytes;
  r.param_upload_s = uploads_after.seconds - uploads_before.seconds;
  r.param_uploads_ahead = uploads_after.ahead - uploads_before.ahead;
  r.param_uploads_at_gather = uploads_after.at_gather - uploads_before.at_gather;
  if (loss_scaler_) r.skipped = loss_scaler_->skipped_steps();
  ++step_;
  r.step = step_;
  const auto end = Clock::now();
  const double seconds = std::chrono::duration<double>(end - start).count();
  r.step_ms = seconds * 1e3;
  r.tokens_per_s = static_cast<double>(ranks * accum * tokens_per_micro) / seconds;
  r.comm_wait_s = engine_->waited_seconds() - waited_before;
  // The optimizer's part holds the all-gather FinishStep waits for: that wait is counted in
  // comm_wait_s, so it is taken out here and the parts still add up to the step.
  const double optimizer_span = std::chrono::duration<double>(end - optimizer_start).count();
  const double waited_in_optimizer = engine_->waited_seconds() - waited_in_step_before_optimizer;
  r.data_wait_s = data_wait_s;
  r.pipeline_bubble = pipeline_bubble;
  r.pipeline_busy_s = pipeline_timing.busy_s;
  r.pipeline_span_s = pipeline_timing.span_s;
  r.optimizer_s = std::max(0.0, optimizer_span - waited_in_optimizer);
  r.compute_s = std::max(0.0, seconds - r.data_wait_s - r.optimizer_s - r.comm_wait_s);
  const CommStats comm_after = comm_stats();
  for (int k = 0; k < kNumCommKinds; ++k) {
    r.comm_bytes += comm_after.by_kind[k].bytes_sent - comm_before.by_kind[k].bytes_sent;
    r.comm_s += comm_after.by_kind[k].seconds - comm_before.by_kind[k].seconds;
  }
  return r;
}

absl::Status Trainer::RunPipelineSchedule(float grad_scale, double* data_wait_s,
                                          PipelineTiming* timing) {
  Transformer& m = *model_;
  const auto schedule_start = Clock::now();
  double busy_s = 0;  // this stage's forwards and backwards
  const int64_t accum = job_.train().grad_accum_steps();
  const int64_t ranks = data_size_;
  const int v = m.chunks();
  // Sends in flight, per chunk and micro-batch slot: a slot's activations (and its gradient's
  // host copy) stay untouched until the send of the slot's previous micro-batch is done.
  std::vector<std::vector<std::optional<CommHandle>>> activation_sends(v), gradient_sends(v);
  for (int c = 0; c < v; ++c) {
    activation_sends[c].resize(m.in_flight(c));
    gradient_sends[c].resize(m.in_flight(c));
  }
  auto wait = [&](std::optional<CommHandle>& h) -> absl::Status {
    if (!h) return absl::OkStatus();
    absl::Status s = h->Wait();
    h.reset();
    return s;
  };
  const Transformer::LossOptions options{.write_grad = true,
                                         .grad_scale = grad_scale,
                                         .loss_sum = engine_->loss_accumulator(),
                                         .loss_divisor = static_cast<double>(accum)};
  const int virtual_stages =
      job_.parallel().pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED ? v : 1;
  const std::vector<PipelineOp> ops =
      PipelineStageOps(job_.parallel().pipeline_schedule(), pipeline_size_, pipeline_stage_,
                       static_cast<int>(accum), virtual_stages);
  // A ZeRO-3 stage that reshards after each forward gathers its units per use, prefetched in
  // this order across the ops.
  ZT_RETURN_IF_ERROR(engine_->BeginStagePass(ops, /*training=*/true));
  absl::Cleanup end_pass = [&] { engine_->EndStagePass().IgnoreError(); };
  for (const PipelineOp& op : ops) {
    const int k = op.micro_batch, c = op.chunk, slot = k % m.in_flight(c);
    const std::string label = absl::StrCat("chunk ", c, " micro-batch ", k,
                                           op.forward ? " forward" : " backward");
    ZT_RETURN_IF_ERROR(m.SelectMicroBatch(c, slot));
    const bool first = m.chunk_is_first(), last = m.chunk_is_last();
    if (m.layout().lora) {
      // The adapters' dropout masks of micro-batch k: the seed one rank draws for the same
      // global micro-batch (TrainStep), set again before its backward re-applies them.
      m.SetLoraDropoutSeed(job_.train().seed() * 0x9E3779B97F4A7C15ull +
                           static_cast<uint64_t>((step_ * accum + k) * ranks + data_rank_));
    }
    if (first || last) {
      const auto fill_start = Clock::now();
      // The model's first chunk's embedding reads the tokens in its forward and backward, the
      // last chunk's loss the targets.
      ZT_ASSIGN_OR_RETURN(const int64_t counted,
                          UploadBatch(*train_batches_, (step_ * accum + k) * ranks + data_rank_));
      if (counted != m.batch() * m.seq_len()) {
        // The schedule's gradient scale assumes every target counts.
        return absl::UnimplementedError(
            "data.train: document shards (masked prompts or padding, from zt prepare --format "
            "jsonl) do not train with parallel.pipeline_parallel > 1 yet; use plain token shards "
            "or pipeline_parallel 1");
      }
      *data_wait_s += std::chrono::duration<double>(Clock::now() - fill_start).count();
    }
    if (op.forward) {
      // The slot's output of an older micro-batch may still be on its way.
      ZT_RETURN_IF_ERROR(wait(activation_sends[c][slot]));
      if (!first) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.activations_in->Recv(m.stage_input(), 0, label));
        ZT_RETURN_IF_ERROR(h.Wait());
      }
      const auto compute_start = Clock::now();
      ZT_RETURN_IF_ERROR(m.StageForward(ctx_, options));
      busy_s += std::chrono::duration<double>(Clock::now() - compute_start).count();
      if (!last) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.activations_out->Send(m.stage_output(), 1, label));
        activation_sends[c][slot] = h;
      }
    } else {
      if (!last) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.gradients_in->Recv(m.residual_grad(), 1, label));
        ZT_RETURN_IF_ERROR(h.Wait());
      }
      const auto compute_start = Clock::now();
      ZT_RETURN_IF_ERROR(m.StageBackward(ctx_));
      busy_s += std::chrono::duration<double>(Clock::now() - compute_start).count();
      if (!first) {
        ZT_RETURN_IF_ERROR(wait(gradient_sends[c][slot]));
        // The slot's planned copy (in the compute dtype, as the activations are): the next
        // backward overwrites the residual gradient while this send goes.
        const Tensor buffer = pipeline_grad_sends_[c].Slice(slot, slot + 1).Reshape(
            {m.residual_grad().numel()});
        ZT_RETURN_IF_ERROR(Cast(ctx_, m.residual_grad(), buffer));
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.gradients_out->Send(buffer, 0, label));
        gradient_sends[c][slot] = h;
      }
    }
  }
  std::move(end_pass).Cancel();
  ZT_RETURN_IF_ERROR(engine_->EndStagePass());
  for (int c = 0; c < v; ++c) {
    for (int s = 0; s < m.in_flight(c); ++s) {
      ZT_RETURN_IF_ERROR(wait(activation_sends[c][s]));
      ZT_RETURN_IF_ERROR(wait(gradient_sends[c][s]));
    }
  }
  timing->busy_s = busy_s;
  timing->span_s = std::chrono::duration<double>(Clock::now() - schedule_start).count();
  // The tied embedding's two copies (wte on the first stage, the head's copy on the last) get
  // the sum of their gradients in the reduction. (A LoRA job's embedding and head are frozen:
  // the copies have no gradient and stay equal.)
  return engine_->ReduceStageGradients(
      ctx_, comms_.tied && !m.layout().lora ? comms_.tied.get() : nullptr);
}

absl::Status Trainer::RunPipelineEvaluation(int64_t n, int64_t total_counted) {
  Transformer& m = *model_;
  // A ZeRO-3 stage reads its units gathered again (the optimizer stepped the shards since):
  // whole for the pass, or per use in the order below with reshard_after_forward.
  ZT_RETURN_IF_ERROR(engine_->GatherStageUnits());
  const int v = m.chunks();
  std::vector<PipelineOp> ops;
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < v; ++c) {
      ops.push_back({.forward = true, .micro_batch = static_cast<int>(k), .chunk = c});
    }
  }
  ZT_RETURN_IF_ERROR(engine_->BeginStagePass(ops, /*training=*/false));
  absl::Cleanup end_pass = [&] { engine_->EndStagePass().IgnoreError(); };
  // As in the training schedule: a slot's output stays untouched until its send is done.
  std::vector<std::vector<std::optional<CommHandle>>> sends(v);
  for (int c = 0; c < v; ++c) sends[c].resize(m.in_flight(c));
  auto wait = [](std::optional<CommHandle>& h) -> absl::Status {
    if (!h) return absl::OkStatus();
    absl::Status s = h->Wait();
    h.reset();
    return s;
  };
  // Micro-batch by micro-batch through the stage's chunks in model order: every link carries
  // its activations in the order its receiver asks for them (under INTERLEAVED too: the first
  // stage's chunk c + 1 waits for the last stage's chunk c of the same micro-batch), and the
  // sends leave while the stage goes on, so the stages overlap as GPipe's forwards do.
  for (int64_t k = 0; k < n; ++k) {
    for (int c = 0; c < v; ++c) {
      const int slot = static_cast<int>(k % m.in_flight(c));
      const std::string label = absl::StrCat("evaluation chunk ", c, " micro-batch ", k);
      ZT_RETURN_IF_ERROR(m.SelectMicroBatch(c, slot));
      int64_t counted = 0;  // the last chunk's loss weighs by it (Evaluate)
      if (m.chunk_is_first() || m.chunk_is_last()) {
        ZT_ASSIGN_OR_RETURN(counted, UploadBatch(*val_batches_, k * data_size_ + data_rank_));
      }
      ZT_RETURN_IF_ERROR(wait(sends[c][slot]));
      if (!m.chunk_is_first()) {
        ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.activations_in->Recv(m.stage_input(), 0, label));
        ZT_RETURN_IF_ERROR(h.Wait());
      }
      ZT_RETURN_IF_ERROR(m.StageForward(
          ctx_, {.loss_sum = engine_->loss_accumulator(),
                 .loss_divisor = EvaluationLossDivisor(total_counted, counted, data_size_)}));
      if (!m.chunk_is_last()) {
        ZT_ASSIGN_OR_RETURN(sends[c][slot],
                            comms_.activations_out->Send(m.stage_output(), 1, label));
      }
    }
  }
  std::move(end_pass).Cancel();
  ZT_RETURN_IF_ERROR(engine_->EndStagePass());
  for (auto& chunk : sends) {
    for (std::optional<CommHandle>& h : chunk) ZT_RETURN_IF_ERROR(wait(h));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::PipelineBubble(const PipelineTiming& timing) {
  // Every stage's (busy, span), gathered over the pipeline group: the schedule's wall time is
  // the slowest stage's span (they start together: the previous step ended in collectives),
  // and the bubble is the share of p × that time no stage computed in.
  // The rank's pair goes up into the plan's buffer, the stages' come back down after it.
  const float mine[2] = {static_cast<float>(timing.busy_s), static_cast<float>(timing.span_s)};
  const int64_t n = 2 * int64_t{pipeline_size_};
  const Tensor own = pipeline_bubble_.Slice(0, 2), gathered = pipeline_bubble_.Slice(2, 2 + n);
  ZT_RETURN_IF_ERROR(device_->Upload(own, mine));
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.pipeline->AllGather(own, gathered, "pipeline bubble"));
  ZT_RETURN_IF_ERROR(h.Wait());
  std::vector<float> all(static_cast<size_t>(n));
  ZT_RETURN_IF_ERROR(device_->Download(all.data(), gathered));
  double busy = 0, span = 0;
  for (int s = 0; s < pipeline_size_; ++s) {
    busy += all[2 * s];
    span = std::max(span, double{all[2 * s + 1]});
  }
  if (span <= 0) return 0.0;
  return std::clamp(1.0 - busy / (pipeline_size_ * span), 0.0, 1.0);
}

absl::StatusOr<double> Trainer::Evaluate() {
  if (!val_batches_) return absl::FailedPreconditionError("no data.val to evaluate on");
  ZT_RETURN_IF_ERROR(FinishDelayedUpdate());  // evaluate the updated weights
  const int64_t ranks = data_size_;
  const int64_t n = job_.train().eval_steps();
  // The validation loss is the mean over every target the n · ranks micro-batches count, as
  // the step's loss is (Step): a packed or padded micro-batch with few counted targets weighs
  // by its targets, not as much as a full one (EvaluationLossDivisor). Every rank works the
  // total out alone from the document plan.
  int64_t total = 0;
  for (int64_t k = 0; k < n * ranks; ++k) {
    ZT_ASSIGN_OR_RETURN(const int64_t counted, val_batches_->CountedTargets(k));
    total += counted;
  }
  ZT_RETURN_IF_ERROR(engine_->BeginStatistics(ctx_));
  if (model_->pipelined()) {
    ZT_RETURN_IF_ERROR(RunPipelineEvaluation(n, total));
  }
  for (int64_t k = 0; k < n && !model_->pipelined(); ++k) {
    ZT_ASSIGN_OR_RETURN(const int64_t counted, UploadBatch(*val_batches_, k * ranks + data_rank_));
    ZT_RETURN_IF_ERROR(engine_->ForwardLoss(
        ctx_, {.loss_sum = engine_->loss_accumulator(),
               .loss_divisor = EvaluationLossDivisor(total, counted, ranks)}));
  }
  ZT_ASSIGN_OR_RETURN(StepTotals totals, ReadStatistics(/*stop_request=*/0, /*loss_divisor=*/1.0));
  return totals.loss_sum / static_cast<double>(ranks);
}

absl::StatusOr<int64_t> Trainer::UploadBatch(MicroBatches& batches, int64_t k) {
  ZT_ASSIGN_OR_RETURN(const int64_t counted, batches.Fill(k, host_tokens_, host_targets_));
  model_->SetDocuments(batches.doc_starts(), batches.positions());
  ZT_RETURN_IF_ERROR(device_->Upload(model_->tokens(), host_tokens_));
  ZT_RETURN_IF_ERROR(device_->Upload(model_->targets(), host_targets_));
  return counted;
}

absl::StatusOr<StepTotals> Trainer::ReadStatistics(int stop_request, double loss_divisor) {
  // The stop slot was zeroed with the others: only a request crosses.
  if (stop_request != 0) {
    *host_stop_ = static_cast<float>(stop_request);
    ZT_RETURN_IF_ERROR(device_->Upload(engine_->stop_slot(), host_stop_));
  }
  ZT_RETURN_IF_ERROR(engine_->ExchangeStatistics());
  if (pipeline_size_ <= 1) {
    // The step's one wait: every rank's statistics, in one read.
    ZT_RETURN_IF_ERROR(device_->Download(host_scalars_, engine_->scalars()));
    return engine_->Totals(host_scalars_, loss_divisor);
  }
  // Every stage's statistics, gathered on the device and read in one: the loss comes from the
  // last stage (the others add none), the squared gradients of each stage's units add up, any
  // overflow or stop request counts.
  const int64_t n = engine_->scalars().numel();
  const Tensor gathered = pipeline_scalars_gathered_.Slice(0, n * pipeline_size_);
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.pipeline->AllGather(engine_->scalars(), gathered,
                                                               "pipeline statistics"));
  ZT_RETURN_IF_ERROR(h.Wait());
  ZT_RETURN_IF_ERROR(device_->Download(pipeline_scalars_.data(), gathered));
  StepTotals all;
  for (int s = 0; s < pipeline_size_; ++s) {
    const StepTotals t = engine_->Totals(pipeline_scalars_.data() + s * n, loss_divisor);
    all.loss_sum += t.loss_sum;
    all.grad_sum_sq += t.grad_sum_sq;
    all.nonfinite = all.nonfinite || t.nonfinite;
    all.stop_request = std::max(all.stop_request, t.stop_request);
  }
  return all;
}

absl::Status Trainer::AppendMetrics(const StepRecord& r) {
  if (metrics_path_.empty()) return absl::OkStatus();
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"lr", r.lr},
                         {"grad_norm", r.grad_norm},
                         {"tokens_per_s", r.tokens_per_s},
                         {"step_ms", r.step_ms}};
  line["loss_scale"] = r.loss_scale;
  line["skipped"] = r.skipped;
  line["comm_bytes"] = r.comm_bytes;
  line["comm_s"] = r.comm_s;
  line["comm_wait_s"] = r.comm_wait_s;
  line["data_wait_s"] = r.data_wait_s;
  line["optimizer_s"] = r.optimizer_s;
  line["compute_s"] = r.compute_s;
  if (r.pipeline_bubble) {
    line["pipeline_bubble"] = *r.pipeline_bubble;
    line["pipeline_busy_s"] = r.pipeline_busy_s;
    line["pipeline_span_s"] = r.pipeline_span_s;
  }
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (nvme_optimizer_ || swapped_base_) {
    line["swap_bytes_in"] = r.swap_bytes_in;
    line["swap_bytes_out"] = r.swap_bytes_out;
    line["swap_in_s"] = r.swap_in_s;
    line["swap_out_s"] = r.swap_out_s;
  }
  line["param_upload_bytes"] = r.param_upload_bytes;
  line["param_upload_s"] = r.param_upload_s;
  line["param_uploads_ahead"] = r.param_uploads_ahead;
  line["param_uploads_at_gather"] = r.param_uploads_at_gather;
  if (host_optimizer_ || nvme_optimizer_) {
    line["offload_bytes_to_host"] = r.offload_bytes_to_host;
    line["offload_bytes_to_device"] = r.offload_bytes_to_device;
    line["offload_to_host_s"] = r.offload_to_host_s;
    line["offload_to_device_s"] = r.offload_to_device_s;
    line["host_optimizer_s"] = r.host_optimizer_s;
  }
  std::FILE* f = std::fopen(metrics_path_.c_str(), "a");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot append to '", metrics_path_, "': ", std::strerror(errno)));
  }
  const std::string text = line.dump() + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) {
    return absl::UnavailableError(absl::StrCat("write to '", metrics_path_, "' failed"));
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
      ZT_ASSIGN_OR_RETURN(double v, Evaluate());
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
  return checkpoint_writer_ ? SaveOutcome(checkpoint_writer_->Finish(), last_save_final_)
                            : absl::OkStatus();
}

}  // namespace zt
