#include "worker/shard/sharding_engine.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <future>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/status_macros.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/plan/lora_plan.h"

namespace zt {
namespace {

// Elements [begin, begin + n) of a flat buffer.
Tensor Flat(const Tensor& t, int64_t begin, int64_t n) { return t.Slice(begin, begin + n); }

using Clock = std::chrono::steady_clock;

// Waits for every handle; adds the time blocked to `*waited`.
absl::Status WaitAll(std::vector<CommHandle>& handles, double* waited) {
  const auto start = Clock::now();
  absl::Status first;
  for (CommHandle& h : handles) {
    absl::Status s = h.Wait();
    if (first.ok()) first = s;
  }
  handles.clear();
  *waited += std::chrono::duration<double>(Clock::now() - start).count();
  return first;
}

// One host → device copy of an upload ahead (offload.params CPU): a shard into its slot.
struct Copy {
  void* device;
  const void* host;
  int64_t bytes;
};

// An upload thread's work: `copies` host → device after `mark`, in order, stopping at the
// first failure; the outcome (status, bytes, seconds) as ShardingEngine::UploadsAhead.
template <typename Outcome>
Outcome UploadInOrder(DeviceCopyEngine* engine, const DeviceCopyEngine::IssueMark& mark,
                      const std::vector<Copy>& copies) {
  Outcome done;
  const auto start = Clock::now();
  for (const Copy& c : copies) {
    done.status = engine->CopyToDevice(mark, c.device, c.host, c.bytes);
    if (!done.status.ok()) break;
    done.bytes += c.bytes;
  }
  done.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return done;
}

// Values travel through the f32 all-gather as raw bits: a double is two f32 slots.
double GetDouble(const float* slots) {
  double v;
  std::memcpy(&v, slots, sizeof v);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardingEngine>> ShardingEngine::Create(
    const zerotrain::JobSpec& job, const ParallelLayout& place, Transformer* model,
    const Arenas& arenas, ShardComms comms, DeviceCopyEngine* copies) {
  std::unique_ptr<ShardingEngine> e(new ShardingEngine());
  e->copies_ = copies;
  e->job_ = job;
  e->model_ = model;
  e->comms_ = comms;
  e->geometry_ = place.shard();
  e->stage_ = job.parallel().zero_stage();
  // A ZeRO-3 pipeline stage gathering per use reduces per use too (memory_plan.h).
  e->stage_grads_per_use_ = model->pipelined() && StageGradientsPerMicroBatch(job);
  e->accumulate_full_ =
      e->stage_ >= 2 && job.train().grad_accum_steps() > 1 && !e->stage_grads_per_use_;
  const ModelLayout& layout = model->layout();
  e->tied_ = layout.tied_embeddings;
  e->vocab_ = model->vocab_sharded();
  const ShardGeometry& g = e->geometry_;
  e->tp_size_ = place.tensor_size();
  e->tp_rank_ = place.coordinates().tensor;
  if (e->tp_size_ > 1) {
    if (comms.tensor == nullptr || comms.tensor->size() != e->tp_size_ ||
        comms.tensor->rank() != e->tp_rank_) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding engine: the tensor-parallel communicator must have ", e->tp_size_,
                       " ranks, this one ", e->tp_rank_));
    }
  }
  if (comms.world == nullptr || comms.world->size() != g.world_size ||
      comms.world->rank() != g.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding engine: the data-parallel (world) communicator must have ",
                     g.world_size, " ranks, this one ", g.rank));
  }
  if (comms.shard_group == nullptr || comms.shard_group->size() != g.group_size ||
      comms.shard_group->rank() != g.group_rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sharding engine: the shard-group communicator must have ", g.group_size,
                     " ranks (parallel.shard_group_size), this one ", g.group_rank()));
  }
  if ((g.groups() > 1) != (comms.replicas != nullptr) ||
      (comms.replicas != nullptr &&
       (comms.replicas->size() != g.groups() || comms.replicas->rank() != g.group()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharding engine: ", g.groups(), " shard groups need ",
        g.groups() > 1 ? "a replica communicator of that many ranks" : "no replica communicator"));
  }
  // A LoRA job's adapters stay whole on every rank at stage 3 too (the model reads them
  // whole): they are reduce-scattered, stepped and all-gathered as at stage 2, while the frozen
  // base's parameters are the sharded, gathered-per-use ones.
  e->gather_after_step_ = e->stage_ == 1 || e->stage_ == 2 || (e->stage_ == 3 && layout.lora);
  // The buffers the engine reduces, steps and gathers are each unit's trainable buffer: the
  // flat parameters, or a LoRA model's adapters (frozen units without adapters have none).
  e->trainable_layout_ = layout.lora ? LoraAdapterLayout(layout) : layout;
  const int n_units = static_cast<int>(layout.units.size());
  for (int u = 0; u < n_units; ++u) {
    const std::string name = layout.units[u].name + ".params";
    // Where the plan put the shards (MoveOffloadedStates): the same tier for every unit.
    ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, arenas.Spec(name));
    const bool swapped = spec->category == MemoryCategory::kNvme;
    const bool on_host = spec->category == MemoryCategory::kPinnedHost;
    if (u > 0 && (on_host != e->params_on_host_ || swapped != e->params_swapped_)) {
      return absl::InternalError(
          absl::StrCat("memory plan: ", name, " is not in the tier of the other units' params"));
    }
    e->params_on_host_ = on_host;
    e->params_swapped_ = swapped;
    if (swapped) {
      // The shard's shape without memory: the swap store holds its bytes.
      e->params_.push_back(Tensor(nullptr, spec->dtype, {spec->numel()}, Device{}));
    } else {
      ZT_ASSIGN_OR_RETURN(Tensor params, arenas.Get(name));
      e->params_.push_back(params);
    }
    e->param_shards_.push_back(ShardOfUnit(layout.units[u], g));
    e->trainable_index_.push_back(-1);
  }
  e->uploaded_ahead_.assign(n_units, nullptr);
  e->qbase_uploaded_ahead_.assign(n_units, nullptr);
  const char* param_suffix = layout.lora ? "" : ".params";
  const char* grad_suffix = layout.lora ? "_grads" : ".grads";
  const char* accum_suffix = layout.lora ? "_grad_accum" : ".grad_accum";
  for (int t = 0; t < static_cast<int>(e->trainable_layout_.units.size()); ++t) {
    const UnitLayout& unit = e->trainable_layout_.units[t];
    // The model unit it belongs to: the same name, or the name before ".lora".
    const std::string owner =
        layout.lora ? unit.name.substr(0, unit.name.size() - std::string(".lora").size())
                    : unit.name;
    for (int u = 0; u < n_units; ++u) {
      if (layout.units[u].name == owner) e->trainable_index_[u] = t;
    }
    // A LoRA unit's adapters shard flat; a trainable unit as its parameters do.
    const UnitShard shard = layout.lora ? ShardOf(unit.numel, g) : ShardOfUnit(unit, g);
    e->shards_.push_back(shard);
    // A whole model's trainable buffer is the unit's "<u>.params" (swapped ones included).
    Tensor params;
    if (layout.lora) {
      ZT_ASSIGN_OR_RETURN(params, arenas.Get(unit.name + param_suffix));
    } else {
      params = e->params_[t];
    }
    ZT_ASSIGN_OR_RETURN(Tensor grads, arenas.Get(unit.name + grad_suffix));
    e->trainable_params_.push_back(params);
    e->grads_.push_back(grads);
    if (e->accumulate_full_ && e->vocab_ && t == 0) {
      e->grad_accum_.push_back(Tensor());  // the shard accumulates the micro-batches itself
    } else if (e->accumulate_full_) {
      ZT_ASSIGN_OR_RETURN(Tensor acc, arenas.Get(unit.name + accum_suffix));
      e->grad_accum_.push_back(acc);
    }
    const int64_t owned = shard.owned.end - shard.owned.begin;
    switch (e->stage_) {
      case 0:
        e->ranges_.push_back({0, unit.numel});
        e->param_views_.push_back(Flat(params, 0, unit.numel));
        e->grad_views_.push_back(Flat(grads, 0, unit.numel));
        // The norm counts each element once per group: every member its shard's range.
        e->norm_views_.push_back(Flat(grads, shard.owned.begin, owned));
        break;
      case 1:
        e->ranges_.push_back(shard.owned);
        e->param_views_.push_back(Flat(params, shard.owned.begin, owned));
        e->grad_views_.push_back(Flat(grads, shard.owned.begin, owned));
        e->norm_views_.push_back(e->grad_views_.back());
        break;
      default:
        e->ranges_.push_back(shard.owned);
        // Stage 3 holds the rank's shard of the parameters, unless they are gathered after
        // the step (a LoRA job's adapters).
        e->param_views_.push_back(e->stage_ == 3 && !e->gather_after_step_
                                      ? Flat(params, 0, owned)
                                      : Flat(params, shard.owned.begin, owned));
        e->grad_views_.push_back(Flat(grads, 0, owned));
        e->norm_views_.push_back(e->grad_views_.back());
        break;
    }
  }
  const int n_trainable = static_cast<int>(e->shards_.size());
  // Where the last unit's elements stop counting in the norm: at a pipeline head stage's copy
  // of the tied wte, which the first stage counts.
  int64_t tied_copy_offset = -1;
  if (model->pipelined()) {
    // Stage 2, and stage 3 without reshard_after_forward: the stage's backward accumulates
    // every micro-batch into the full ".grad_accum" buffers (the model binds them),
    // reduce-scattered once after the schedule; stage 3 then gathers the stage's units whole
    // for the step (BeginStep: FSDP's reshard_after_forward false), so that each micro-batch's
    // forward and backward reads them without a gather per op.
    // With reshard_after_forward stage 3 gathers each unit per use instead (BeginStagePass),
    // and reduces per use as FSDP does: each micro-batch's gradient of a unit goes into one of
    // the two "grad.full" slots and is reduce-scattered at once into the rank's shard, which
    // accumulates the micro-batches (StageGradient / StageGradientDone). So does a stage at
    // stage 2, or 3 keeping its units gathered, with one micro-batch a step: its one backward
    // of each unit is the step's, reduce-scattered as it ends, as a ZeRO-2 rank off a pipeline
    // does (StageGradientsPerMicroBatch; the plan holds the slots, not "<u>.grad_accum").
    if (e->stage_ >= 2 && !e->accumulate_full_ && !e->stage_grads_per_use_) {
      return absl::InternalError(
          absl::StrCat("sharding engine: a pipeline stage at ZeRO stage ", e->stage_,
                       " neither accumulates its micro-batches nor reduces each one"));
    }
    // The head's copy of a tied wte is the same parameter as the first stage's: counted there.
    const UnitLayout& head = layout.units.back();
    const ParamSpec* copy = head.Find("lm_head.weight");
    // A LoRA stage's head is frozen (the copy with it): its trainable buffers are adapters.
    if (job.model().tie_embeddings() && copy != nullptr && n_trainable > 0 && !layout.lora) {
      tied_copy_offset = copy->offset;  // the copy is the head unit's last tensor
      const FlatRange& owned = e->shards_.back().owned;
      const int64_t end = std::min(owned.end, copy->offset);
      // At stage 2 the gradient buffer is the shard alone, starting at the range's begin.
      const int64_t base = e->stage_ >= 2 ? owned.begin : 0;
      if (end > owned.begin) {
        e->norm_views_.back() = Flat(e->grads_.back(), owned.begin - base, end - owned.begin);
      } else {
        e->norm_views_.pop_back();  // this rank's range is all copy
      }
    }
  }
  if (n_trainable == 0 && layout.lora && model->pipelined()) {
    // The adapters live in the blocks; a stage of the embedding or the head alone would step
    // nothing and its statistics would count nothing.
    return absl::UnimplementedError(
        "parallel.pipeline_parallel with model.lora: this pipeline stage holds no transformer "
        "block (the plan's partition gave it only the embedding or the head), so it has no "
        "adapters to train; use fewer stages or more model.n_layer");
  }
  if (n_trainable == 0) {
    return absl::InvalidArgumentError("sharding engine: the model has nothing to train");
  }
  if (e->tp_size_ > 1) {
    // Each element of the model once over the TP group (replicated tensors on TP rank 0).
    std::vector<Tensor> counted;
    for (int u = 0; u < n_trainable && layout.lora; ++u) {
      // A LoRA model's trainable units are adapters: a site's replicated matrix (a
      // column-parallel site's A, summed over the group; a row-parallel site's B, computed
      // alike on every rank) counts on TP rank 0, a replicated KV head's B rows on the head's
      // first rank, a split one on every rank (CountsLoraShareInNorm).
      const UnitLayout& adapters = e->trainable_layout_.units[u];
      const FlatRange norm = e->shards_[u].owned;
      const int64_t base = e->stage_ >= 2 ? norm.begin : 0;
      for (const ParamSpec& p : adapters.params) {
        const bool a = p.name.ends_with(".lora_A");
        const LoraSite* site = nullptr;
        for (const UnitLayout& unit : layout.units) {
          if (unit.name + ".lora" != adapters.name) continue;
          for (const LoraSite& s : unit.lora) {
            if (p.name == s.hf_path + (a ? ".lora_A" : ".lora_B")) site = &s;
          }
        }
        const bool counts = site == nullptr ? e->tp_rank_ == 0
                                            : CountsLoraShareInNorm(job.model(), *site, a,
                                                                    e->tp_size_, e->tp_rank_);
        if (!counts) continue;
        const int64_t lo = std::max(p.offset, norm.begin),
                      hi = std::min(p.offset + p.numel, norm.end);
        if (lo < hi) counted.push_back(Flat(e->grads_[u], lo - base, hi - lo));
      }
    }
    for (int u = 0; u < n_trainable && !layout.lora; ++u) {
      // As without tensor parallelism: each DP member counts its shard's range, which at
      // stages 2–3 is the whole of its gradient buffer (the shard starts at its offset 0).
      const FlatRange norm = e->shards_[u].owned;
      const int64_t base = e->stage_ >= 2 ? norm.begin : 0;
      const int64_t counted_end =
          u == n_trainable - 1 && tied_copy_offset >= 0 ? tied_copy_offset : norm.end;
      for (const auto& [begin, end] :
           NormCountedRanges(job.model(), layout.units[u], e->tp_size_, e->tp_rank_)) {
        const int64_t lo = std::max(begin, norm.begin), hi = std::min({end, norm.end, counted_end});
        if (lo < hi) counted.push_back(Flat(e->grads_[u], lo - base, hi - lo));
      }
    }
    e->norm_views_ = std::move(counted);
  }
  e->bucket_elements_ = job.parallel().bucket_bytes() / DTypeSize(e->grads_[0].dtype());
  e->pending_.resize(n_trainable);
  e->unit_grad_target_.resize(n_trainable);
  // A tied embedding's gradient has its own full buffer (the head writes into it too) only
  // where the embedding trains.
  e->tied_grad_ = e->tied_ && !e->vocab_ && e->trainable_index_[0] >= 0;
  e->slots_in_embedding_ = GradientSlotsInEmbeddingGather(job, layout);
  if (e->stage_ >= 2 && !e->accumulate_full_) {
    if (e->slots_in_embedding_) {
      // The slots are bytes of the embedding's gather buffer (memory_plan.h), handed out only
      // once the head's loss has released the embedding (GradTarget checks).
      int64_t numel = 0;
      for (int t = 1; t < n_trainable; ++t) numel = std::max(numel, e->shards_[t].padded);
      const DType dtype = e->grads_[0].dtype();
      const int64_t slot_bytes = numel * DTypeSize(dtype);
      ZT_ASSIGN_OR_RETURN(Tensor gathered, arenas.Get("gather.embedding"));
      if (gathered.size_bytes() < GradientSlotOffset(1, slot_bytes) + slot_bytes) {
        return absl::InternalError(absl::StrCat(
            "memory plan: gather.embedding has ", gathered.size_bytes(),
            " bytes, too few for the two gradient slots of ", slot_bytes, " bytes it holds"));
      }
      for (int k = 0; k < 2; ++k) {
        e->grad_full_.push_back(
            Tensor(static_cast<char*>(gathered.raw()) + GradientSlotOffset(k, slot_bytes), dtype,
                   {numel}, gathered.device()));
      }
    } else {
      for (int k = 0; k < 2; ++k) {
        ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(absl::StrCat("grad.full.", k)));
        e->grad_full_.push_back(t);
      }
    }
    e->slot_unit_ = {-1, -1};
    if (e->tied_grad_) {
      ZT_ASSIGN_OR_RETURN(e->grad_full_embedding_, arenas.Get("grad.full.embedding"));
    }
  }
  if (e->stage_ == 1) {
    for (int k = 0; k < 2; ++k) {
      ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(absl::StrCat("grad.shard.", k)));
      e->grad_shard_.push_back(t);
    }
  }
  if (GradientReduceElements(job, place) > 0) {
    ZT_ASSIGN_OR_RETURN(e->reduce_buffer_, arenas.Get("grad.reduce"));
  }
  ZT_ASSIGN_OR_RETURN(e->scalars_, arenas.Get("comm.scalars"));
  if (e->params_on_host_ || e->params_swapped_) {
    if (e->stage_ != 3) {
      return absl::InternalError(
          absl::StrCat("memory plan: the parameters are in host memory at "
                       "ZeRO stage ",
                       e->stage_, "; only stage 3 offloads them"));
    }
    if (copies == nullptr) {
      return absl::InvalidArgumentError(
          "sharding engine: the parameter shards are off the device (offload.params CPU or "
          "NVME) and no copy engine was given to upload them");
    }
  }

  // A stage reducing per micro-batch whose parameters do not go per use (ZeRO 2, or 3 keeping
  // its units gathered, with one micro-batch a step): the model's gradient hooks alone; its
  // units' parameters stay where the model has them (whole at 2, SetStageComputeParams' at 3).
  ShardingEngine* engine = e.get();
  auto set_stage_gradient_source = [engine, n_units] {
    engine->local_unit_.assign(engine->job_.model().n_layer() + 2, -1);
    for (int u = 0; u < n_units; ++u) engine->local_unit_[engine->model_->held_units()[u]] = u;
    engine->model_->SetStageUnitSource(
        {.gradient = [engine](const DeviceContext& ctx,
                              int unit) { return engine->StageGradient(ctx, unit); },
         .gradient_done = [engine](const DeviceContext& ctx,
                                   int unit) { return engine->StageGradientDone(ctx, unit); }});
  };
  if (e->stage_ == 3) {
    std::vector<std::string> names;
    for (const UnitLayout& u : layout.units) names.push_back(u.name);
    e->registry_ = std::make_unique<UnitRegistry>(std::move(names));
    const auto& parallel = job.parallel();
    std::vector<Tensor> pool, dedicated(n_units);
    if (parallel.reshard_after_forward()) {
      for (int k = 0; k <= parallel.prefetch_units(); ++k) {
        ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(absl::StrCat("gather.", k)));
        pool.push_back(t);
      }
      if (e->tied_ && !e->vocab_) {
        ZT_ASSIGN_OR_RETURN(dedicated[0], arenas.Get("gather.embedding"));
      }
    } else {
      for (int u = e->vocab_ ? 1 : 0; u < n_units; ++u) {
        ZT_ASSIGN_OR_RETURN(dedicated[u], arenas.Get(layout.units[u].name + ".gathered"));
      }
    }
    // The model's quantized shards are by whole-model unit (a pipeline stage's among them).
    for (int u = 0; u < n_units; ++u) {
      e->qbase_shards_.push_back(model->unit_quantized_shards()[model->held_units()[u]]);
    }
    e->qbase_unit_shards_.resize(n_units);
    e->qbase_pending_.resize(n_units);
    bool quantized = false;
    for (int u = 0; u < n_units; ++u) {
      // The plan's "<unit>.qbase" says which units have quantized bytes (a swapped one has no
      // view in the model).
      absl::StatusOr<const BufferSpec*> found = arenas.Spec(QuantizedShardName(layout.units[u]));
      if (!found.ok() || (*found)->numel() == 0) continue;
      const BufferSpec* spec = *found;
      quantized = true;
      e->qbase_unit_shards_[u] =
          ShardOf(QuantizedBytesOf(layout, layout.units[u]).words(), e->geometry_);
      // offload.params CPU and NVME move the quantized shards with the others.
      e->qbase_on_host_ = spec->category == MemoryCategory::kPinnedHost;
      e->qbase_swapped_ = spec->category == MemoryCategory::kNvme;
      if (e->qbase_on_host_ != e->params_on_host_ || e->qbase_swapped_ != e->params_swapped_) {
        return absl::InternalError(
            absl::StrCat("memory plan: ", spec->name, " is not in the tier of the units' params"));
      }
    }
    if (quantized) {
      // A pipeline stage gathers a block's quantized bytes with its parameters as one rank
      // does: per use into the pool's twins, or for the step into "<unit>.qbase.gathered"
      // (GatherStageUnits binds them).
      model->SetQuantizedShardRank(e->geometry_.group_rank());
      // Each parameter gather buffer has its quantized twin, found by the buffer's address.
      if (parallel.reshard_after_forward()) {
        for (int k = 0; k <= parallel.prefetch_units(); ++k) {
          ZT_ASSIGN_OR_RETURN(Tensor q, arenas.Get(absl::StrCat("qbase.gather.", k)));
          e->qbase_companion_.emplace_back(pool[k].raw(), q);
        }
      } else {
        for (int u = 0; u < n_units; ++u) {
          if (!e->HasQuantizedBase(u)) continue;
          ZT_ASSIGN_OR_RETURN(Tensor q,
                              arenas.Get(QuantizedShardName(layout.units[u]) + ".gathered"));
          e->qbase_companion_.emplace_back(dedicated[u].raw(), q);
        }
      }
    }
    ShardingEngine* self = e.get();
    if (model->pipelined() && parallel.reshard_after_forward()) {
      // The stage gathers each unit per use, in its schedule's order (BeginStagePass).
      e->stage_per_use_ = true;
      e->local_unit_.assign(job.model().n_layer() + 2, -1);
      for (int u = 0; u < n_units; ++u) e->local_unit_[model->held_units()[u]] = u;
      model->SetStageUnitSource(
          {.acquire = [self](int unit) { return self->AcquireStageUnit(unit); },
           .finish = [self](int) { return self->FinishUse(); },
           .gradient = [self](const DeviceContext& ctx,
                              int unit) { return self->StageGradient(ctx, unit); },
           .gradient_done = [self](const DeviceContext& ctx,
                                   int unit) { return self->StageGradientDone(ctx, unit); }});
    } else if (model->pipelined()) {
      // The stage computes from its units gathered whole for the step (BeginStep).
      e->stage_gathered_ = dedicated;
      ZT_RETURN_IF_ERROR(model->SetStageComputeParams(dedicated));
    }
    if (model->pipelined() && e->stage_grads_per_use_ && !e->stage_per_use_) {
      set_stage_gradient_source();
    }
    e->prefetch_ = std::make_unique<PrefetchCoordinator>(
        e->registry_.get(), std::move(pool), std::move(dedicated), parallel.prefetch_units(),
        [self](int u, const Tensor& full) { return self->GatherUnit(u, full); });
    if (e->params_on_host_ && (!model->pipelined() || e->stage_per_use_)) {
      // The later gathers' host shards go up a use before their gather (UploadAhead), into
      // the plan's staging slots: a pass's, or a pipeline stage's schedule's (BeginStagePass).
      for (int k = 0; k <= parallel.prefetch_units(); ++k) {
        ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(absl::StrCat("param_upload.", k)));
        e->upload_slots_.push_back(t);
        if (e->qbase_on_host_) {
          // A LoRA job's quantized base: the slot's unit's "<block>.qbase" shard beside it.
          ZT_ASSIGN_OR_RETURN(Tensor q, arenas.Get(absl::StrCat("qbase_upload.", k)));
          e->qbase_upload_slots_.push_back(q);
        }
      }
      e->upload_slot_unit_.assign(e->upload_slots_.size(), -1);
      e->upload_slot_taken_.assign(e->upload_slots_.size(), false);
      e->staged_slot_.assign(n_units, -1);
      e->staged_.resize(n_units);
      e->prefetch_->SetUploadAhead([self](int u) { self->UploadAhead(u); });
    }
  }
  if (model->pipelined() && e->stage_ == 2 && e->stage_grads_per_use_) {
    set_stage_gradient_source();
  }
  return e;
}

absl::StatusOr<Tensor> ShardingEngine::QuantizedCompanion(const Tensor& full) const {
  for (const auto& [address, q] : qbase_companion_) {
    if (address == full.raw()) return q;
  }
  return absl::InternalError("sharding engine: a gather buffer without its quantized twin");
}

absl::Status ShardingEngine::UploadIntoSlot(const Tensor& slot, const void* host) {
  const auto start = Clock::now();
  ZT_ASSIGN_OR_RETURN(const DeviceCopyEngine::IssueMark mark, copies_->MarkIssue());
  ZT_RETURN_IF_ERROR(copies_->CopyToDevice(mark, slot.raw(), host, slot.size_bytes()));
  param_upload_bytes_ += slot.size_bytes();
  param_upload_s_ += std::chrono::duration<double>(Clock::now() - start).count();
  return absl::OkStatus();
}

absl::StatusOr<CommHandle> ShardingEngine::GatherUnit(int u, const Tensor& full) {
  // u is a model unit (Label names trainable units).
  const UnitShard& s = param_shards_[u];
  const std::string label = absl::StrCat(model_->layout().units[u].name, " all-gather");
  // The host shard goes up into this rank's own slot of the gather buffer, after whatever
  // compute was issued before (the buffer's previous unit may still be read there), and the
  // all-gather fills the other slots around it: no staging beyond the buffer the plan holds.
  const Tensor slot = Flat(full, s.offset, s.shard_numel);
  // offload.params CPU: where the shard (and a quantized base's bytes) went up ahead, if it
  // did — at the pass's start into `slot` (UploadFirstGathersAhead), or into a staging slot a
  // use before this gather (UploadAhead).
  bool up_in_place = false;
  int staged = -1;
  bool quantized_at_gather = false;  // a quantized base's bytes went up here, on this thread
  if (params_on_host_) {
    ZT_RETURN_IF_ERROR(AwaitUploadsAhead());
    if (uploaded_ahead_[u] == slot.raw()) {
      // Its shard went up at the step's start or between micro-batches; the shard is final
      // until the pass ends, which drops the mark.
      uploaded_ahead_[u] = nullptr;
      up_in_place = true;
    } else if (!staged_slot_.empty() && staged_slot_[u] >= 0 && staged_[u].valid()) {
      // Its shard went up into a staging slot while the use before this gather's issue
      // computed (UploadAhead); the all-gather reads it there, and the slot stays taken until
      // the gather has been waited for.
      const UploadsAhead done = staged_[u].get();
      staged_[u] = {};
      param_upload_bytes_ += done.bytes;
      param_upload_s_ += done.seconds;
      if (!done.status.ok()) {
        upload_slot_unit_[staged_slot_[u]] = -1;
        staged_slot_[u] = -1;
        return absl::Status(
            done.status.code(),
            absl::StrCat("sharding engine: uploading ", model_->layout().units[u].name,
                         "'s host shard ahead of its gather: ", done.status.message()));
      }
      staged = staged_slot_[u];
      upload_slot_taken_[staged] = true;
      staged_slot_[u] = -1;
    }
  }
  if (HasQuantizedBase(u)) {
    // The block's quantized bytes first, into the twin of `full`; Acquire waits for it. A host
    // shard (offload.params CPU) went up ahead with the parameters' (into this rank's slot of
    // the twin, or the staging slot's twin) or goes up now into the slot; a swapped one (NVME)
    // from the read of it, as the parameters' below.
    const UnitShard& q = qbase_unit_shards_[u];
    ZT_ASSIGN_OR_RETURN(Tensor twin, QuantizedCompanion(full));
    Tensor source = qbase_swapped_ ? Tensor() : Flat(qbase_shards_[u], 0, q.shard_numel);
    if (qbase_on_host_ || qbase_swapped_) {
      const Tensor qslot = Flat(twin, q.offset, q.shard_numel);
      auto upload_quantized = [&](const void* host) { return UploadIntoSlot(qslot, host); };
      source = qslot;
      if (qbase_swapped_) {
        if (!swapped_.with_quantized) {
          return absl::FailedPreconditionError(absl::StrCat(
              "sharding engine: ", model_->layout().units[u].name,
              "'s quantized base shard is swapped (offload.params NVME) and no reader was set"));
        }
        ZT_RETURN_IF_ERROR(swapped_.with_quantized(u, upload_quantized));
      } else if (up_in_place && qbase_uploaded_ahead_[u] == qslot.raw()) {
        qbase_uploaded_ahead_[u] = nullptr;
      } else if (staged >= 0 && !qbase_upload_slots_.empty()) {
        source = Flat(qbase_upload_slots_[staged], 0, q.shard_numel);
      } else {
        ZT_RETURN_IF_ERROR(upload_quantized(qbase_shards_[u].raw()));
        quantized_at_gather = true;
      }
    }
    ZT_ASSIGN_OR_RETURN(CommHandle h,
                        comms_.shard_group->AllGather(source, Flat(twin, 0, q.padded),
                                                      absl::StrCat(model_->layout().units[u].name,
                                                                   " quantized base all-gather")));
    qbase_pending_[u].push_back(std::move(h));
  }
  if (!params_on_host_ && !params_swapped_) {
    return comms_.shard_group->AllGather(Flat(params_[u], 0, s.shard_numel),
                                         Flat(full, 0, s.padded), label);
  }
  auto upload = [&](const void* host) { return UploadIntoSlot(slot, host); };
  if (params_on_host_) {
    // A gather counts as ahead when every part of its shard went up before it.
    ++(quantized_at_gather || (!up_in_place && staged < 0) ? param_uploads_at_gather_
                                                           : param_uploads_ahead_);
    if (up_in_place) {
      return comms_.shard_group->AllGather(slot, Flat(full, 0, s.padded), label);
    }
    if (staged >= 0) {
      return comms_.shard_group->AllGather(Flat(upload_slots_[staged], 0, s.shard_numel),
                                           Flat(full, 0, s.padded), label);
    }
  }
  if (params_swapped_) {
    if (!swapped_.with_shard) {
      return absl::FailedPreconditionError(
          absl::StrCat("sharding engine: ", model_->layout().units[u].name,
                       "'s shard is swapped (offload.params NVME) and no reader was set"));
    }
    ZT_RETURN_IF_ERROR(swapped_.with_shard(u, upload));
  } else {
    ZT_RETURN_IF_ERROR(upload(params_[u].raw()));
  }
  return comms_.shard_group->AllGather(slot, Flat(full, 0, s.padded), label);
}

void ShardingEngine::SetSwappedParams(SwappedShards shards) {
  swapped_ = std::move(shards);
  if (prefetch_ != nullptr && swapped_.read_ahead) prefetch_->SetReadAhead(swapped_.read_ahead);
}

void ShardingEngine::ReadFirstGathersAhead() {
  if (stage_ != 3 || prefetch_ == nullptr) return;
  const int last = std::min(prefetch_->prefetch(), static_cast<int>(params_.size()) - 1);
  if (!stage_gathered_.empty()) {
    // A stage gathering its units whole for the step: their first reads run while BeginStep
    // zeroes the gradients (host shards go up at the gathers: there is nothing to stage into).
    ReadStageUnitsAhead(last);
    return;
  }
  if (model_->pipelined()) return;
  if (swapped_.read_ahead) {
    for (int u = 0; u <= last; ++u) swapped_.read_ahead(u);
    return;
  }
  std::vector<int> units;
  for (int u = 0; u <= last; ++u) units.push_back(u);
  UploadFirstGathersAhead(units);
}

void ShardingEngine::UploadFirstGathersAhead(const std::vector<int>& units) {
  if (!params_on_host_ || copies_ == nullptr) return;
  // Every pass ends by waiting for the uploads (EndPass), so some still pending means no pass
  // ran since they started, nor any optimizer step: they still stand for the next pass, whose
  // first gather waits for them and reports their error.
  if (uploads_ahead_.valid()) return;
  std::fill(uploaded_ahead_.begin(), uploaded_ahead_.end(), nullptr);
  std::fill(qbase_uploaded_ahead_.begin(), qbase_uploaded_ahead_.end(), nullptr);
  const std::vector<Tensor> buffers = prefetch_->FirstGatherBuffers(units);
  std::vector<Copy> copies;
  for (size_t i = 0; i < units.size(); ++i) {
    const int u = units[i];
    if (buffers[i].empty()) continue;
    const UnitShard& s = param_shards_[u];
    const Tensor slot = Flat(buffers[i], s.offset, s.shard_numel);
    copies.push_back({slot.raw(), params_[u].raw(), slot.size_bytes()});
    uploaded_ahead_[u] = slot.raw();
    if (qbase_on_host_ && HasQuantizedBase(u)) {
      // A quantized base's bytes go up with it, into this rank's slot of the buffer's twin.
      absl::StatusOr<Tensor> twin = QuantizedCompanion(buffers[i]);
      if (!twin.ok()) continue;  // the gather uploads them itself
      const UnitShard& q = qbase_unit_shards_[u];
      const Tensor qslot = Flat(*twin, q.offset, q.shard_numel);
      copies.push_back({qslot.raw(), qbase_shards_[u].raw(), qslot.size_bytes()});
      qbase_uploaded_ahead_[u] = qslot.raw();
    }
  }
  if (copies.empty()) return;
  // The mark on the compute thread: the uploads come after whatever was issued before (the
  // previous pass's reads of these buffers).
  absl::StatusOr<DeviceCopyEngine::IssueMark> mark = copies_->MarkIssue();
  if (!mark.ok()) {
    std::fill(uploaded_ahead_.begin(), uploaded_ahead_.end(), nullptr);
    std::fill(qbase_uploaded_ahead_.begin(), qbase_uploaded_ahead_.end(), nullptr);
    return;
  }
  uploads_ahead_ = std::async(
      std::launch::async, [engine = copies_, mark = *std::move(mark), copies = std::move(copies)] {
        return UploadInOrder<UploadsAhead>(engine, mark, copies);
      });
}

absl::Status ShardingEngine::AwaitUploadsAhead() {
  if (!uploads_ahead_.valid()) return absl::OkStatus();
  const UploadsAhead done = uploads_ahead_.get();
  param_upload_bytes_ += done.bytes;
  param_upload_s_ += done.seconds;
  if (!done.status.ok()) {
    std::fill(uploaded_ahead_.begin(), uploaded_ahead_.end(), nullptr);
    std::fill(qbase_uploaded_ahead_.begin(), qbase_uploaded_ahead_.end(), nullptr);
    return absl::Status(done.status.code(),
                        absl::StrCat("sharding engine: uploading the first gathers' host shards "
                                     "ahead: ",
                                     done.status.message()));
  }
  return absl::OkStatus();
}

void ShardingEngine::UploadAhead(int u) {
  // A pipeline stage that gathers its units whole for the step (GatherStageUnits) has no slots.
  if (upload_slots_.empty()) return;
  // A slot whose upload a gather took is free once that gather is no longer in flight: the
  // coordinator announces after waiting for the use's gather, so the k gathers still in flight
  // and this upload need k + 1 slots, as many as the plan holds.
  for (size_t k = 0; k < upload_slots_.size(); ++k) {
    const int w = upload_slot_unit_[k];
    if (w >= 0 && upload_slot_taken_[k] && registry_->state(w) != Residency::kGathering) {
      if (!qbase_pending_[w].empty()) {
        // A quantized base's all-gather reads the slot's twin too, and may still run: the use
        // being acquired waits for it next anyway (Acquire), so wait here, before the slot is
        // written again; an error stays taken for that Acquire (or the pass's end) to report.
        absl::Status waited = WaitAll(qbase_pending_[w], &waited_s_);
        if (!waited.ok()) {
          if (qbase_wait_error_.ok()) qbase_wait_error_ = std::move(waited);
          continue;
        }
      }
      upload_slot_unit_[k] = -1;
      upload_slot_taken_[k] = false;
    }
  }
  // Its shard is already up for its next gather. (A unit whose previous gather still reads
  // its slot — announced while an earlier use holds it — goes up into a second one.)
  if (staged_slot_[u] >= 0 || uploaded_ahead_[u] != nullptr) return;
  auto free = std::find(upload_slot_unit_.begin(), upload_slot_unit_.end(), -1);
  // No room: the gather uploads the shard itself.
  if (free == upload_slot_unit_.end()) return;
  // The mark on the compute thread: the copy comes after whatever was issued before it.
  absl::StatusOr<DeviceCopyEngine::IssueMark> mark = copies_->MarkIssue();
  if (!mark.ok()) return;  // the gather uploads itself, and meets the engine's error there
  const int slot = static_cast<int>(free - upload_slot_unit_.begin());
  const UnitShard& s = param_shards_[u];
  const Tensor staging = Flat(upload_slots_[slot], 0, s.shard_numel);
  std::vector<Copy> copies = {{staging.raw(), params_[u].raw(), staging.size_bytes()}};
  if (qbase_on_host_ && HasQuantizedBase(u)) {
    // A quantized base's bytes beside it, in the slot's twin (the gather reads both there).
    const UnitShard& q = qbase_unit_shards_[u];
    const Tensor qstaging = Flat(qbase_upload_slots_[slot], 0, q.shard_numel);
    copies.push_back({qstaging.raw(), qbase_shards_[u].raw(), qstaging.size_bytes()});
  }
  upload_slot_unit_[slot] = u;
  upload_slot_taken_[slot] = false;
  staged_slot_[u] = slot;
  // One upload thread at a time uses the copy engine (its contract): each waits for the one
  // started before it, so the copies run in the order the gathers will take them.
  staged_[u] = std::async(std::launch::async, [engine = copies_, mark = *std::move(mark),
                                               copies = std::move(copies), before = last_upload_] {
                 if (before.valid()) before.wait();
                 return UploadInOrder<UploadsAhead>(engine, mark, copies);
               }).share();
  last_upload_ = staged_[u];
}

absl::Status ShardingEngine::AwaitStagedUploads() {
  absl::Status first;
  for (size_t u = 0; u < staged_.size(); ++u) {
    if (staged_[u].valid()) {
      // Announced, and its gather never issued (the pass ended early on an error).
      const UploadsAhead done = staged_[u].get();
      param_upload_bytes_ += done.bytes;
      param_upload_s_ += done.seconds;
      if (first.ok()) first = done.status;
      staged_[u] = {};
    }
    staged_slot_[u] = -1;
  }
  std::fill(upload_slot_unit_.begin(), upload_slot_unit_.end(), -1);
  std::fill(upload_slot_taken_.begin(), upload_slot_taken_.end(), false);
  last_upload_ = {};
  return first;
}

std::string ShardingEngine::Label(int t, const char* what) const {
  return absl::StrCat(trainable_layout_.units[t].name, " ", what);
}

void ShardingEngine::ReadStageUnitsAhead(int last) {
  if (!swapped_.read_ahead) return;
  last = std::min(last, static_cast<int>(stage_gathered_.size()) - 1);
  // The reads are taken in unit order by GatherStageUnits, each once.
  while (stage_read_through_ < last) swapped_.read_ahead(++stage_read_through_);
}

absl::Status ShardingEngine::BeginStep(const DeviceContext& ctx) {
  ReadFirstGathersAhead();
  // A pipeline stage gathering its units whole gathers after the zeroing below, which its
  // first units' reads (just queued) overlap; nothing reads the gathered units before.
  absl::Status zeroed = ZeroStepGradients(ctx);
  if (!zeroed.ok()) {
    if (stage_read_through_ >= 0 && swapped_.drop_read_ahead) swapped_.drop_read_ahead();
    stage_read_through_ = -1;
    return zeroed;
  }
  return GatherStageUnits();
}

absl::Status ShardingEngine::ZeroStepGradients(const DeviceContext& ctx) {
  if (stage_ <= 1) {
    for (const Tensor& g : grads_) ZT_RETURN_IF_ERROR(Zero(ctx, g));
  } else if (accumulate_full_) {
    for (const Tensor& g : grad_accum_) {
      if (!g.empty()) ZT_RETURN_IF_ERROR(Zero(ctx, g));
    }
  } else if (stage_grads_per_use_) {
    // The shards accumulate the step's micro-batches (StageGradientDone).
    for (const Tensor& g : grads_) ZT_RETURN_IF_ERROR(Zero(ctx, g));
  }
  // A vocabulary-sharded embedding's gradient shard sums the step's micro-batches in place.
  if (vocab_ && stage_ >= 2 && !stage_grads_per_use_ && trainable_index_[0] >= 0) {
    ZT_RETURN_IF_ERROR(Zero(ctx, grads_[trainable_index_[0]]));
  }
  return absl::OkStatus();
}

absl::Status ShardingEngine::GatherStageUnits() {
  if (!stage_gathered_.empty()) {
    // A ZeRO-3 pipeline stage: every unit's shard (stepped by the last optimizer step, or
    // initialised or loaded) all-gathered into its whole buffer for this step's schedule.
    // GatherUnit takes each shard from wherever the plan keeps it (the device, or the pinned
    // host pool / swap store with offload.params).
    // Swapped shards (offload.params NVME) are read ahead of their gathers: the first
    // prefetch_units + 1 units' at the step's start (ReadFirstGathersAhead) or here (a
    // pipelined evaluation), each later one once the gather prefetch_units + 1 units before it
    // has taken its read (and freed its ring buffer), so it runs while the gathers between
    // upload and all-gather. A gather whose read found the ring full reads the shard itself.
    const int ahead = prefetch_->prefetch() + 1;
    ReadStageUnitsAhead(ahead - 1);
    // Reads no gather took (a gather failed) are waited for and their buffers freed.
    absl::Cleanup reads_done = [&] {
      if (stage_read_through_ >= 0 && swapped_.drop_read_ahead) swapped_.drop_read_ahead();
      stage_read_through_ = -1;
    };
    std::vector<CommHandle> handles;
    for (size_t u = 0; u < stage_gathered_.size(); ++u) {
      ZT_ASSIGN_OR_RETURN(CommHandle h, GatherUnit(static_cast<int>(u), stage_gathered_[u]));
      handles.push_back(std::move(h));
      ReadStageUnitsAhead(static_cast<int>(u) + ahead);
    }
    std::move(reads_done).Cancel();
    stage_read_through_ = -1;  // every read was taken
    ZT_RETURN_IF_ERROR(WaitAll(handles, &waited_s_));
    // A quantized base's blocks: their bytes gathered beside them, bound for the step.
    for (size_t u = 0; u < stage_gathered_.size(); ++u) {
      if (!HasQuantizedBase(static_cast<int>(u))) continue;
      ZT_RETURN_IF_ERROR(WaitAll(qbase_pending_[u], &waited_s_));
      ZT_ASSIGN_OR_RETURN(Tensor twin, QuantizedCompanion(stage_gathered_[u]));
      ZT_RETURN_IF_ERROR(model_->BindQuantizedBase(model_->held_units()[u], twin));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardingEngine::BeginStagePass(const std::vector<PipelineOp>& ops, bool training) {
  if (!stage_per_use_) return absl::OkStatus();
  const int head = job_.model().n_layer() + 1;
  std::vector<UnitUse> uses;
  for (const PipelineOp& op : ops) {
    const auto [first, last] = model_->ChunkUnits(op.chunk);
    if (op.forward) {
      for (int u = first; u < last; ++u) {
        uses.push_back({local_unit_[u], !(training && u == head)});
      }
    } else {
      for (int u = last - 1; u >= std::max(first, 1); --u) uses.push_back({local_unit_[u], true});
    }
  }
  stage_uses_ = uses;
  // The gathers the pass's first Acquire issues together (the distinct units of its first
  // prefetch_units + 1 uses; rules 4 and 5 never announce them) get their shards ahead, while
  // the stage waits for its first op's input: offload.params CPU uploads the host shards into
  // the buffers those gathers will take, NVME queues the shards' reads (the pass's first
  // Acquire then finds them read, as ReadFirstGathersAhead does off a pipeline). The shards
  // are final until the pass ends (the optimizer runs after; with the delayed update the
  // reads are the committed generation's, which the host step leaves whole).
  const int first_gathers = std::min<int>(prefetch_->prefetch() + 1, uses.size());
  std::vector<int> first;
  for (int i = 0; i < first_gathers; ++i) {
    if (std::find(first.begin(), first.end(), uses[i].unit) == first.end()) {
      first.push_back(uses[i].unit);
    }
  }
  if (swapped_.read_ahead) {
    // One read per gather, not per unit: a unit that one of these uses releases and the next
    // gathers again (the last stage's block at an interleaved schedule's start) reads twice,
    // and its gathers take the reads oldest first. A use of a unit still held gathers nothing.
    std::vector<int> held;
    for (int i = 0; i < first_gathers; ++i) {
      const int u = uses[i].unit;
      const auto it = std::find(held.begin(), held.end(), u);
      if (it == held.end()) swapped_.read_ahead(u);
      if (!uses[i].release_after && it == held.end()) held.push_back(u);
      if (uses[i].release_after && it != held.end()) held.erase(it);
    }
  } else {
    UploadFirstGathersAhead(first);
  }
  BeginPass(std::move(uses));
  return absl::OkStatus();
}

absl::Status ShardingEngine::EndStagePass() {
  if (!stage_per_use_) return absl::OkStatus();
  const bool complete = use_ == static_cast<int>(stage_uses_.size());
  stage_uses_.clear();
  ZT_RETURN_IF_ERROR(EndPass());
  if (!complete) {
    return absl::InternalError(
        "pipeline stage pass: the schedule ended before every planned use of its units");
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ShardingEngine::AcquireStageUnit(int whole_unit) {
  const int local = whole_unit >= 0 && whole_unit < static_cast<int>(local_unit_.size())
                        ? local_unit_[whole_unit]
                        : -1;
  if (use_ >= static_cast<int>(stage_uses_.size()) || stage_uses_[use_].unit != local) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pipeline stage pass: unit ", whole_unit, " used outside its place in the schedule (use ",
        use_, " of ", stage_uses_.size(), ")"));
  }
  return Acquire(local);
}

absl::StatusOr<Tensor> ShardingEngine::StageGradient(const DeviceContext& ctx, int whole_unit) {
  const int local = whole_unit >= 0 && whole_unit < static_cast<int>(local_unit_.size())
                        ? local_unit_[whole_unit]
                        : -1;
  if (local < 0) {
    return absl::InternalError(
        absl::StrCat("pipeline stage: a gradient of unit ", whole_unit, ", not the stage's"));
  }
  return GradTarget(ctx, local);
}

absl::Status ShardingEngine::StageGradientDone(const DeviceContext& ctx, int whole_unit) {
  const int local = local_unit_[whole_unit];
  const int t = trainable_index_[local];
  if (t < 0) return absl::OkStatus();  // frozen
  const Tensor& g = unit_grad_target_[t];
  // What ReduceStageGradients does to accumulated gradients, on this micro-batch's: replicated
  // KV heads' and sequence-parallel norms' partial gradients summed over the TP group first.
  const int head = job_.model().n_layer() + 1;
  if (whole_unit >= 1 && whole_unit < head) {
    ZT_RETURN_IF_ERROR(model_->ReduceReplicatedKvGrads(whole_unit - 1, g));
  }
  ZT_RETURN_IF_ERROR(model_->ReduceSequenceParallelNormGrads(whole_unit, g));
  // The shard accumulates: the micro-batches reduced before (this unit's last reduce-scatter,
  // done) join this rank's own range of the slot, which the reduce-scatter then sums with the
  // group's ranges into the shard. So the shard is Σ over micro-batches of the group's sum with
  // no second buffer of the shard's size.
  const UnitShard& s = shards_[t];
  ZT_RETURN_IF_ERROR(WaitAll(pending_[t], &waited_s_));
  ZT_RETURN_IF_ERROR(
      AddInPlace(ctx, Flat(g, s.offset, s.shard_numel), Flat(grads_[t], 0, s.shard_numel)));
  return ReduceGradients(ctx, comms_.shard_group, Flat(g, 0, s.padded),
                         Flat(grads_[t], 0, s.shard_numel), Label(t, "reduce-scatter"),
                         &pending_[t]);
}

absl::Status ShardingEngine::ReduceGradients(const DeviceContext& ctx, Communicator* comm,
                                             const Tensor& input, const Tensor& output,
                                             const std::string& label,
                                             std::vector<CommHandle>* pending) {
  const bool all_reduce = output.empty();
  // A group of one reduces nothing: nothing to convert (and the plan sized no buffer for it).
  if (reduce_buffer_.empty() || comm->size() == 1) {
    ZT_ASSIGN_OR_RETURN(CommHandle h,
                        all_reduce ? comm->AllReduce(input, ReduceOp::kSum, label)
                                   : comm->ReduceScatter(input, output, ReduceOp::kSum, label));
    pending->push_back(std::move(h));
    return absl::OkStatus();
  }
  const int64_t n = input.numel();
  const int64_t m = all_reduce ? 0 : output.numel();
  if (n + m > reduce_buffer_.numel()) {
    return absl::InternalError(absl::StrCat("memory plan: grad.reduce holds ",
                                            reduce_buffer_.numel(), " elements, too few for ",
                                            label, "'s ", n + m));
  }
  // The reduce-scatter's output is a second range: its input is scratch it must not alias.
  const Tensor in = Flat(reduce_buffer_, 0, n);
  const Tensor out = all_reduce ? in : Flat(reduce_buffer_, n, m);
  ZT_RETURN_IF_ERROR(Cast(ctx, input, in));
  ZT_ASSIGN_OR_RETURN(CommHandle h, all_reduce
                                        ? comm->AllReduce(in, ReduceOp::kSum, label)
                                        : comm->ReduceScatter(in, out, ReduceOp::kSum, label));
  std::vector<CommHandle> handles = {std::move(h)};
  ZT_RETURN_IF_ERROR(WaitAll(handles, &waited_s_));
  // An inf/nan (an fp16 overflow) survives both casts, and a sum beyond grad_dtype's range
  // becomes inf here: the step's finiteness check still sees it and skips the step.
  return Cast(ctx, out, all_reduce ? input : output);
}

absl::Status ShardingEngine::AllReduceTied(Communicator* tied, const Tensor& grads) {
  const int64_t n = grads.numel();
  const int64_t piece = TiedSumPieceElements(job_, n);
  std::vector<CommHandle> handles;
  for (int64_t begin = 0; begin < n; begin += piece) {
    ZT_ASSIGN_OR_RETURN(CommHandle h,
                        tied->AllReduce(grads.Slice(begin, std::min(n, begin + piece)),
                                        ReduceOp::kSum, "tied embedding gradient"));
    handles.push_back(std::move(h));
  }
  return WaitAll(handles, &waited_s_);
}

absl::Status ShardingEngine::SumTiedStageGradient(const DeviceContext& ctx, Communicator* tied) {
  // The stage's copy of the tied wte: the first stage's "wte" in its embedding, the last
  // stage's "lm_head.weight" in its head. Each rank holds only its shard of the unit's
  // reduced gradient, and the two units' shards cut the wte at different places, so the unit's
  // reduced gradient is gathered whole into a gradient slot (free after the schedule), its wte
  // part summed with the other stage's, and the rank's range taken back.
  const bool first = model_->is_first_stage();
  const int local = first ? 0 : static_cast<int>(model_->layout().units.size()) - 1;
  const int t = trainable_index_[local];
  if (t < 0) return absl::OkStatus();
  const UnitLayout& unit = model_->layout().units[local];  // the stage's units
  const ParamSpec* wte = unit.Find(first ? "wte" : "lm_head.weight");
  if (wte == nullptr) {
    return absl::InternalError(
        absl::StrCat("pipeline stage: ", unit.name, " holds no copy of the tied embedding"));
  }
  const UnitShard& s = shards_[t];
  for (int slot = 0; slot < 2; ++slot) {
    if (slot_unit_[slot] >= 0) ZT_RETURN_IF_ERROR(WaitAll(pending_[slot_unit_[slot]], &waited_s_));
  }
  ZT_RETURN_IF_ERROR(WaitAll(pending_[t], &waited_s_));
  const Tensor full = Flat(grad_full_[0], 0, s.padded);
  std::vector<CommHandle> handles;
  ZT_ASSIGN_OR_RETURN(CommHandle h,
                      comms_.shard_group->AllGather(Flat(grads_[t], 0, s.shard_numel), full,
                                                    Label(t, "tied gradient all-gather")));
  handles.push_back(std::move(h));
  ZT_RETURN_IF_ERROR(WaitAll(handles, &waited_s_));
  ZT_RETURN_IF_ERROR(AllReduceTied(tied, Flat(full, wte->offset, wte->numel)));
  return Cast(ctx, Flat(full, s.offset, s.shard_numel), Flat(grads_[t], 0, s.shard_numel));
}

absl::StatusOr<Tensor> ShardingEngine::Params(int u) const {
  if (stage_ < 3) return params_[u];
  if (registry_->state(u) != Residency::kGathered) {
    return absl::FailedPreconditionError(absl::StrCat("unit ", model_->layout().units[u].name,
                                                      " is ", ResidencyName(registry_->state(u)),
                                                      ", not gathered"));
  }
  return registry_->buffer(u);
}

absl::StatusOr<Tensor> ShardingEngine::GradTarget(const DeviceContext& ctx, int model_unit) {
  const int u = trainable_index_[model_unit];
  if (u < 0) return Tensor();  // frozen: no gradient
  if (stage_ <= 1) return grads_[u];
  // The lookup and the head add the rows this rank owns, of every rank's micro-batch.
  if (vocab_ && model_unit == 0) return grads_[u];
  if (accumulate_full_) return grad_accum_[u];
  const int64_t padded = shards_[u].padded;
  Tensor target;
  if (tied_grad_ && model_unit == 0) {
    target = Flat(grad_full_embedding_, 0, padded);
  } else {
    if (slots_in_embedding_ && registry_->state(0) != Residency::kSharded) {
      return absl::InternalError(absl::StrCat(
          "sharding engine: a gradient slot of ", model_->layout().units[model_unit].name,
          " was asked for while the embedding, whose gather buffer holds the slots, is ",
          ResidencyName(registry_->state(0))));
    }
    // Two slots alternate: the slot's previous unit must have finished its reduce-scatter
    // (it reads the slot) before this unit's backward overwrites it.
    const int slot = next_slot_;
    next_slot_ ^= 1;
    if (slot_unit_[slot] >= 0) ZT_RETURN_IF_ERROR(WaitAll(pending_[slot_unit_[slot]], &waited_s_));
    slot_unit_[slot] = u;
    target = Flat(grad_full_[slot], 0, padded);
  }
  // The padding is summed by the reduce-scatter too: it must hold zeros, not the last unit's.
  ZT_RETURN_IF_ERROR(Zero(ctx, target));
  unit_grad_target_[u] = target;
  return target;
}

absl::Status ShardingEngine::GradientReady(const DeviceContext& ctx, int model_unit) {
  const int u = trainable_index_[model_unit];
  if (u < 0) return absl::OkStatus();
  const UnitShard& s = shards_[u];
  if (vocab_ && model_unit == 0) {
    // Complete already: no reduce-scatter; the replicas, if any, sum it in FinishReductions.
    if (comms_.replicas == nullptr) GradientReduced(u);
    return absl::OkStatus();
  }
  if (stage_ == 0) {
    const Tensor& g = grads_[u];
    const int64_t n = g.numel();
    const int64_t piece = bucket_elements_ > 0 ? bucket_elements_ : n;
    for (int64_t begin = 0; begin < n; begin += piece) {
      ZT_RETURN_IF_ERROR(ReduceGradients(ctx, comms_.world,
                                         Flat(g, begin, std::min(piece, n - begin)), Tensor(),
                                         Label(u, "all-reduce"), &pending_[u]));
    }
  } else if (stage_ >= 2) {
    const Tensor source = accumulate_full_ ? grad_accum_[u] : unit_grad_target_[u];
    ZT_RETURN_IF_ERROR(ReduceGradients(ctx, comms_.shard_group, Flat(source, 0, s.padded),
                                       Flat(grads_[u], 0, s.shard_numel),
                                       Label(u, "reduce-scatter"), &pending_[u]));
  }
  // The shard is final once these finish, unless stage 1 or the replicas reduce it further.
  if (stage_ == 0 || (stage_ >= 2 && comms_.replicas == nullptr)) GradientReduced(u);
  return absl::OkStatus();
}

absl::Status ShardingEngine::ReduceAcrossReplicas(const DeviceContext& ctx, int u) {
  if (comms_.replicas == nullptr) return absl::OkStatus();
  const UnitShard& s = shards_[u];
  const Tensor shard =
      stage_ == 1 ? Flat(grads_[u], s.offset, s.shard_numel) : Flat(grads_[u], 0, s.shard_numel);
  return ReduceGradients(ctx, comms_.replicas, shard, Tensor(), Label(u, "replica all-reduce"),
                         &pending_[u]);
}

absl::Status ShardingEngine::FinishReductions(const DeviceContext& ctx) {
  const int n_units = static_cast<int>(shards_.size());  // trainable units
  if (stage_ == 1) {
    // Two reduce-scatters in flight; each result is copied into the rank's range of the full
    // gradient (the reduce-scatter used the rest of it as scratch).
    std::array<int, 2> in_flight = {-1, -1};
    auto complete = [&](int slot) -> absl::Status {
      const int u = in_flight[slot];
      if (u < 0) return absl::OkStatus();
      ZT_RETURN_IF_ERROR(WaitAll(pending_[u], &waited_s_));
      const UnitShard& s = shards_[u];
      // A copy on the device (Cast between equal dtypes), after the reduce-scatter's wait.
      ZT_RETURN_IF_ERROR(Cast(ctx, Flat(grad_shard_[slot], 0, s.shard_numel),
                              Flat(grads_[u], s.offset, s.shard_numel)));
      in_flight[slot] = -1;
      ZT_RETURN_IF_ERROR(ReduceAcrossReplicas(ctx, u));
      GradientReduced(u);
      return absl::OkStatus();
    };
    for (int u = n_units - 1, k = 0; u >= 0; --u, ++k) {
      const int slot = k % 2;
      ZT_RETURN_IF_ERROR(complete(slot));
      const UnitShard& s = shards_[u];
      ZT_RETURN_IF_ERROR(ReduceGradients(ctx, comms_.shard_group, Flat(grads_[u], 0, s.padded),
                                         Flat(grad_shard_[slot], 0, s.shard_numel),
                                         Label(u, "reduce-scatter"), &pending_[u]));
      in_flight[slot] = u;
    }
    for (int slot = 0; slot < 2; ++slot) ZT_RETURN_IF_ERROR(complete(slot));
  } else if (stage_ >= 2) {
    // Each shard is complete in its group once its reduce-scatter ends; then across groups.
    for (int u = n_units - 1; u >= 0; --u) {
      ZT_RETURN_IF_ERROR(WaitAll(pending_[u], &waited_s_));
      ZT_RETURN_IF_ERROR(ReduceAcrossReplicas(ctx, u));
      if (comms_.replicas != nullptr) GradientReduced(u);
    }
  }
  absl::Status first;
  for (int u = 0; u < n_units; ++u) {
    absl::Status s = WaitAll(pending_[u], &waited_s_);
    if (first.ok()) first = s;
  }
  if (!slot_unit_.empty()) slot_unit_ = {-1, -1};
  return first;
}

void ShardingEngine::BeginPass(std::vector<UnitUse> uses) {
  use_ = 0;
  if (stage_ == 3) prefetch_->Begin(std::move(uses));
}

absl::StatusOr<Tensor> ShardingEngine::Acquire(int u) {
  if (stage_ < 3) return params_[u];
  const auto start = Clock::now();
  absl::StatusOr<Tensor> p = prefetch_->Acquire(use_);
  waited_s_ += std::chrono::duration<double>(Clock::now() - start).count();
  if (!qbase_wait_error_.ok()) return std::exchange(qbase_wait_error_, absl::OkStatus());
  if (p.ok() && HasQuantizedBase(u)) {
    ZT_RETURN_IF_ERROR(WaitAll(qbase_pending_[u], &waited_s_));
    ZT_ASSIGN_OR_RETURN(Tensor twin, QuantizedCompanion(*p));
    ZT_RETURN_IF_ERROR(model_->BindQuantizedBase(model_->held_units()[u], twin));
  }
  return p;
}

absl::Status ShardingEngine::FinishUse() {
  if (stage_ < 3) return absl::OkStatus();
  return prefetch_->Finish(use_++);
}

absl::Status ShardingEngine::EndPass() {
  if (stage_ < 3) return absl::OkStatus();
  absl::Status s = prefetch_->End();
  if (s.ok()) s = qbase_wait_error_;
  qbase_wait_error_ = absl::OkStatus();
  for (std::vector<CommHandle>& q : qbase_pending_) {
    absl::Status waited = WaitAll(q, &waited_s_);
    if (s.ok()) s = waited;
  }
  if (swapped_.drop_read_ahead) swapped_.drop_read_ahead();
  // Uploads ahead that no gather of this pass took stand for nothing after it: the optimizer
  // may change the shards before the next pass.
  absl::Status uploads = AwaitUploadsAhead();
  if (s.ok()) s = uploads;
  std::fill(uploaded_ahead_.begin(), uploaded_ahead_.end(), nullptr);
  std::fill(qbase_uploaded_ahead_.begin(), qbase_uploaded_ahead_.end(), nullptr);
  // The pass's gathers have all been waited for (End): every staging slot is free.
  absl::Status staged = AwaitStagedUploads();
  if (s.ok()) s = staged;
  return s;
}

absl::StatusOr<Tensor> ShardingEngine::ForwardToHead(const DeviceContext& ctx) {
  Transformer& m = *model_;
  Tensor p;
  if (vocab_) {
    // The rank's rows of the embedding: its shard, never gathered.
    ZT_RETURN_IF_ERROR(m.EmbeddingForward(ctx, params_[0]));
  } else {
    ZT_ASSIGN_OR_RETURN(p, Acquire(0));
    ZT_RETURN_IF_ERROR(m.EmbeddingForward(ctx, p));
    ZT_RETURN_IF_ERROR(FinishUse());
  }
  for (int i = 0; i < m.layout().n_blocks(); ++i) {
    ZT_ASSIGN_OR_RETURN(p, Acquire(1 + i));
    ZT_RETURN_IF_ERROR(m.BlockForward(ctx, i, p));
    ZT_RETURN_IF_ERROR(FinishUse());
  }
  const int head = m.layout().n_blocks() + 1;
  ZT_ASSIGN_OR_RETURN(Tensor head_params, Acquire(head));
  ZT_RETURN_IF_ERROR(m.HeadForward(ctx, head_params));
  return head_params;
}

absl::Status ShardingEngine::ReduceStageGradients(const DeviceContext& ctx, Communicator* tied) {
  if (!model_->pipelined()) {
    return absl::FailedPreconditionError("ReduceStageGradients on a model that is not a stage");
  }
  if (stage_grads_per_use_) {
    // Every micro-batch's reduce-scatters were issued in the schedule (StageGradientDone):
    // what is left is the tied wte's sum of its two copies and the replicas.
    if (tied != nullptr) ZT_RETURN_IF_ERROR(SumTiedStageGradient(ctx, tied));
    for (int t = static_cast<int>(shards_.size()) - 1; t >= 0; --t) {
      if (comms_.replicas == nullptr) GradientReduced(t);
    }
    if (backward_ended_) backward_ended_();  // the stage's last backward was the schedule's
    return FinishReductions(ctx);
  }
  if (tied != nullptr) {
    // The tied embedding's two copies (wte on the first stage, the head's copy on the last)
    // get the sum of their accumulated gradients, as Megatron's embedding group all-reduce does.
    const bool first = model_->is_first_stage();
    const int local = first ? 0 : static_cast<int>(model_->layout().units.size()) - 1;
    const int t = trainable_index_[local];
    if (t >= 0) {
      const UnitLayout& unit = model_->layout().units[local];
      const ParamSpec& spec = *unit.Find(first ? "wte" : "lm_head.weight");
      const Tensor& grads = accumulate_full_ ? grad_accum_[t] : grads_[t];
      ZT_RETURN_IF_ERROR(AllReduceTied(tied, grads.Slice(spec.offset, spec.offset + spec.numel)));
    }
  }
  // Blocks' replicated KV heads (tensor parallelism, n_kv_head < tp) sum their partial
  // gradients over the ranks sharing each head first, as ForwardBackward does on a step's last
  // micro-batch: in the full buffers the schedule accumulated into.
  const int head = job_.model().n_layer() + 1;
  for (int u = static_cast<int>(model_->layout().units.size()) - 1; u >= 0; --u) {
    const int whole = model_->held_units()[u];
    const int t = trainable_index_[u];
    if (whole >= 1 && whole < head && t >= 0) {
      ZT_RETURN_IF_ERROR(model_->ReduceReplicatedKvGrads(
          whole - 1, accumulate_full_ ? grad_accum_[t] : grads_[t]));
    }
    // Sequence parallelism: the norms' partial gradients of the rank's token rows, summed.
    if (t >= 0) {
      ZT_RETURN_IF_ERROR(model_->ReduceSequenceParallelNormGrads(
          whole, accumulate_full_ ? grad_accum_[t] : grads_[t]));
    }
    ZT_RETURN_IF_ERROR(GradientReady(ctx, u));
  }
  // As ForwardBackward's last micro-batch: every reduction issued, none waited for.
  if (backward_ended_) backward_ended_();
  return FinishReductions(ctx);
}

absl::Status ShardingEngine::ForwardBackward(const DeviceContext& ctx,
                                             const Transformer::LossOptions& options, bool last) {
  Transformer& m = *model_;
  const int L = m.layout().n_blocks();
  const int head = L + 1;
  const bool reshard = job_.parallel().reshard_after_forward();
  // A tied embedding is kept gathered from its lookup to the head's loss (a use of its own,
  // after the head's forward), which releases it: the backward never reads its weights.
  // Split by rows over the shard group (vocab_) it is never gathered.
  std::vector<UnitUse> uses;
  if (!vocab_) uses.push_back({0, !tied_});
  for (int i = 0; i < L; ++i) uses.push_back({1 + i, reshard});
  uses.push_back({head, false});  // the backward starts with it
  if (tied_ && !vocab_) uses.push_back({0, true});
  for (int u = head; u >= 1; --u) uses.push_back({u, true});
  BeginPass(std::move(uses));
  // On any error, stop the gathers still writing into the pool before it is reused.
  absl::Cleanup end_pass = [&] { EndPass().IgnoreError(); };

  ZT_ASSIGN_OR_RETURN(Tensor head_params, ForwardToHead(ctx));
  Tensor head_grads, embedding_params, embedding_grads;
  if (vocab_) {
    // The head projects onto the rank's own rows and adds their gradient into its shard.
    ZT_RETURN_IF_ERROR(FinishUse());
    embedding_params = params_[0];
    ZT_ASSIGN_OR_RETURN(embedding_grads, GradTarget(ctx, 0));
  } else if (tied_) {
    // The head's use ends (it stays gathered for its backward); the embedding's begins. The
    // tied head's loss writes the embedding's gradient only, so the head's gradient slot is
    // taken after it, when the embedding's gather buffer may hold the slots.
    ZT_RETURN_IF_ERROR(FinishUse());
    ZT_ASSIGN_OR_RETURN(embedding_params, Acquire(0));
    ZT_ASSIGN_OR_RETURN(embedding_grads, GradTarget(ctx, 0));
  } else {
    ZT_ASSIGN_OR_RETURN(head_grads, GradTarget(ctx, head));
  }
  ZT_RETURN_IF_ERROR(
      m.HeadLoss(ctx, head_params, head_grads, embedding_params, embedding_grads, options));
  if (!vocab_) ZT_RETURN_IF_ERROR(FinishUse());
  if (tied_) {
    ZT_ASSIGN_OR_RETURN(head_grads, GradTarget(ctx, head));
  }

  ZT_ASSIGN_OR_RETURN(head_params, Acquire(head));
  ZT_RETURN_IF_ERROR(m.HeadBackward(ctx, head_params, head_grads));
  ZT_RETURN_IF_ERROR(FinishUse());
  if (last) ZT_RETURN_IF_ERROR(m.ReduceSequenceParallelNormGrads(head, head_grads));
  if (last) ZT_RETURN_IF_ERROR(GradientReady(ctx, head));
  for (int i = L - 1; i >= 0; --i) {
    ZT_ASSIGN_OR_RETURN(Tensor p, Acquire(1 + i));
    ZT_ASSIGN_OR_RETURN(Tensor g, GradTarget(ctx, 1 + i));
    ZT_RETURN_IF_ERROR(m.BlockBackward(ctx, i, p, g));
    ZT_RETURN_IF_ERROR(FinishUse());
    if (last) ZT_RETURN_IF_ERROR(m.ReduceReplicatedKvGrads(i, g));
    if (last) ZT_RETURN_IF_ERROR(m.ReduceSequenceParallelNormGrads(1 + i, g));
    if (last) ZT_RETURN_IF_ERROR(GradientReady(ctx, 1 + i));
  }
  if (!tied_) {
    ZT_ASSIGN_OR_RETURN(embedding_grads, GradTarget(ctx, 0));
  }
  ZT_RETURN_IF_ERROR(m.EmbeddingBackward(ctx, embedding_grads));
  if (last) ZT_RETURN_IF_ERROR(GradientReady(ctx, 0));
  std::move(end_pass).Cancel();
  ZT_RETURN_IF_ERROR(EndPass());
  // The next micro-batch's pass reads the same shards: its first ones come in now.
  if (!last) ReadFirstGathersAhead();
  if (last && backward_ended_) backward_ended_();
  if (last) ZT_RETURN_IF_ERROR(FinishReductions(ctx));
  return absl::OkStatus();
}

absl::Status ShardingEngine::ForwardLoss(const DeviceContext& ctx,
                                         const Transformer::LossOptions& options) {
  const int head = model_->layout().n_blocks() + 1;
  std::vector<UnitUse> uses;
  if (!vocab_) uses.push_back({0, !tied_});
  for (int u = 1; u <= head; ++u) uses.push_back({u, true});
  BeginPass(std::move(uses));
  absl::Cleanup end_pass = [&] { EndPass().IgnoreError(); };
  ZT_ASSIGN_OR_RETURN(Tensor head_params, ForwardToHead(ctx));
  Tensor embedding_params;
  if (vocab_) {
    embedding_params = params_[0];
  } else if (tied_) {
    ZT_ASSIGN_OR_RETURN(embedding_params, Params(0));
  }
  Transformer::LossOptions forward_only = options;
  forward_only.write_grad = false;
  ZT_RETURN_IF_ERROR(
      model_->HeadLoss(ctx, head_params, Tensor(), embedding_params, Tensor(), forward_only));
  ZT_RETURN_IF_ERROR(FinishUse());
  std::move(end_pass).Cancel();
  return EndPass();
}

absl::Status ShardingEngine::BeginStatistics(const DeviceContext& ctx) {
  return Zero(ctx, Flat(scalars_, MySlots(), kScalarSlots));
}

absl::Status ShardingEngine::AccumulateGradientStatistics(const DeviceContext& ctx,
                                                          bool check_finite) {
  const int64_t mine = MySlots();
  const Tensor sum_sq = Flat(scalars_, mine + 2, 2);
  const Tensor nonfinite = Flat(scalars_, mine + 4, 1);
  for (const Tensor& g : norm_views_) {
    if (g.numel() == 0) continue;
    if (check_finite) ZT_RETURN_IF_ERROR(AccumulateNonFinite(ctx, g, nonfinite));
    ZT_RETURN_IF_ERROR(AccumulateSumOfSquares(ctx, g, sum_sq));
  }
  return absl::OkStatus();
}

absl::Status ShardingEngine::ExchangeStatistics() {
  const int64_t block = kScalarSlots * geometry_.world_size;
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.world->AllGather(Flat(scalars_, MySlots(), kScalarSlots),
                                                            Flat(scalars_, tp_rank_ * block, block),
                                                            "step totals"));
  std::vector<CommHandle> handles = {h};
  ZT_RETURN_IF_ERROR(WaitAll(handles, &waited_s_));
  if (tp_size_ <= 1) return absl::OkStatus();
  ZT_ASSIGN_OR_RETURN(h, comms_.tensor->AllGather(Flat(scalars_, tp_rank_ * block, block),
                                                  Flat(scalars_, 0, block * tp_size_),
                                                  "step totals (tensor-parallel)"));
  handles = {h};
  return WaitAll(handles, &waited_s_);
}

StepTotals ShardingEngine::Totals(const float* all, double loss_divisor) const {
  const int N = geometry_.world_size, G = geometry_.group_size;
  StepTotals t;
  const int group_first = geometry_.group() * G;
  for (int k = 0; k < tp_size_; ++k) {
    for (int r = 0; r < N; ++r) {
      const float* slots = all + kScalarSlots * (int64_t{k} * N + r);
      // Every TP rank's loss is the same: one block's.
      if (k == 0) t.loss_sum += GetDouble(slots) / loss_divisor;
      if (r >= group_first && r < group_first + G) t.grad_sum_sq += GetDouble(slots + 2);
      t.nonfinite |= slots[4] != 0.0f;
      t.stop_request = std::max(t.stop_request, static_cast<int>(slots[5]));
    }
  }
  return t;
}

absl::Status ShardingEngine::SumAcrossShardGroup(float* data, int64_t n) {
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.shard_group->AllReduce(
                                        Tensor(data, DType::kF32, {n}, scalars_.device()),
                                        ReduceOp::kSum, "optimizer statistics all-reduce"));
  std::vector<CommHandle> handles = {h};
  return WaitAll(handles, &waited_s_);
}

absl::Status ShardingEngine::FinishStep(const DeviceContext& ctx) {
  (void)ctx;
  if (!gather_after_step_) return absl::OkStatus();
  std::vector<CommHandle> handles;
  for (size_t u = 0; u < shards_.size(); ++u) {
    const UnitShard& s = shards_[u];
    ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.shard_group->AllGather(
                                          Flat(trainable_params_[u], s.offset, s.shard_numel),
                                          Flat(trainable_params_[u], 0, s.padded),
                                          Label(static_cast<int>(u), "parameter all-gather")));
    handles.push_back(std::move(h));
  }
  return WaitAll(handles, &waited_s_);
}

absl::Status ShardingEngine::AllGatherUnit(int u, const Tensor& shard, const Tensor& full) {
  const UnitShard& s = shards_[u];
  if (shard.dtype() != DType::kF32 || full.dtype() != DType::kF32 ||
      shard.numel() < s.shard_numel || full.numel() < s.padded) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllGatherUnit: unit ", trainable_layout_.units[u].name,
                     " needs an f32 shard of ", s.shard_numel, " elements and an f32 buffer of ",
                     s.padded, "; got ", shard.DebugString(), " and ", full.DebugString()));
  }
  ZT_ASSIGN_OR_RETURN(CommHandle h, comms_.shard_group->AllGather(Flat(shard, 0, s.shard_numel),
                                                                  Flat(full, 0, s.padded),
                                                                  Label(u, "weights all-gather")));
  return h.Wait();
}

CommStats ShardingEngine::stats() const {
  CommStats total = comms_.world->stats();
  auto add = [&](const Communicator* c) {
    if (c != nullptr && c != comms_.world) total += c->stats();
  };
  add(comms_.shard_group);
  add(comms_.replicas);
  add(comms_.tensor);
  return total;
}

}  // namespace zt
