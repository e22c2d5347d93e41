// Trainer: the initial weights — seeded or from model.init_from, a LoRA job's frozen base
// (quantized, swapped, streamed onto stages) and its adapters.

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
#include "worker/checkpoint/checkpoint_owner.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/checkpoint/rank_state.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/offload/node_swap_store.h"
#include "worker/plan/lora_plan.h"
#include "worker/train/pipeline_full_weights.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_support.h"

namespace zt {
namespace {

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

}  // namespace

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
  if (layout.base_quantization != BaseQuantization::kNone && !device_->host_addressable()) {
    // The base is quantized on the host (the quantize ops run on the CPU only) and its bytes go
    // up through the rank's copy engine (docs/lora.md, "LoRA on CUDA ranks").
    RankDevice* device = device_.get();
    model_->SetQuantizedBaseUpload(
        [device](const Tensor& dst, const void* host) { return device->Upload(dst, host); });
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
            return model_->InitializeQuantizedShard(HostStepContext(ctx_, job_),
                                                    job_.train().seed(), u,
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
  // The quantized weights are quantized on the host, into the model's buffers or (a device the
  // host cannot address) into host staging copied up (Transformer::SetQuantizedBaseUpload).
  const DeviceContext host_ctx = HostStepContext(ctx_, job_);
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
      const Tensor into = params.Slice(lo - mine.begin, hi - mine.begin);
      if (swapped_base_) {
        // Host staging on its way to the store: cast on the host, whatever the device.
        ZT_RETURN_IF_ERROR(Cast(host_ctx, Tensor(values.data(), DType::kF32, {hi - lo}), into));
        continue;
      }
      const Tensor v = chunk.Slice(0, hi - lo);
      ZT_RETURN_IF_ERROR(device_->Upload(v, values.data()));
      ZT_RETURN_IF_ERROR(Cast(ctx_, v, into));
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
            host_ctx, u, p.name, weight,
            Tensor(q.data(), DType::kF32, {static_cast<int64_t>(q.size())}));
      } else {
        // The model's own indexing is the whole model's (t.unit), its shards' the stage's.
        quantized = model_->QuantizeBaseWeight(host_ctx, t.unit, p.name, weight);
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
  // NF4 or INT8: the quantized weights come from the same seeded init as the rest of the base,
  // one tensor at a time, unless model.init_from streamed them in (StreamQuantizedBase). The
  // host quantizes them (into host staging copied up, on a device the host cannot address).
  if (model.init_from().empty() && !swapped_base_) {  // a swapped one is written with its shards
    ZT_RETURN_IF_ERROR(
        model_->InitializeQuantizedBase(HostStepContext(ctx_, job_), job_.train().seed()));
  }
  // The adapters are f32 values the host computes (PEFT's init, or a PEFT directory). A device
  // whose memory the host cannot address gets them through host staging of each unit's
  // adapter buffer, uploaded through the rank's copy engine: set-up memory beside the plan
  // (the adapters' f32 bytes once, freed before the first step), as the base being assembled
  // in StreamQuantizedBase is.
  const std::vector<Tensor>& buffers = model_->unit_lora();
  const bool staged = !device_->host_addressable();
  std::vector<std::vector<float>> staging;
  std::vector<Tensor> host;
  if (staged) {
    for (const Tensor& b : buffers) {
      staging.emplace_back(b.empty() ? 0 : static_cast<size_t>(b.numel()), 0.0f);
      host.push_back(b.empty() ? Tensor()
                               : Tensor(staging.back().data(), DType::kF32, {b.numel()}));
    }
  }
  const std::vector<Tensor>* into = staged ? &host : nullptr;
  model_->InitializeLora(job_.train().seed(), into);
  if (!model.lora().init_from().empty()) {
    if (model_->tensor_parallel().size <= 1) {
      ZT_RETURN_IF_ERROR(ReadPeftAdapter(model, model_->layout(), model.lora().init_from(),
                                         staged ? host : buffers));
    } else {
      // A tensor-parallel rank reads the whole model's adapters and keeps its shares.
      const ModelLayout whole = BuildModelLayout(model);
      std::vector<std::vector<float>> adapters(whole.units.size());
      std::vector<Tensor> whole_buffers;
      for (size_t u = 0; u < whole.units.size(); ++u) {
        adapters[u].resize(static_cast<size_t>(whole.units[u].lora_numel));
        whole_buffers.push_back(adapters[u].empty() ? Tensor()
                                                    : Tensor(adapters[u].data(), DType::kF32,
                                                             {whole.units[u].lora_numel}));
      }
      ZT_RETURN_IF_ERROR(ReadPeftAdapter(model, whole, model.lora().init_from(), whole_buffers));
      model_->SetLoraFromWhole(adapters, into);
    }
  }
  for (size_t u = 0; staged && u < buffers.size(); ++u) {
    if (!buffers[u].empty()) ZT_RETURN_IF_ERROR(device_->Upload(buffers[u], staging[u].data()));
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
    // from TP rank 0 (the same on every rank). A device the host cannot address gathers its
    // adapters where they are, into device scratch outside the plan (export is not the step
    // loop), and the gathered shares come down.
    const int t = comms_.tensor->size();
    const bool on_device = !device_->host_addressable();
    const ModelLayout whole = BuildModelLayout(job_.model());
    for (size_t u = 0; u < out.size(); ++u) {
      const int64_t n = layout.units[u].lora_numel;
      if (n == 0) continue;
      std::vector<float> all(static_cast<size_t>(n * t));
      Tensor in(out[u].data(), DType::kF32, {n}), gathered(all.data(), DType::kF32, {n * t});
      ScratchTensor scratch;
      if (on_device) {
        ZT_ASSIGN_OR_RETURN(scratch, device_->AllocateScratchF32(n * t));
        in = model_->unit_lora()[u].Slice(0, n);
        gathered = scratch.tensor;
      }
      ZT_ASSIGN_OR_RETURN(
          CommHandle h,
          comms_.tensor->AllGather(in, gathered, layout.units[u].name + " adapters all-gather"));
      ZT_RETURN_IF_ERROR(h.Wait());
      if (on_device) ZT_RETURN_IF_ERROR(device_->Download(all.data(), gathered));
      // A pipeline stage's unit u is the whole model's held_units()[u].
      const UnitLayout& whole_unit = whole.units[model_->pipelined() ? model_->held_units()[u] : u];
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
  ZT_RETURN_IF_ERROR(JoinPipelineStages(
      *comms_.pipeline, pipeline_stage_, BuildModelLayout(job_.model()), StageOfEachUnit(job_),
      model_->held_units(), out, device_->host_addressable() ? nullptr : device_.get(),
      UnitValues::kAdapters));
  return out;
}

}  // namespace zt
