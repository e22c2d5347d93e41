#include "worker/checkpoint/logical_optimizer_state.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/quantization.h"
#include "kernels/status_macros.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/optimizer_state_layout.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

using Opt = zerotrain::OptimizerConfig;

// A tensor-parallel rank's share of a whole unit (or of its adapters): the unit
// OptimizerStateFor describes the rank's state by, and for each of its tensors the whole
// tensor it is a part of and where (its slice).
struct Share {
  UnitLayout unit;
  std::vector<int> whole;  // per tensor: the whole unit's tensor, or kTiedWte
  std::vector<TensorParallelSlice> slices;
  FlatRange range;  // the rank's ZeRO range of `unit`
};
constexpr int kTiedWte = -1;  // a pipeline head stage's copy of the embedding's wte

// Rank `at` of `spec`'s share of `whole` (a unit of the whole model), or nullopt when its
// pipeline stage does not hold the unit.
std::optional<Share> ShareOf(const zerotrain::JobSpec& spec, int at, const UnitLayout& whole,
                             bool adapters) {
  const ParallelLayout place = ParallelLayout::ForJob(spec, at);
  const ModelLayout rank_layout = RankModelLayout(spec, place);
  const UnitLayout* local = nullptr;
  for (const UnitLayout& u : rank_layout.units) {
    if (u.name == whole.name) local = &u;
  }
  if (local == nullptr) return std::nullopt;
  const zerotrain::ModelConfig& m = spec.model();
  const int tp = place.tensor_size(), r = place.coordinates().tensor;
  Share s;
  if (adapters) {
    ModelLayout one;
    one.units = {*local};
    s.unit = LoraAdapterLayout(one).units.front();
    // LoraAdapterLayout's tensors: each site's A then B, in the whole block's order.
    for (size_t k = 0; k < whole.lora.size(); ++k) {
      for (const bool a : {true, false}) {
        s.whole.push_back(static_cast<int>(2 * k + (a ? 0 : 1)));
        s.slices.push_back(LoraSliceOf(m, whole.lora[k], a, tp, r));
      }
    }
  } else {
    s.unit = *local;
    const ModelLayout model = BuildModelLayout(m);
    for (const ParamSpec& p : local->params) {
      const ParamSpec* w = whole.Find(p.name);
      if (w == nullptr) {  // "lm_head.weight" of a head stage, where the whole head has none
        s.whole.push_back(kTiedWte);
        s.slices.push_back(SliceOf(m, "wte", model.embedding().Find("wte")->shape, tp, r));
        continue;
      }
      s.whole.push_back(static_cast<int>(w - whole.params.data()));
      s.slices.push_back(SliceOf(m, p.name, w->shape, tp, r));
    }
  }
  s.range = {0, s.unit.numel};
  if (spec.parallel().zero_stage() >= 1) {
    const UnitShard shard = ShardOfUnit(s.unit, place.shard());
    s.range = {shard.owned.begin, shard.owned.end};
  }
  return s;
}

// For each local row of `slice`, its row in the whole tensor, or -1 for padding.
std::vector<int64_t> RowMap(const TensorParallelSlice& slice) {
  std::vector<int64_t> rows(static_cast<size_t>(slice.local_rows), -1);
  for (const TensorParallelSlice::Rows& run : slice.rows) {
    for (int64_t i = 0; i < run.count; ++i) rows[run.local_begin + i] = run.global_begin + i;
  }
  return rows;
}

// Local element e (row-major over local_rows × local_cols) of the share, in the whole tensor;
// -1 for padding.
int64_t WholeElement(const TensorParallelSlice& slice, const std::vector<int64_t>& rows,
                     int64_t e) {
  const int64_t row = rows[e / slice.local_cols];
  return row < 0 ? -1 : row * slice.global_cols + slice.col_begin + e % slice.local_cols;
}

}  // namespace

bool IsLogicalOptimizerStateRole(const zerotrain::JobSpec& saved, const zerotrain::JobSpec& job,
                                 const std::string& role) {
  const Opt::Type type = job.optimizer().type();
  if (saved.optimizer().type() != type) return false;
  if (type == Opt::ADAMW_8BIT) {
    return role == "adam8_m_codes" || role == "adam8_v_codes" || role == "adam8_m_absmax" ||
           role == "adam8_v_absmax" || role == "adam_m" || role == "adam_v";
  }
  if (type == Opt::ADAFACTOR) {
    return role == "adafactor_row" || role == "adafactor_col" || role == "adafactor_full" ||
           role == "adafactor_m";
  }
  return false;
}

// One whole tensor's logical state. 8-bit AdamW: m and v per element. Adafactor: m per element
// (beta1 > 0), a vector's full second moment in v, a matrix's statistics in row and col.
struct LogicalOptimizerState::Logical {
  std::vector<float> m, v, row, col;
  // What the saved shares covered, checked against what the optimizer keeps for the tensor.
  std::vector<uint8_t> seen_m, seen_v, seen_row, seen_col;
};

absl::Status LogicalOptimizerState::Join(const UnitLayout& unit, bool adapters,
                                         std::vector<Logical>* out) const {
  const zerotrain::OptimizerConfig& config = saved_.optimizer();
  const bool adafactor = config.type() == Opt::ADAFACTOR;
  ModelLayout one;
  one.units = {unit};
  const std::vector<ParamSpec> tensors =
      adapters ? LoraAdapterLayout(one).units.front().params : unit.params;
  out->assign(tensors.size(), {});
  for (size_t i = 0; i < tensors.size(); ++i) {
    Logical& l = (*out)[i];
    const std::vector<int64_t>& shape = tensors[i].shape;
    const int64_t n = tensors[i].numel;
    l.m.assign(n, 0.0f);
    l.seen_m.assign(n, 0);
    if (adafactor && shape.size() == 2) {
      l.row.assign(shape[0], 0.0f);
      l.seen_row.assign(shape[0], 0);
      l.col.assign(shape[1], 0.0f);
      l.seen_col.assign(shape[1], 0);
    } else {
      l.v.assign(n, 0.0f);
      l.seen_v.assign(n, 0);
    }
  }
  const DeviceContext ctx = CpuContext(1);
  bool found = false;
  for (size_t r = 0; r < files_.size(); ++r) {
    const std::optional<Share> share = ShareOf(saved_, static_cast<int>(r), unit, adapters);
    if (!share) continue;  // another pipeline stage's unit
    found = true;
    const UnitOptimizerState state = OptimizerStateFor(config, share->unit, share->range);
    std::vector<const uint8_t*> bytes;
    std::vector<const SafetensorsTensorInfo*> infos;
    for (const UnitOptimizerState::Buffer& b : state.buffers) {
      const std::string name = absl::StrCat(share->unit.name, ".", b.name);
      const SafetensorsTensorInfo* info = files_[r]->Find(name);
      if (info == nullptr || info->dtype != ToStDType(b.dtype) ||
          info->nbytes() < b.numel * DTypeSize(b.dtype)) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint file '", rank_file_(static_cast<int>(r)), "': buffer ", name,
                         " is missing or not what the optimizer's state layout says"));
      }
      infos.push_back(info);
      bytes.push_back(files_[r]->Bytes(*info).data());
    }
    for (size_t i = 0; i < state.tensors.size(); ++i) {
      const TensorState& t = state.tensors[i];
      if (t.kind == TensorState::Kind::kNone || share->whole[i] == kTiedWte) continue;
      Logical& l = (*out)[share->whole[i]];
      const TensorParallelSlice& slice = share->slices[i];
      const std::vector<int64_t> rows = RowMap(slice);
      const int64_t n = t.end - t.begin;
      // Slice k's values as f32 (unaligned in the file: copied out).
      const auto f32 = [&](size_t k) {
        const TensorState::Slice& s = t.slices[k];
        std::vector<float> v(static_cast<size_t>(s.numel));
        std::memcpy(v.data(), bytes[s.buffer] + s.offset * sizeof(float), v.size() * sizeof(float));
        return v;
      };
      // One value per element of [t.begin, t.end) into `to`.
      const auto place = [&](const std::vector<float>& values, std::vector<float>& to,
                             std::vector<uint8_t>& seen) {
        for (int64_t e = t.begin; e < t.end; ++e) {
          const int64_t g = WholeElement(slice, rows, e);
          if (g < 0) continue;
          to[g] = values[e - t.begin];
          seen[g] = 1;
        }
      };
      switch (t.kind) {
        case TensorState::Kind::kFp32Moments:
          place(f32(0), l.m, l.seen_m);
          place(f32(1), l.v, l.seen_v);
          break;
        case TensorState::Kind::kQuantizedMoments: {
          const int64_t block = config.quant_block_size();
          const int64_t blocks = NumQuantBlocks(n, block);
          std::vector<uint8_t> codes(static_cast<size_t>(n));
          std::vector<float> values(static_cast<size_t>(n));
          for (const auto& [c, a, map, to, seen] :
               {std::tuple{size_t{0}, size_t{2}, DynamicMap::kSigned, &l.m, &l.seen_m},
                std::tuple{size_t{1}, size_t{3}, DynamicMap::kUnsigned, &l.v, &l.seen_v}}) {
            std::memcpy(codes.data(), bytes[t.slices[c].buffer] + t.slices[c].offset, codes.size());
            std::vector<float> absmax = f32(a);
            ZT_RETURN_IF_ERROR(
                BlockDequantize(ctx, {.codes = Tensor(codes.data(), DType::kU8, {n}),
                                      .absmax = Tensor(absmax.data(), DType::kF32, {blocks}),
                                      .dst = Tensor(values.data(), DType::kF32, {n}),
                                      .block = block,
                                      .map = map}));
            place(values, *to, *seen);
          }
          break;
        }
        case TensorState::Kind::kFactored: {
          const std::vector<float> row = f32(0), col = f32(1);
          for (size_t k = 0; k < rows.size(); ++k) {
            if (rows[k] < 0) continue;
            l.row[rows[k]] = row[k];
            l.seen_row[rows[k]] = 1;
          }
          for (int64_t c = 0; c < slice.local_cols; ++c) {
            l.col[slice.col_begin + c] = col[c];
            l.seen_col[slice.col_begin + c] = 1;
          }
          if (t.slices.size() > 2) place(f32(2), l.m, l.seen_m);
          break;
        }
        case TensorState::Kind::kFull:
          place(f32(0), l.v, l.seen_v);
          if (t.slices.size() > 1) place(f32(1), l.m, l.seen_m);
          break;
        default:
          return absl::InternalError("resharding: an optimizer state of another kind");
      }
    }
    for (const SafetensorsTensorInfo* info : infos) files_[r]->Release(*info);
  }
  // Every statistic the optimizer keeps for the whole unit came from some saved share.
  const bool first_moment = config.type() == Opt::ADAMW_8BIT || config.adafactor().beta1() > 0;
  const auto all = [](const std::vector<uint8_t>& seen) {
    return std::all_of(seen.begin(), seen.end(), [](uint8_t s) { return s != 0; });
  };
  for (const Logical& l : *out) {
    if (!found || (first_moment && !all(l.seen_m)) || !all(l.seen_v) || !all(l.seen_row) ||
        !all(l.seen_col)) {
      return absl::DataLossError(absl::StrCat("checkpoint: the saved ranks do not hold the ",
                                              "optimizer state of every tensor of ", unit.name,
                                              adapters ? "'s adapters" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status LogicalOptimizerState::Fill(const zerotrain::JobSpec& job, int rank,
                                         const UnitLayout& unit, bool adapters,
                                         const std::function<bool(const std::string&)>& wanted,
                                         const Arenas& into) {
  const std::optional<Share> share = ShareOf(job, rank, unit, adapters);
  if (!share) {
    return absl::InternalError(absl::StrCat("resharding: rank ", rank, " holds no ", unit.name));
  }
  std::vector<Logical> logical, wte;
  ZT_RETURN_IF_ERROR(Join(unit, adapters, &logical));
  const ModelLayout model = BuildModelLayout(job.model());
  if (std::find(share->whole.begin(), share->whole.end(), kTiedWte) != share->whole.end()) {
    ZT_RETURN_IF_ERROR(Join(model.embedding(), false, &wte));
  }
  const int wte_index =
      static_cast<int>(model.embedding().Find("wte") - model.embedding().params.data());
  const zerotrain::OptimizerConfig& config = job.optimizer();
  const UnitOptimizerState want = OptimizerStateFor(config, share->unit, share->range);
  // The wanted buffers (nullptr: another read's), zeroed: padding elements stay 0.
  std::vector<uint8_t*> dst;
  for (const UnitOptimizerState::Buffer& b : want.buffers) {
    const std::string name = absl::StrCat(share->unit.name, ".", b.name);
    if (!wanted(name)) {
      dst.push_back(nullptr);
      continue;
    }
    ZT_ASSIGN_OR_RETURN(Tensor t, into.Get(name));
    if (t.dtype() != b.dtype || t.numel() < b.numel) {
      return absl::InternalError(absl::StrCat("resharding: the plan's buffer ", name,
                                              " is not the optimizer's state layout"));
    }
    std::memset(t.raw(), 0, static_cast<size_t>(t.size_bytes()));
    dst.push_back(static_cast<uint8_t*>(t.raw()));
  }
  // A padding row's (and element's) second moment: a zero gradient's, eps1 (Adafactor) or 0.
  const float padding_v = config.type() == Opt::ADAFACTOR ? config.adafactor().eps1() : 0.0f;
  const DeviceContext ctx = CpuContext(1);
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const TensorState& t = want.tensors[i];
    if (t.kind == TensorState::Kind::kNone) continue;
    const Logical& l = share->whole[i] == kTiedWte ? wte[wte_index] : logical[share->whole[i]];
    const TensorParallelSlice& slice = share->slices[i];
    const std::vector<int64_t> rows = RowMap(slice);
    const int64_t n = t.end - t.begin;
    const auto write = [&](size_t k, const void* from, int64_t size) {
      const TensorState::Slice& s = t.slices[k];
      if (dst[s.buffer] == nullptr) return;
      std::memcpy(dst[s.buffer] + s.offset * DTypeSize(want.buffers[s.buffer].dtype), from,
                  static_cast<size_t>(size));
    };
    // The share's elements [t.begin, t.end) of a per-element state.
    const auto gather = [&](const std::vector<float>& from, float padding) {
      std::vector<float> out(static_cast<size_t>(n));
      for (int64_t e = t.begin; e < t.end; ++e) {
        const int64_t g = WholeElement(slice, rows, e);
        out[e - t.begin] = g < 0 ? padding : from[g];
      }
      return out;
    };
    switch (t.kind) {
      case TensorState::Kind::kFp32Moments:
        write(0, gather(l.m, 0.0f).data(), n * 4);
        write(1, gather(l.v, padding_v).data(), n * 4);
        break;
      case TensorState::Kind::kQuantizedMoments: {
        const int64_t block = config.quant_block_size();
        const int64_t blocks = NumQuantBlocks(n, block);
        std::vector<uint8_t> codes(static_cast<size_t>(n));
        std::vector<float> absmax(static_cast<size_t>(blocks));
        for (const auto& [c, a, map, from] :
             {std::tuple{size_t{0}, size_t{2}, DynamicMap::kSigned, &l.m},
              std::tuple{size_t{1}, size_t{3}, DynamicMap::kUnsigned, &l.v}}) {
          std::vector<float> values = gather(*from, 0.0f);
          ZT_RETURN_IF_ERROR(
              BlockQuantize(ctx, {.src = Tensor(values.data(), DType::kF32, {n}),
                                  .codes = Tensor(codes.data(), DType::kU8, {n}),
                                  .absmax = Tensor(absmax.data(), DType::kF32, {blocks}),
                                  .block = block,
                                  .map = map}));
          write(c, codes.data(), n);
          write(a, absmax.data(), blocks * 4);
        }
        break;
      }
      case TensorState::Kind::kFactored: {
        std::vector<float> row(rows.size()), col(static_cast<size_t>(slice.local_cols));
        for (size_t k = 0; k < rows.size(); ++k) row[k] = rows[k] < 0 ? padding_v : l.row[rows[k]];
        for (int64_t c = 0; c < slice.local_cols; ++c) col[c] = l.col[slice.col_begin + c];
        write(0, row.data(), static_cast<int64_t>(row.size()) * 4);
        write(1, col.data(), static_cast<int64_t>(col.size()) * 4);
        if (t.slices.size() > 2) write(2, gather(l.m, 0.0f).data(), n * 4);
        break;
      }
      case TensorState::Kind::kFull:
        write(0, gather(l.v, padding_v).data(), n * 4);
        if (t.slices.size() > 1) write(1, gather(l.m, 0.0f).data(), n * 4);
        break;
      default:
        return absl::InternalError("resharding: an optimizer state of another kind");
    }
  }
  return absl::OkStatus();
}

}  // namespace zt
