#include "worker/checkpoint/tensor_parallel_reshard.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/logical_optimizer_state.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/param_layout.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/optimizer_state_layout.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

// For each element of `local` (a share at tp, rank r), its index in the whole unit, or -1 for
// padding.
std::vector<int64_t> GlobalIndex(const zerotrain::ModelConfig& m, const UnitLayout& local,
                                 const UnitLayout& whole, int tp, int r) {
  std::vector<int64_t> g(local.numel, -1);
  for (const ParamSpec& p : local.params) {
    // A pipeline head stage's copy of the tied embedding ("lm_head.weight" appended to the
    // head unit) is not a parameter of the whole unit: it is wte's, read from the embedding.
    if (whole.Find(p.name) == nullptr) continue;
    if (p.quantized) continue;  // a QLoRA base's frozen weight, not in the flat buffer
    const ParamSpec& w = *whole.Find(p.name);
    const TensorParallelSlice s = SliceOf(m, p.name, w.shape, tp, r);
    for (const TensorParallelSlice::Rows& run : s.rows) {
      for (int64_t i = 0; i < run.count; ++i) {
        for (int64_t c = 0; c < s.local_cols; ++c) {
          g[p.offset + (run.local_begin + i) * s.local_cols + c] =
              w.offset + (run.global_begin + i) * s.global_cols + s.col_begin + c;
        }
      }
    }
  }
  return g;
}

// Elements [begin, end) of the unit that buffer `role` of `rank` holds, from its element 0.
struct Segment {
  int64_t begin = 0, end = 0;
};
Segment SegmentOf(const zerotrain::JobSpec& job, int rank, const UnitLayout& unit,
                  const std::string& role) {
  const int stage = job.parallel().zero_stage();
  const bool sharded = role == "params" ? stage >= 3 : stage >= 1;
  if (!sharded) return {0, unit.numel};
  const UnitShard shard = ShardOfUnit(unit, ParallelLayout::ForJob(job, rank).shard());
  return {shard.owned.begin, shard.owned.end};
}

bool Elementwise(const std::string& role) {
  return role == "params" || role == "master" || role == "adam_m" || role == "adam_v" ||
         role == "momentum";
}

// Every saved rank's file, opened (mapped) once.
absl::StatusOr<std::vector<std::unique_ptr<SafetensorsFile>>> OpenSavedRanks(
    const zerotrain::JobSpec& saved, const std::function<std::string(int)>& rank_file) {
  std::vector<std::unique_ptr<SafetensorsFile>> files(saved.parallel().world_size());
  for (size_t r = 0; r < files.size(); ++r) {
    ZT_ASSIGN_OR_RETURN(files[r], SafetensorsFile::Open(rank_file(static_cast<int>(r))));
  }
  return files;
}

// Unit u's buffer `role` (saved as `buffer`, f32) of the whole model, in unit_values (sized to
// the whole unit), placed element by element from every saved rank's range of its share. A
// saved rank holds the unit as its RankModelLayout says (a tensor-parallel share, and with
// pipeline parallelism only its stage's units): ranks of other stages are skipped.
absl::Status JoinWholeUnit(const zerotrain::JobSpec& saved,
                           const std::vector<std::unique_ptr<SafetensorsFile>>& files,
                           const std::function<std::string(int)>& rank_file, int u,
                           const std::string& buffer, const std::string& role,
                           std::vector<float>* unit_values) {
  const zerotrain::ModelConfig& m = saved.model();
  const ModelLayout whole = BuildModelLayout(m);
  const UnitLayout& whole_unit = whole.units[u];
  unit_values->assign(whole_unit.numel, 0.0f);
  bool found = false;
  for (int r = 0; r < static_cast<int>(files.size()); ++r) {
    const ParallelLayout place = ParallelLayout::ForJob(saved, r);
    const ModelLayout rank_layout = RankModelLayout(saved, place);
    const UnitLayout* local = nullptr;
    for (const UnitLayout& unit : rank_layout.units) {
      if (unit.name == whole_unit.name) local = &unit;
    }
    if (local == nullptr) continue;  // another pipeline stage's unit
    found = true;
    const std::vector<int64_t> index =
        GlobalIndex(m, *local, whole_unit, place.tensor_size(), place.coordinates().tensor);
    const Segment seg = SegmentOf(saved, r, *local, role);
    if (seg.end <= seg.begin) continue;  // an empty range: the plan holds no such buffer
    const SafetensorsTensorInfo* info = files[r]->Find(buffer);
    const int64_t need = (seg.end - seg.begin) * static_cast<int64_t>(sizeof(float));
    if (info == nullptr || info->nbytes() < need) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint file '", rank_file(r), "': buffer ", buffer,
                       info == nullptr ? " is missing" : " is shorter than its layout says"));
    }
    if (info->dtype != StDType::kF32) {
      return absl::UnimplementedError(absl::StrCat(
          "checkpoint file '", rank_file(r), "': buffer ", buffer,
          " is not f32, which is all a tensor- or pipeline-parallel checkpoint is read in"));
    }
    const absl::Span<const uint8_t> bytes = files[r]->Bytes(*info);
    std::vector<float> values(seg.end - seg.begin);
    std::memcpy(values.data(), bytes.data(), need);
    files[r]->Release(*info);
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      if (index[i] >= 0) (*unit_values)[index[i]] = values[i - seg.begin];
    }
  }
  if (!found) {
    return absl::DataLossError(
        absl::StrCat("checkpoint: no saved rank holds unit ", whole_unit.name, " (", buffer, ")"));
  }
  return absl::OkStatus();
}

// A LoRA job's buffers across pipeline layouts (tensor_parallel 1 on both sides): each block's
// adapters ("<block>.lora", whole on every rank of its stage) and, below ZeRO stage 3, its
// frozen base ("<unit>.params", an NF4/INT8 base's per-tensor buffers) are copied from the first
// saved rank whose stage holds them, bit for bit in their own dtype; the adapters' elementwise
// optimizer states ("<block>.lora.<state>") are joined from the ranges of the saved ranks of the
// block's stage (LoraAdapterLayout's units) and this rank's range taken. Sets *done when `b` is
// such a buffer.
absl::Status ReshardLoraBuffer(const zerotrain::JobSpec& saved,
                               const std::vector<std::unique_ptr<SafetensorsFile>>& files,
                               const std::function<std::string(int)>& rank_file,
                               const zerotrain::JobSpec& job, int rank, const BufferSpec& b,
                               const Arenas& into, bool* done) {
  *done = false;
  const ModelLayout whole = BuildModelLayout(job.model());
  const bool whole_base = saved.parallel().zero_stage() < 3 && job.parallel().zero_stage() < 3;
  const bool copied = b.name.ends_with(".lora") || IsQuantizedBaseBuffer(b.name) ||
                      (b.name.ends_with(".params") && whole_base);
  if (copied) {
    ZT_ASSIGN_OR_RETURN(Tensor dst, into.Get(b.name));
    // The unit's own elements: "<block>.lora" and a base's "<unit>.params" are padded to the
    // shard quantum at ZeRO stages >= 1, on either side.
    int64_t numel = b.numel();
    for (const UnitLayout& u : whole.units) {
      if (b.name == u.name + ".lora") numel = u.lora_numel;
      if (b.name == u.name + ".params") numel = u.numel;
    }
    const int64_t bytes = numel * DTypeSize(b.dtype);
    for (size_t r = 0; r < files.size(); ++r) {
      const SafetensorsTensorInfo* info = files[r]->Find(b.name);
      if (info == nullptr) continue;  // another stage's unit
      if (info->nbytes() < bytes) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint file '", rank_file(static_cast<int>(r)), "': buffer ", b.name,
                         " is shorter than its layout says"));
      }
      std::memset(dst.raw(), 0, static_cast<size_t>(dst.size_bytes()));
      std::memcpy(dst.raw(), files[r]->Bytes(*info).data(), static_cast<size_t>(bytes));
      files[r]->Release(*info);
      *done = true;
      // A pipeline head stage's frozen copy of the tied wte (after the head's own tensors):
      // the embedding's wte, wherever it was saved.
      const ModelLayout local = RankModelLayout(job, ParallelLayout::ForJob(job, rank));
      const ParamSpec* copy = local.units.back().Find("lm_head.weight");
      if (b.name != local.units.back().name + ".params" || copy == nullptr ||
          whole.head().Find("lm_head.weight") != nullptr) {
        return absl::OkStatus();
      }
      const ParamSpec& wte = *whole.embedding().Find("wte");
      const std::string embedding = whole.embedding().name + ".params";
      const int64_t size = DTypeSize(b.dtype);
      for (size_t e = 0; e < files.size(); ++e) {
        const SafetensorsTensorInfo* from = files[e]->Find(embedding);
        if (from == nullptr) continue;
        if (from->nbytes() < (wte.offset + wte.numel) * size) break;
        std::memcpy(static_cast<char*>(dst.raw()) + copy->offset * size,
                    files[e]->Bytes(*from).data() + wte.offset * size,
                    static_cast<size_t>(wte.numel * size));
        files[e]->Release(*from);
        return absl::OkStatus();
      }
      return absl::DataLossError(absl::StrCat("checkpoint: no saved rank holds ", embedding,
                                              " for the head stage's copy of wte"));
    }
    return absl::DataLossError(
        absl::StrCat("checkpoint: no saved rank holds ", b.name, " of this LoRA job"));
  }
  // "<block>.lora.<state>": an elementwise state of the block's adapters.
  const ModelLayout adapters = LoraAdapterLayout(whole);
  const UnitLayout* unit = nullptr;
  for (const UnitLayout& u : adapters.units) {
    if (b.name.starts_with(u.name + ".")) unit = &u;
  }
  if (unit == nullptr) return absl::OkStatus();
  const std::string role = b.name.substr(unit->name.size() + 1);
  if (!Elementwise(role) || b.dtype != DType::kF32) return absl::OkStatus();  // refused below
  std::vector<float> values(unit->numel, 0.0f);
  bool found = false;
  for (size_t r = 0; r < files.size(); ++r) {
    const SafetensorsTensorInfo* info = files[r]->Find(b.name);
    if (info == nullptr) continue;  // another stage's block
    found = true;
    const Segment have = SegmentOf(saved, static_cast<int>(r), *unit, role);
    const int64_t need = (have.end - have.begin) * static_cast<int64_t>(sizeof(float));
    if (have.end <= have.begin) continue;
    if (info->nbytes() < need || info->dtype != StDType::kF32) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint file '", rank_file(static_cast<int>(r)), "': buffer ", b.name,
                       " is not the f32 range its layout says"));
    }
    std::memcpy(values.data() + have.begin, files[r]->Bytes(*info).data(),
                static_cast<size_t>(need));
    files[r]->Release(*info);
  }
  if (!found) {
    return absl::DataLossError(
        absl::StrCat("checkpoint: no saved rank holds ", b.name, " of this LoRA job"));
  }
  const Segment want = SegmentOf(job, rank, *unit, role);
  ZT_ASSIGN_OR_RETURN(Tensor dst, into.Get(b.name));
  float* out = dst.data<float>();
  std::fill(out, out + dst.numel(), 0.0f);
  std::copy(values.begin() + want.begin, values.begin() + want.end, out);
  *done = true;
  return absl::OkStatus();
}

// For each element of `local`'s adapters (a rank's share of block `whole`'s at tp, tensor
// coordinate r), its index in the whole block's adapters.
std::vector<int64_t> AdapterGlobalIndex(const zerotrain::ModelConfig& m, const UnitLayout& local,
                                        const UnitLayout& whole, int tp, int r) {
  std::vector<int64_t> g(local.lora_numel, -1);
  for (size_t k = 0; k < whole.lora.size(); ++k) {
    for (const bool a : {true, false}) {
      const TensorParallelSlice s = LoraSliceOf(m, whole.lora[k], a, tp, r);
      const int64_t from = a ? local.lora[k].a.offset : local.lora[k].b.offset;
      const int64_t to = a ? whole.lora[k].a.offset : whole.lora[k].b.offset;
      for (const TensorParallelSlice::Rows& run : s.rows) {
        for (int64_t i = 0; i < run.count; ++i) {
          for (int64_t c = 0; c < s.local_cols; ++c) {
            g[from + (run.local_begin + i) * s.local_cols + c] =
                to + (run.global_begin + i) * s.global_cols + s.col_begin + c;
          }
        }
      }
    }
  }
  return g;
}

// The share of `spec`'s rank `at`'s copy of block `unit` (`local`) and LoraAdapterLayout's unit
// of it (`adapters`, whose ZeRO ranges the optimizer states are split by); false when the rank's
// pipeline stage does not hold the block.
bool AdapterShareOf(const zerotrain::JobSpec& spec, int at, const UnitLayout& unit,
                    UnitLayout* local, UnitLayout* adapters) {
  const ModelLayout rank_layout = RankModelLayout(spec, ParallelLayout::ForJob(spec, at));
  for (const UnitLayout& u : rank_layout.units) {
    if (u.name != unit.name) continue;
    *local = u;
    ModelLayout one;
    one.units = {u};
    *adapters = LoraAdapterLayout(one).units.front();
    return true;
  }
  return false;
}

// Block `unit`'s (of the whole model) adapters (role "") or their elementwise optimizer state
// `role`, saved as `buffer`, in *values (unit.lora_numel): every saved rank's range of its share
// placed by AdapterGlobalIndex (ranks of other stages skipped; replicas write the same values).
absl::Status JoinWholeAdapters(const zerotrain::JobSpec& saved,
                               const std::vector<std::unique_ptr<SafetensorsFile>>& files,
                               const std::function<std::string(int)>& rank_file,
                               const UnitLayout& unit, const std::string& buffer,
                               const std::string& role, std::vector<float>* values) {
  values->assign(static_cast<size_t>(unit.lora_numel), 0.0f);
  bool found = false;
  for (size_t r = 0; r < files.size(); ++r) {
    UnitLayout local, adapters;
    if (!AdapterShareOf(saved, static_cast<int>(r), unit, &local, &adapters)) continue;
    const SafetensorsTensorInfo* info = files[r]->Find(buffer);
    const Segment have = role.empty() ? Segment{0, local.lora_numel}
                                      : SegmentOf(saved, static_cast<int>(r), adapters, role);
    if (have.end <= have.begin) continue;
    const int64_t need = (have.end - have.begin) * static_cast<int64_t>(sizeof(float));
    if (info == nullptr || info->nbytes() < need || info->dtype != StDType::kF32) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint file '", rank_file(static_cast<int>(r)), "': buffer ", buffer,
                       " is missing or not the f32 range its layout says"));
    }
    found = true;
    std::vector<float> held(static_cast<size_t>(have.end - have.begin));
    std::memcpy(held.data(), files[r]->Bytes(*info).data(), static_cast<size_t>(need));
    files[r]->Release(*info);
    const ParallelLayout place = ParallelLayout::ForJob(saved, static_cast<int>(r));
    const std::vector<int64_t> index = AdapterGlobalIndex(
        saved.model(), local, unit, place.tensor_size(), place.coordinates().tensor);
    for (int64_t i = have.begin; i < have.end; ++i) {
      if (index[i] >= 0) (*values)[index[i]] = held[i - have.begin];
    }
  }
  if (!found) {
    return absl::DataLossError(absl::StrCat("checkpoint: no saved rank holds ", buffer));
  }
  return absl::OkStatus();
}

// A tensor-parallel LoRA job's adapters ("<block>.lora") or their elementwise optimizer state
// ("<block>.lora.<state>") for rank `rank` of `job`: the whole block's values joined from every
// saved rank's range of its share (AdapterGlobalIndex), this rank's share and range taken out.
// Sets *done when `b` is such a buffer.
absl::Status ReshardTensorParallelAdapters(
    const zerotrain::JobSpec& saved, const std::vector<std::unique_ptr<SafetensorsFile>>& files,
    const std::function<std::string(int)>& rank_file, const zerotrain::JobSpec& job, int rank,
    const BufferSpec& b, const Arenas& into, bool* done) {
  *done = false;
  const zerotrain::ModelConfig& m = job.model();
  const ModelLayout whole = BuildModelLayout(m);
  const UnitLayout* unit = nullptr;
  std::string role;
  for (const UnitLayout& u : whole.units) {
    if (u.lora.empty()) continue;
    if (b.name == u.name + ".lora") unit = &u;
    if (b.name.starts_with(u.name + ".lora.")) {
      unit = &u;
      role = b.name.substr(u.name.size() + 6);
    }
  }
  if (unit == nullptr) return absl::OkStatus();
  if (!role.empty() && (!Elementwise(role) || b.dtype != DType::kF32)) return absl::OkStatus();
  std::vector<float> values;
  ZT_RETURN_IF_ERROR(JoinWholeAdapters(saved, files, rank_file, *unit, b.name, role, &values));
  UnitLayout local, adapters;
  if (!AdapterShareOf(job, rank, *unit, &local, &adapters)) {
    return absl::InternalError(absl::StrCat("resharding: rank ", rank, " holds no ", b.name));
  }
  const ParallelLayout place = ParallelLayout::ForJob(job, rank);
  const std::vector<int64_t> index =
      AdapterGlobalIndex(m, local, *unit, place.tensor_size(), place.coordinates().tensor);
  const Segment want =
      role.empty() ? Segment{0, local.lora_numel} : SegmentOf(job, rank, adapters, role);
  ZT_ASSIGN_OR_RETURN(Tensor dst, into.Get(b.name));
  float* out = dst.data<float>();
  std::fill(out, out + dst.numel(), 0.0f);
  for (int64_t i = want.begin; i < want.end; ++i) {
    if (index[i] >= 0) out[i - want.begin] = values[index[i]];
  }
  *done = true;
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadWholeUnitFromShares(const zerotrain::JobSpec& saved,
                                     const std::function<std::string(int)>& rank_file, int unit,
                                     const std::string& role, float* out) {
  const ModelLayout whole = BuildModelLayout(saved.model());
  if (unit < 0 || unit >= static_cast<int>(whole.units.size()) ||
      (role != "params" && role != "master")) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadWholeUnitFromShares: unit ", unit, " role '", role, "' is not a weight"));
  }
  ZT_ASSIGN_OR_RETURN(const auto files, OpenSavedRanks(saved, rank_file));
  std::vector<float> values;
  ZT_RETURN_IF_ERROR(JoinWholeUnit(saved, files, rank_file, unit,
                                   whole.units[unit].name + "." + role, role, &values));
  std::copy(values.begin(), values.end(), out);
  return absl::OkStatus();
}

absl::Status ReadWholeAdaptersFromShares(const zerotrain::JobSpec& saved,
                                         const std::function<std::string(int)>& rank_file, int unit,
                                         float* out) {
  const ModelLayout whole = BuildModelLayout(saved.model());
  if (unit < 0 || unit >= static_cast<int>(whole.units.size()) ||
      whole.units[unit].lora_numel == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadWholeAdaptersFromShares: unit ", unit, " has no adapters"));
  }
  ZT_ASSIGN_OR_RETURN(const auto files, OpenSavedRanks(saved, rank_file));
  std::vector<float> values;
  ZT_RETURN_IF_ERROR(JoinWholeAdapters(saved, files, rank_file, whole.units[unit],
                                       whole.units[unit].name + ".lora", "", &values));
  std::copy(values.begin(), values.end(), out);
  return absl::OkStatus();
}

absl::Status ReshardTensorParallelState(const zerotrain::JobSpec& saved,
                                        const std::function<std::string(int)>& rank_file,
                                        const zerotrain::JobSpec& job, int rank,
                                        const MemoryPlan& plan, const Arenas& into,
                                        bool weights_only) {
  const zerotrain::ModelConfig& m = job.model();
  const ModelLayout whole = BuildModelLayout(m);
  const ParallelLayout place = ParallelLayout::ForJob(job, rank);
  // This rank's units: its tensor-parallel shares of its pipeline stage's units.
  const ModelLayout local = RankModelLayout(job, place);
  ZT_ASSIGN_OR_RETURN(const auto files, OpenSavedRanks(saved, rank_file));
  const auto whole_index = [&](const std::string& name) {
    for (size_t k = 0; k < whole.units.size(); ++k) {
      if (whole.units[k].name == name) return static_cast<int>(k);
    }
    return -1;
  };
  std::vector<float> unit_values, embedding_values;
  // 8-bit AdamW's and Adafactor's states (a unit's or its adapters'): a unit's buffers all at
  // once, through the unit's logical state (worker/checkpoint/logical_optimizer_state.h).
  std::set<std::string> planned, logical_done;
  for (const BufferSpec& buffer : plan.buffers) {
    if (IsCheckpointed(buffer, weights_only)) planned.insert(buffer.name);
  }
  LogicalOptimizerState logical(saved, files, rank_file);
  for (const BufferSpec& buffer : plan.buffers) {
    if (!IsCheckpointed(buffer, weights_only)) continue;
    const BufferSpec* b = &buffer;
    const UnitLayout* owner = nullptr;
    bool adapters = false;
    std::string state;
    for (const UnitLayout& u : whole.units) {
      const std::string lora = u.name + ".lora.";
      if (!u.lora.empty() && b->name.starts_with(lora)) {
        owner = &u;
        adapters = true;
        state = b->name.substr(lora.size());
        break;
      }
      if (b->name.starts_with(u.name + ".")) {
        owner = &u;
        state = b->name.substr(u.name.size() + 1);
        break;
      }
    }
    if (m.has_lora() && (IsQuantizedBaseBuffer(b->name) || b->name.ends_with(".qbase")) &&
        (std::max(1, saved.parallel().tensor_parallel()) > 1 || place.tensor_size() > 1)) {
      // A quantized base with tensor parallelism on either side: a saved share is not this
      // rank's (nor, at one rank, the whole weight's bytes: an NF4 share keeps the one-rank
      // group scales and its rows' block indices). The base is frozen: the rank's own, quantized at
      // start-up from the job's seed (Transformer::QuantizeBaseWeight; one read from
      // model.init_from is not checkpointed, reloaded_at_start), is the checkpoint's: kept when the
      // seeds agree.
      if (saved.train().seed() != job.train().seed()) {
        return absl::FailedPreconditionError(
            absl::StrCat("resuming at another tensor-parallel layout: the quantized base ", b->name,
                         " is rebuilt from train.seed, but the checkpoint was trained with seed ",
                         saved.train().seed(), " and this job has ", job.train().seed()));
      }
      continue;
    }
    if (owner != nullptr && IsLogicalOptimizerStateRole(saved, job, state)) {
      if (logical_done.insert(absl::StrCat(owner->name, adapters ? ".lora" : "")).second) {
        ZT_RETURN_IF_ERROR(logical.Fill(
            job, rank, *owner, adapters,
            [&](const std::string& name) { return planned.count(name) > 0; }, into));
      }
      continue;
    }
    if (m.has_lora() && std::max(1, saved.parallel().tensor_parallel()) == 1 &&
        place.tensor_size() == 1) {
      bool done = false;
      ZT_RETURN_IF_ERROR(ReshardLoraBuffer(saved, files, rank_file, job, rank, *b, into, &done));
      if (done) continue;
    }
    if (m.has_lora()) {
      // With tensor parallelism on either side: the adapters and their states from the shares
      // (the frozen base below, as any unit's parameters).
      bool done = false;
      ZT_RETURN_IF_ERROR(
          ReshardTensorParallelAdapters(saved, files, rank_file, job, rank, *b, into, &done));
      if (done) continue;
    }
    int u = -1;
    for (size_t k = 0; k < local.units.size(); ++k) {
      if (b->name.starts_with(local.units[k].name + ".")) u = static_cast<int>(k);
    }
    const std::string role = u < 0 ? "" : b->name.substr(local.units[u].name.size() + 1);
    if (u < 0 || !Elementwise(role) || b->dtype != DType::kF32) {
      return absl::UnimplementedError(absl::StrCat(
          "resuming at another tensor- or pipeline-parallel layout: buffer ", b->name,
          " is not f32 parameters or master weights, nor AdamW's, SGD's, 8-bit AdamW's or "
          "Adafactor's state, which is all the resharding of such checkpoints reads so far"));
    }
    const UnitLayout& mine = local.units[u];
    const int w = whole_index(mine.name);
    // The whole unit's values of this role, from every saved rank's range of its share.
    ZT_RETURN_IF_ERROR(JoinWholeUnit(saved, files, rank_file, w, whole.units[w].name + "." + role,
                                     role, &unit_values));
    // This rank's share and range of it.
    const std::vector<int64_t> index =
        GlobalIndex(m, mine, whole.units[w], place.tensor_size(), place.coordinates().tensor);
    const Segment seg = SegmentOf(job, rank, mine, role);
    ZT_ASSIGN_OR_RETURN(Tensor out, into.Get(b->name));
    float* dst = out.data<float>();
    std::fill(dst, dst + out.numel(), 0.0f);
    for (int64_t i = seg.begin; i < seg.end; ++i) {
      if (index[i] >= 0) dst[i - seg.begin] = unit_values[index[i]];
    }
    // A pipeline head stage's copy of the tied embedding: the same parameter as wte, with the
    // same optimizer state (its gradient is summed with the embedding's every step), so it
    // starts as the embedding's share.
    const ParamSpec* copy = mine.Find("lm_head.weight");
    if (copy == nullptr || whole.units[w].Find("lm_head.weight") != nullptr) continue;
    const UnitLayout& embedding = whole.embedding();
    ZT_RETURN_IF_ERROR(JoinWholeUnit(saved, files, rank_file, whole_index(embedding.name),
                                     embedding.name + "." + role, role, &embedding_values));
    const TensorParallelSlice s = SliceOf(m, "wte", embedding.Find("wte")->shape,
                                          place.tensor_size(), place.coordinates().tensor);
    std::vector<float> share(copy->numel);
    ExtractSlice(s, embedding_values.data() + embedding.Find("wte")->offset, share.data());
    for (int64_t i = std::max(seg.begin, copy->offset);
         i < std::min(seg.end, copy->offset + copy->numel); ++i) {
      dst[i - seg.begin] = share[i - copy->offset];
    }
  }
  return absl::OkStatus();
}

}  // namespace zt
