#include "worker/checkpoint/optimizer_state_reshard.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/quantization.h"
#include "kernels/status_macros.h"
#include "worker/plan/memory_plan.h"

namespace zt {

SavedRankFiles::SavedRankFiles(const zerotrain::JobSpec& saved_job,
                               std::function<std::string(int)> rank_file)
    : job_(saved_job),
      rank_file_(std::move(rank_file)),
      files_(std::max(1, saved_job.parallel().world_size())) {}

absl::StatusOr<absl::Span<const uint8_t>> SavedRankFiles::Buffer(int rank, const std::string& name,
                                                                 DType dtype, int64_t min_numel) {
  if (rank < 0 || rank >= static_cast<int>(files_.size())) {
    return absl::InternalError(absl::StrCat("saved rank ", rank, " is outside the checkpoint's ",
                                            files_.size(), " ranks"));
  }
  if (files_[rank] == nullptr) {
    ZT_ASSIGN_OR_RETURN(files_[rank], SafetensorsFile::Open(rank_file_(rank)));
  }
  const SafetensorsFile& file = *files_[rank];
  const SafetensorsTensorInfo* info = file.Find(name);
  if (info == nullptr || info->dtype != ToStDType(dtype) ||
      info->nbytes() < min_numel * DTypeSize(dtype)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint file '", file.path(), "': buffer ", name,
                     info == nullptr ? " is missing" : " has another dtype or is too short",
                     " for the layout its manifest names"));
  }
  return file.Bytes(*info);
}

FlatRange OptimizerRangeOf(const zerotrain::JobSpec& job, int rank, const UnitLayout& unit) {
  if (job.parallel().zero_stage() < 1) return {0, unit.numel};
  return ShardOfUnit(unit, ParallelLayout::ForJob(job, rank).shard()).owned;
}

namespace {

// One saved rank's optimizer state of the unit: which part of each tensor it covers and
// where each slice lies in its buffers.
struct SavedRank {
  int rank = 0;
  UnitOptimizerState state;
};

class UnitResharder {
 public:
  UnitResharder(SavedRankFiles& saved, const zerotrain::JobSpec& job, const UnitLayout& unit)
      : saved_(saved), config_(job.optimizer()), unit_(unit) {
    // The first shard group holds every element once; the other groups are its replicas.
    // Unsharded (stage 0) ranks each hold the whole unit, so rank 0 alone answers.
    const int ranks =
        saved.job().parallel().zero_stage() < 1 ? 1 : ParallelLayout::ForJob(saved.job(), 0).shard().group_size;
    for (int r = 0; r < ranks; ++r) {
      saved_ranks_.push_back(
          {r, OptimizerStateFor(config_, unit, OptimizerRangeOf(saved.job(), r, unit))});
    }
  }

  absl::Status Fill(const UnitOptimizerState& want, const std::vector<Tensor>& dst) {
    for (size_t i = 0; i < want.tensors.size(); ++i) {
      const TensorState& t = want.tensors[i];
      switch (t.kind) {
        case TensorState::Kind::kFp32Moments:
        case TensorState::Kind::kMomentum:
        case TensorState::Kind::kFull:
          for (size_t k = 0; k < t.slices.size(); ++k) {
            ZT_RETURN_IF_ERROR(CopyElementwise(i, k, t, dst));
          }
          break;
        case TensorState::Kind::kFactored:
          ZT_RETURN_IF_ERROR(CopyWhole(i, t, dst));
          if (t.slices.size() > 2) ZT_RETURN_IF_ERROR(CopyElementwise(i, 2, t, dst));
          break;
        case TensorState::Kind::kQuantizedMoments:
          // m on the signed map, v ≥ 0 on the unsigned one (kernels/adam8bit.h).
          ZT_RETURN_IF_ERROR(Requantize(i, /*codes=*/0, /*absmax=*/2, DynamicMap::kSigned, t, dst));
          ZT_RETURN_IF_ERROR(
              Requantize(i, /*codes=*/1, /*absmax=*/3, DynamicMap::kUnsigned, t, dst));
          break;
        case TensorState::Kind::kStateless:
        case TensorState::Kind::kNone:
          break;
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string TensorName(size_t i) const {
    return absl::StrCat(unit_.name, ".", unit_.params[i].name);
  }

  // Saved rank `s`'s state of tensor i, checked to be of the kind the new layout has.
  absl::StatusOr<const TensorState*> SavedTensor(const SavedRank& s, size_t i,
                                                 TensorState::Kind kind) const {
    const TensorState& st = s.state.tensors[i];
    if (st.kind != TensorState::Kind::kNone && st.kind != kind) {
      return absl::DataLossError(absl::StrCat("resharding a checkpoint: saved rank ", s.rank,
                                              " keeps another kind of optimizer "
                                              "state for ",
                                              TensorName(i),
                                              " than this optimizer configuration gives it"));
    }
    return &st;
  }

  // The bytes of slice k of a saved tensor state, whole.
  absl::StatusOr<const uint8_t*> SavedSlice(const SavedRank& s, const TensorState& st, size_t k) {
    const TensorState::Slice& slice = st.slices[k];
    const UnitOptimizerState::Buffer& b = s.state.buffers[slice.buffer];
    ZT_ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes,
                        saved_.Buffer(s.rank, absl::StrCat(unit_.name, ".", b.name), b.dtype,
                                      slice.offset + slice.numel));
    return bytes.data() + slice.offset * DTypeSize(b.dtype);
  }

  static uint8_t* DstSlice(const TensorState& t, size_t k, const std::vector<Tensor>& dst) {
    const TensorState::Slice& slice = t.slices[k];
    const Tensor& buffer = dst[slice.buffer];
    return static_cast<uint8_t*>(buffer.raw()) + slice.offset * DTypeSize(buffer.dtype());
  }

  absl::Status Uncovered(size_t i, int64_t from, int64_t to) const {
    return absl::DataLossError(absl::StrCat("resharding a checkpoint: no saved rank holds the ",
                                            "optimizer state of elements [", from, ", ", to,
                                            ") of ", TensorName(i)));
  }

  // Slice k holds one f32 per element of the tensor's part [t.begin, t.end).
  absl::Status CopyElementwise(size_t i, size_t k, const TensorState& t,
                               const std::vector<Tensor>& dst) {
    uint8_t* out = DstSlice(t, k, dst);
    int64_t covered = t.begin;
    for (const SavedRank& s : saved_ranks_) {
      ZT_ASSIGN_OR_RETURN(const TensorState* st, SavedTensor(s, i, t.kind));
      const int64_t lo = std::max(covered, st->begin), hi = std::min(t.end, st->end);
      if (st->kind == TensorState::Kind::kNone || lo >= hi) continue;
      ZT_ASSIGN_OR_RETURN(const uint8_t* in, SavedSlice(s, *st, k));
      std::memcpy(out + (lo - t.begin) * sizeof(float), in + (lo - st->begin) * sizeof(float),
                  static_cast<size_t>(hi - lo) * sizeof(float));
      covered = hi;
      if (covered == t.end) return absl::OkStatus();
    }
    return Uncovered(i, covered, t.end);
  }

  // Adafactor's row and column statistics (slices 0 and 1) are the whole tensor's on every
  // rank that holds part of it.
  absl::Status CopyWhole(size_t i, const TensorState& t, const std::vector<Tensor>& dst) {
    for (const SavedRank& s : saved_ranks_) {
      ZT_ASSIGN_OR_RETURN(const TensorState* st, SavedTensor(s, i, t.kind));
      if (st->kind == TensorState::Kind::kNone) continue;
      for (size_t k = 0; k < 2; ++k) {
        if (st->slices[k].numel != t.slices[k].numel) {
          return absl::DataLossError(absl::StrCat("resharding a checkpoint: saved rank ", s.rank,
                                                  " has ", st->slices[k].numel, " factored ",
                                                  k == 0 ? "row" : "column", " statistics for ",
                                                  TensorName(i), ", expected ", t.slices[k].numel));
        }
        ZT_ASSIGN_OR_RETURN(const uint8_t* in, SavedSlice(s, *st, k));
        std::memcpy(DstSlice(t, k, dst), in, static_cast<size_t>(t.slices[k].numel) * 4);
      }
      return absl::OkStatus();
    }
    return Uncovered(i, t.begin, t.end);
  }

  // Codes in slice `codes` (one u8 per element of [t.begin, t.end)), absmax in slice `absmax`
  // (one f32 per block of quant_block_size from t.begin).
  absl::Status Requantize(size_t i, size_t codes, size_t absmax, DynamicMap map,
                          const TensorState& t, const std::vector<Tensor>& dst) {
    const int64_t block = config_.quant_block_size();
    // Where each saved rank's part of the tensor lies in its file, found once per tensor.
    struct Part {
      int64_t begin = 0, end = 0;
      const uint8_t* codes = nullptr;
      const uint8_t* absmax = nullptr;  // unaligned f32
    };
    std::vector<Part> parts;
    for (const SavedRank& s : saved_ranks_) {
      ZT_ASSIGN_OR_RETURN(const TensorState* st, SavedTensor(s, i, t.kind));
      if (st->kind == TensorState::Kind::kNone || st->end <= t.begin || st->begin >= t.end) {
        continue;
      }
      Part p{.begin = st->begin, .end = st->end};
      ZT_ASSIGN_OR_RETURN(p.codes, SavedSlice(s, *st, codes));
      ZT_ASSIGN_OR_RETURN(p.absmax, SavedSlice(s, *st, absmax));
      parts.push_back(p);
    }
    uint8_t* out_codes = DstSlice(t, codes, dst);
    auto* out_absmax = reinterpret_cast<float*>(DstSlice(t, absmax, dst));
    const DeviceContext ctx = CpuContext(1);
    std::vector<float> values(block), dequantized(2 * block), saved_absmax(2);
    std::vector<uint8_t> saved_codes(2 * block);
    for (int64_t b0 = t.begin, j = 0; b0 < t.end; b0 += block, ++j) {
      const int64_t b1 = std::min(b0 + block, t.end);
      // A saved block with the same elements holds exactly what this one would.
      const auto same = std::find_if(parts.begin(), parts.end(), [&](const Part& p) {
        return p.begin <= b0 && b0 < p.end && (b0 - p.begin) % block == 0 &&
               std::min(b0 + block, p.end) == b1;
      });
      if (same != parts.end()) {
        std::memcpy(out_codes + (b0 - t.begin), same->codes + (b0 - same->begin),
                    static_cast<size_t>(b1 - b0));
        std::memcpy(out_absmax + j, same->absmax + (b0 - same->begin) / block * sizeof(float),
                    sizeof(float));
        continue;
      }
      int64_t covered = b0;
      for (const Part& p : parts) {
        const int64_t lo = std::max(covered, p.begin), hi = std::min(b1, p.end);
        if (lo >= hi) continue;
        // The saved blocks k0..k1 (at most two: one block never spans more than two of the
        // same size) hold elements [lo, hi): [e0, e1) in the tensor.
        const int64_t k0 = (lo - p.begin) / block, k1 = (hi - 1 - p.begin) / block;
        const int64_t e0 = p.begin + k0 * block, e1 = std::min(p.begin + (k1 + 1) * block, p.end);
        std::memcpy(saved_codes.data(), p.codes + (e0 - p.begin), static_cast<size_t>(e1 - e0));
        std::memcpy(saved_absmax.data(), p.absmax + k0 * sizeof(float),
                    static_cast<size_t>(k1 - k0 + 1) * sizeof(float));
        ZT_RETURN_IF_ERROR(
            BlockDequantize(ctx, {.codes = Tensor(saved_codes.data(), DType::kU8, {e1 - e0}),
                                  .absmax = Tensor(saved_absmax.data(), DType::kF32, {k1 - k0 + 1}),
                                  .dst = Tensor(dequantized.data(), DType::kF32, {e1 - e0}),
                                  .block = block,
                                  .map = map}));
        std::copy(dequantized.begin() + (lo - e0), dequantized.begin() + (hi - e0),
                  values.begin() + (lo - b0));
        covered = hi;
      }
      if (covered < b1) return Uncovered(i, covered, b1);
      ZT_RETURN_IF_ERROR(
          BlockQuantize(ctx, {.src = Tensor(values.data(), DType::kF32, {b1 - b0}),
                              .codes = Tensor(out_codes + (b0 - t.begin), DType::kU8, {b1 - b0}),
                              .absmax = Tensor(out_absmax + j, DType::kF32, {1}),
                              .block = block,
                              .map = map}));
    }
    return absl::OkStatus();
  }

  SavedRankFiles& saved_;
  const zerotrain::OptimizerConfig& config_;
  const UnitLayout& unit_;
  std::vector<SavedRank> saved_ranks_;
};

}  // namespace

absl::Status ReshardUnitOptimizerState(SavedRankFiles& saved, const zerotrain::JobSpec& job,
                                       int rank, const UnitLayout& unit, const Arenas& arenas) {
  const UnitOptimizerState want =
      OptimizerStateFor(job.optimizer(), unit, OptimizerRangeOf(job, rank, unit));
  std::vector<Tensor> dst;
  for (const UnitOptimizerState::Buffer& b : want.buffers) {
    ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(absl::StrCat(unit.name, ".", b.name)));
    if (t.dtype() != b.dtype || t.numel() != b.numel) {
      return absl::InternalError(absl::StrCat("resharding a checkpoint: the plan's buffer ",
                                              unit.name, ".", b.name,
                                              " disagrees with the optimizer's state layout"));
    }
    dst.push_back(t);
  }
  UnitResharder resharder(saved, job, unit);
  return resharder.Fill(want, dst);
}

}  // namespace zt
