// Trainer: checkpoints — saving, resuming (also through the host and the swap store), and the
// whole model's weights joined from the ranks' shards and shares.

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
#include "kernels/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/train/pipeline_full_weights.h"
#include "worker/train/trainer.h"

namespace zt {
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

}  // namespace zt
