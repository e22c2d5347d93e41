#include "worker/rank_state.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/elementwise.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/param_layout.h"
#include "worker/optimizer_state_reshard.h"

namespace zt {

std::vector<const BufferSpec*> CheckpointedBuffers(const MemoryPlan& plan, bool weights_only) {
  std::vector<const BufferSpec*> out;
  for (const BufferSpec& b : plan.buffers) {
    if (IsCheckpointed(b, weights_only)) out.push_back(&b);
  }
  return out;
}

absl::Status WriteRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas,
                            bool weights_only) {
  return WriteRankState(
      path, plan,
      [&](const BufferSpec& b) -> absl::StatusOr<const void*> {
        ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(b.name));
        return static_cast<const void*>(t.raw());
      },
      weights_only);
}

absl::Status WriteRankState(const std::string& path, const MemoryPlan& plan,
                            const BufferSource& source, bool weights_only) {
  const std::vector<const BufferSpec*> buffers = CheckpointedBuffers(plan, weights_only);
  std::vector<SafetensorsTensorSpec> specs;
  for (const BufferSpec* b : buffers) {
    specs.push_back({.name = b->name, .dtype = ToStDType(b->dtype), .shape = {b->numel()}});
  }
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                      SafetensorsWriter::Create(path, std::move(specs)));
  for (const BufferSpec* b : buffers) {
    ZT_ASSIGN_OR_RETURN(const void* data, source(*b));
    ZT_RETURN_IF_ERROR(
        writer->Write(b->name, absl::Span<const uint8_t>(static_cast<const uint8_t*>(data),
                                                         static_cast<size_t>(b->bytes()))));
  }
  return writer->Finish();
}

absl::Status ReadRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas,
                           bool weights_only) {
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  for (const BufferSpec* b : CheckpointedBuffers(plan, weights_only)) {
    const SafetensorsTensorInfo* info = file->Find(b->name);
    if (info == nullptr || info->dtype != ToStDType(b->dtype) || info->nbytes() != b->bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint file '", path, "': buffer ", b->name,
          info == nullptr ? " is missing" : " has another dtype or size",
          " — it was written for another parallel layout or model; resuming on another layout "
          "(resharding) is not supported yet"));
    }
    ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(b->name));
    const absl::Span<const uint8_t> bytes = file->Bytes(*info);
    std::memcpy(t.raw(), bytes.data(), bytes.size());
    file->Release(*info);
  }
  return absl::OkStatus();
}

namespace {

// Where one checkpointed buffer lies in its unit: elements [begin, end) of the unit, in unit
// order, starting at element 0 of the buffer.
struct UnitSegment {
  int64_t begin = 0;
  int64_t end = 0;
};

// The unit index and role ("params", "master", "adam_m", ...) of buffer "<unit>.<role>".
bool SplitName(const ModelLayout& layout, const std::string& name, int* unit, std::string* role) {
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const std::string prefix = layout.units[u].name + ".";
    if (name.starts_with(prefix)) {
      *unit = static_cast<int>(u);
      *role = name.substr(prefix.size());
      return true;
    }
  }
  return false;
}

// Buffers that hold one value per element of a range of the unit, in unit order.
bool IsUnitRange(const std::string& role) {
  return role == "params" || role == "master" || role == "master_low";
}

// The segment of `role` of unit `u` on `rank` of `job`.
UnitSegment SegmentOf(const zerotrain::JobSpec& job, int rank, const UnitLayout& unit,
                      const std::string& role) {
  const int stage = job.parallel().zero_stage();
  const UnitShard shard = ShardOf(unit.numel, GeometryOf(job, rank));
  const bool sharded = role == "params" ? stage >= 3 : stage >= 1;
  if (!sharded) return {0, unit.numel};
  return {shard.owned.begin, shard.owned.end};
}

}  // namespace

namespace {

// Elements [begin, end) of buffer "<unit>.<role>" as the saved ranks hold them: their bytes,
// gathered from each saved rank whose range overlaps, and their dtype, one of `dtypes`.
absl::Status ReadSavedRange(const zerotrain::JobSpec& saved_job,
                            const std::function<std::string(int)>& rank_file,
                            const UnitLayout& unit, const std::string& role, int64_t begin,
                            int64_t end, std::initializer_list<DType> dtypes, DType* dtype,
                            std::vector<uint8_t>* out) {
  const std::string name = absl::StrCat(unit.name, ".", role);
  out->clear();
  int64_t covered = begin;
  for (int r = 0; r < saved_job.parallel().world_size() && covered < end; ++r) {
    const UnitSegment have = SegmentOf(saved_job, r, unit, role);
    const int64_t lo = std::max(covered, have.begin), hi = std::min(end, have.end);
    if (lo >= hi) continue;
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(rank_file(r)));
    const SafetensorsTensorInfo* info = file->Find(name);
    if (info == nullptr) {
      return absl::DataLossError(
          absl::StrCat("checkpoint file '", file->path(), "' has no buffer ", name));
    }
    std::optional<DType> found;
    for (DType d : dtypes) {
      if (ToStDType(d) == info->dtype) found = d;
    }
    if (!found || (out->size() > 0 && *found != *dtype) ||
        DTypeSize(*found) * (hi - have.begin) > info->nbytes()) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", file->path(), "': buffer ", name,
          found ? " is shorter than its layout says" : " has a dtype its job cannot have"));
    }
    *dtype = *found;
    const absl::Span<const uint8_t> bytes = file->Bytes(*info);
    out->insert(out->end(), bytes.begin() + (lo - have.begin) * DTypeSize(*found),
                bytes.begin() + (hi - have.begin) * DTypeSize(*found));
    covered = hi;
  }
  if (covered < end) {
    return absl::DataLossError(absl::StrCat("checkpoint: no saved rank holds elements [", covered,
                                            ", ", end, ") of ", name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadUnitRange(const zerotrain::JobSpec& saved_job,
                           const std::function<std::string(int)>& rank_file, int unit,
                           const std::string& role, int64_t begin, int64_t end, float* out) {
  const ModelLayout layout = BuildModelLayout(saved_job.model());
  if (unit < 0 || unit >= static_cast<int>(layout.units.size()) || begin < 0 || begin > end ||
      end > layout.units[unit].numel || (role != "master" && role != "params")) {
    return absl::InvalidArgumentError(absl::StrCat("ReadUnitRange: unit ", unit, " role '", role,
                                                   "' range [", begin, ", ", end,
                                                   ") is outside the model"));
  }
  const UnitLayout& u = layout.units[unit];
  const Tensor dst(out, DType::kF32, {end - begin});
  // The bytes are unaligned in general: they are viewed through copies of the range.
  std::vector<uint8_t> bytes;
  DType dtype = DType::kF32;
  if (role == "master" && saved_job.precision().split_master_weights()) {
    // A split master: the bf16 parameters are its high halves, "master_low" the rest.
    std::vector<uint8_t> low;
    DType low_dtype = DType::kI16;
    ZT_RETURN_IF_ERROR(ReadSavedRange(saved_job, rank_file, u, "params", begin, end, {DType::kBF16},
                                      &dtype, &bytes));
    ZT_RETURN_IF_ERROR(ReadSavedRange(saved_job, rank_file, u, "master_low", begin, end,
                                      {DType::kI16}, &low_dtype, &low));
    return JoinMasterWeights(CpuContext(1), Tensor(bytes.data(), DType::kBF16, {end - begin}),
                             Tensor(low.data(), DType::kI16, {end - begin}), dst);
  }
  // The weights are stored as f32 (master, or fp32 parameters) or the 16-bit parameters.
  ZT_RETURN_IF_ERROR(ReadSavedRange(saved_job, rank_file, u, role, begin, end,
                                    {DType::kF32, DType::kBF16, DType::kF16}, &dtype, &bytes));
  return Cast(CpuContext(1), Tensor(bytes.data(), dtype, {end - begin}), dst);
}

absl::Status ReshardRankState(const zerotrain::JobSpec& saved_job,
                              const std::function<std::string(int)>& rank_file,
                              const zerotrain::JobSpec& job, int rank, const MemoryPlan& plan,
                              const Arenas& arenas, bool weights_only) {
  const ModelLayout layout = BuildModelLayout(job.model());
  const int saved_ranks = saved_job.parallel().world_size();
  SavedRankFiles saved(saved_job, rank_file);
  std::vector<bool> states_done(layout.units.size(), false);
  for (const BufferSpec* b : CheckpointedBuffers(plan, weights_only)) {
    int u = -1;
    std::string role;
    if (!SplitName(layout, b->name, &u, &role)) {
      return absl::InternalError(
          absl::StrCat("resharding a checkpoint: buffer ", b->name, " belongs to no unit"));
    }
    if (!IsUnitRange(role)) {
      // The unit's optimizer states are laid out per tensor (8-bit blocks, Adafactor's
      // factored statistics): all of them at once, tensor by tensor.
      if (!states_done[u]) {
        ZT_RETURN_IF_ERROR(ReshardUnitOptimizerState(saved, job, rank, layout.units[u], arenas));
        states_done[u] = true;
      }
      continue;
    }
    const UnitSegment want = SegmentOf(job, rank, layout.units[u], role);
    ZT_ASSIGN_OR_RETURN(Tensor dst, arenas.Get(b->name));
    const int64_t element = DTypeSize(b->dtype);
    auto* out = static_cast<uint8_t*>(dst.raw());
    for (int r = 0; r < saved_ranks && want.begin < want.end; ++r) {
      const UnitSegment have = SegmentOf(saved_job, r, layout.units[u], role);
      const int64_t lo = std::max(want.begin, have.begin), hi = std::min(want.end, have.end);
      if (lo >= hi) continue;
      ZT_ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes,
                          saved.Buffer(r, b->name, b->dtype, hi - have.begin));
      std::memcpy(out + (lo - want.begin) * element, bytes.data() + (lo - have.begin) * element,
                  static_cast<size_t>((hi - lo) * element));
      // A saved rank that held the whole wanted range (replicated buffers): done.
      if (lo == want.begin && hi == want.end) break;
    }
  }
  return absl::OkStatus();
}

}  // namespace zt
