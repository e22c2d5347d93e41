#include "worker/checkpoint/rank_state.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/elementwise.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/param_layout.h"
#include "worker/checkpoint/optimizer_state_reshard.h"
#include "worker/plan/lora_plan.h"

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
  const UnitShard shard = ShardOfUnit(unit, ParallelLayout::ForJob(job, rank).shard());
  const bool sharded = role == "params" ? stage >= 3 : stage >= 1;
  if (!sharded) return {0, unit.numel};
  return {shard.owned.begin, shard.owned.end};
}

}  // namespace

namespace {

// Elements [begin, end) of buffer "<unit>.<role>" as the saved ranks hold them, read in order
// from each saved rank whose range overlaps. Next() copies the following elements out and
// drops the mapped pages it has passed, so a streaming reader holds its chunk, not the files.
class SavedRangeReader {
 public:
  // DataLoss naming the file when a saved rank lacks the buffer, stores it in a dtype outside
  // `dtypes` (or another one than the ranks before it), or holds fewer elements than its
  // layout says; or when no saved rank holds part of the range.
  static absl::StatusOr<SavedRangeReader> Open(const zerotrain::JobSpec& saved_job,
                                               const std::function<std::string(int)>& rank_file,
                                               const UnitLayout& unit, const std::string& role,
                                               int64_t begin, int64_t end,
                                               std::initializer_list<DType> dtypes) {
    const std::string name = absl::StrCat(unit.name, ".", role);
    SavedRangeReader reader;
    int64_t covered = begin;
    for (int r = 0; r < saved_job.parallel().world_size() && covered < end; ++r) {
      const UnitSegment have = SegmentOf(saved_job, r, unit, role);
      const int64_t lo = std::max(covered, have.begin), hi = std::min(end, have.end);
      if (lo >= hi) continue;
      ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                          SafetensorsFile::Open(rank_file(r)));
      const SafetensorsTensorInfo* info = file->Find(name);
      if (info == nullptr) {
        return absl::DataLossError(
            absl::StrCat("checkpoint file '", file->path(), "' has no buffer ", name));
      }
      std::optional<DType> found;
      for (DType d : dtypes) {
        if (ToStDType(d) == info->dtype) found = d;
      }
      if (!found || (!reader.pieces_.empty() && *found != reader.dtype_) ||
          DTypeSize(*found) * (hi - have.begin) > info->nbytes()) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint file '", file->path(), "': buffer ", name,
            found ? " is shorter than its layout says" : " has a dtype its job cannot have"));
      }
      reader.dtype_ = *found;
      const int64_t size = DTypeSize(*found);
      const absl::Span<const uint8_t> bytes =
          file->Bytes(*info).subspan((lo - have.begin) * size, (hi - lo) * size);
      reader.pieces_.push_back({std::move(file), bytes});
      covered = hi;
    }
    if (covered < end) {
      return absl::DataLossError(absl::StrCat("checkpoint: no saved rank holds elements [", covered,
                                              ", ", end, ") of ", name));
    }
    return reader;
  }

  DType dtype() const { return dtype_; }

  // Copies the next `n` elements (n · DTypeSize(dtype()) bytes) into `out`; the caller asks
  // for no more than the range holds.
  void Next(int64_t n, uint8_t* out) {
    int64_t want = n * DTypeSize(dtype_);
    while (want > 0) {
      Piece& p = pieces_[piece_];
      const int64_t take = std::min<int64_t>(want, p.bytes.size() - offset_);
      std::memcpy(out, p.bytes.data() + offset_, take);
      out += take;
      want -= take;
      offset_ += take;
      // Release up to where this piece has been read; a page cut by that point stays until
      // the next call passes it (released_ then starts on a page boundary).
      p.file->Release(p.bytes.subspan(released_, offset_ - released_));
      const auto page = static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
      const auto address = reinterpret_cast<uintptr_t>(p.bytes.data() + offset_);
      released_ = std::max<int64_t>(released_, offset_ - static_cast<int64_t>(address % page));
      if (offset_ == static_cast<int64_t>(p.bytes.size())) {
        ++piece_;
        offset_ = released_ = 0;
      }
    }
  }

 private:
  struct Piece {
    std::unique_ptr<SafetensorsFile> file;
    absl::Span<const uint8_t> bytes;  // the range's part in this file
  };
  std::vector<Piece> pieces_;
  DType dtype_ = DType::kF32;
  size_t piece_ = 0;
  int64_t offset_ = 0;    // bytes of pieces_[piece_] read
  int64_t released_ = 0;  // bytes of pieces_[piece_] whose pages were released
};

// Elements converted per chunk by ReadUnitRange: 1 MiB of f32 values, so the raw copy it
// converts from stays small next to the caller's output.
constexpr int64_t kReadChunk = int64_t{1} << 18;

}  // namespace

absl::Status ReadUnitRange(const zerotrain::JobSpec& saved_job,
                           const std::function<std::string(int)>& rank_file, int unit,
                           const std::string& role, int64_t begin, int64_t end, float* out) {
  if (saved_job.parallel().tensor_parallel() > 1 || saved_job.parallel().pipeline_parallel() > 1) {
    // Its rank files hold shares of their stage's units, not ranges of whole units.
    return absl::FailedPreconditionError(
        absl::StrCat("ReadUnitRange: the checkpoint was written at parallel.tensor_parallel ",
                     saved_job.parallel().tensor_parallel(), ", pipeline_parallel ",
                     saved_job.parallel().pipeline_parallel(),
                     "; its weights are read whole (ReadWholeUnitFromShares)"));
  }
  const ModelLayout layout = BuildModelLayout(saved_job.model());
  if (unit < 0 || unit >= static_cast<int>(layout.units.size()) || begin < 0 || begin > end ||
      end > layout.units[unit].numel || (role != "master" && role != "params")) {
    return absl::InvalidArgumentError(absl::StrCat("ReadUnitRange: unit ", unit, " role '", role,
                                                   "' range [", begin, ", ", end,
                                                   ") is outside the model"));
  }
  const UnitLayout& u = layout.units[unit];
  const DeviceContext ctx = CpuContext(1);
  // The saved bytes are unaligned in general: each chunk is viewed through an aligned copy.
  std::vector<uint32_t> chunk, low_chunk;
  if (role == "master" && saved_job.precision().split_master_weights()) {
    // A split master: the bf16 parameters are its high halves, "master_low" the rest.
    ZT_ASSIGN_OR_RETURN(
        SavedRangeReader high,
        SavedRangeReader::Open(saved_job, rank_file, u, "params", begin, end, {DType::kBF16}));
    ZT_ASSIGN_OR_RETURN(
        SavedRangeReader low,
        SavedRangeReader::Open(saved_job, rank_file, u, "master_low", begin, end, {DType::kI16}));
    for (int64_t at = begin; at < end; at += kReadChunk) {
      const int64_t n = std::min(kReadChunk, end - at);
      chunk.resize((n + 1) / 2);
      low_chunk.resize((n + 1) / 2);
      high.Next(n, reinterpret_cast<uint8_t*>(chunk.data()));
      low.Next(n, reinterpret_cast<uint8_t*>(low_chunk.data()));
      ZT_RETURN_IF_ERROR(JoinMasterWeights(ctx, Tensor(chunk.data(), DType::kBF16, {n}),
                                           Tensor(low_chunk.data(), DType::kI16, {n}),
                                           Tensor(out + (at - begin), DType::kF32, {n})));
    }
    return absl::OkStatus();
  }
  // The weights are stored as f32 (master, or fp32 parameters) or the 16-bit parameters.
  ZT_ASSIGN_OR_RETURN(SavedRangeReader reader,
                      SavedRangeReader::Open(saved_job, rank_file, u, role, begin, end,
                                             {DType::kF32, DType::kBF16, DType::kF16}));
  for (int64_t at = begin; at < end; at += kReadChunk) {
    const int64_t n = std::min(kReadChunk, end - at);
    chunk.resize(n);
    reader.Next(n, reinterpret_cast<uint8_t*>(chunk.data()));
    ZT_RETURN_IF_ERROR(Cast(ctx, Tensor(chunk.data(), reader.dtype(), {n}),
                            Tensor(out + (at - begin), DType::kF32, {n})));
  }
  return absl::OkStatus();
}

namespace {

// Bytes [lo, hi) of unit `unit`'s flat quantized bytes (QuantizedBytesOf) as the checkpoint of
// `saved_job` holds them: from the saved ranks' "<unit>.qbase" shards when it was saved at
// stage 3, else from saved rank 0's whole per-tensor buffers. Bytes between pieces (alignment)
// and past the last one are zero.
absl::Status ReadQuantizedBytes(SavedRankFiles& saved, const zerotrain::JobSpec& saved_job,
                                const ModelLayout& layout, const UnitLayout& unit, int64_t lo,
                                int64_t hi, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>(hi - lo));
  const QuantizedUnitBytes q = QuantizedBytesOf(layout, unit);
  if (ShardsQuantizedBase(saved_job, layout)) {
    for (int r = 0; r < saved_job.parallel().world_size(); ++r) {
      const UnitShard have = ShardOf(q.words(), ParallelLayout::ForJob(saved_job, r).shard());
      const int64_t begin = have.offset * 4, end = (have.offset + have.shard_numel) * 4;
      const int64_t a = std::max(lo, begin), z = std::min(hi, end);
      if (a >= z) continue;
      ZT_ASSIGN_OR_RETURN(
          absl::Span<const uint8_t> bytes,
          saved.Buffer(r, QuantizedShardName(unit), DType::kF32, (z - begin + 3) / 4));
      std::memcpy(out + (a - lo), bytes.data() + (a - begin), static_cast<size_t>(z - a));
    }
    return absl::OkStatus();
  }
  for (const QuantizedPiece& piece : q.pieces) {
    const int64_t a = std::max(lo, piece.offset), z = std::min(hi, piece.offset + piece.bytes);
    if (a >= z) continue;
    ZT_ASSIGN_OR_RETURN(
        absl::Span<const uint8_t> bytes,
        saved.Buffer(0, piece.name, piece.dtype, piece.bytes / DTypeSize(piece.dtype)));
    std::memcpy(out + (a - lo), bytes.data() + (a - piece.offset), static_cast<size_t>(z - a));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadQuantizedUnitBytes(const zerotrain::JobSpec& saved_job,
                                    const std::function<std::string(int)>& rank_file,
                                    const ModelLayout& layout, const UnitLayout& unit, int64_t lo,
                                    int64_t hi, uint8_t* out) {
  SavedRankFiles saved(saved_job, rank_file);
  return ReadQuantizedBytes(saved, saved_job, layout, unit, lo, hi, out);
}

absl::Status ReshardRankState(const zerotrain::JobSpec& saved_job,
                              const std::function<std::string(int)>& rank_file,
                              const zerotrain::JobSpec& job, int rank, const MemoryPlan& plan,
                              const Arenas& arenas, bool weights_only) {
  const ModelLayout layout = BuildModelLayout(job.model());
  const int saved_ranks = saved_job.parallel().world_size();
  SavedRankFiles saved(saved_job, rank_file);
  std::vector<bool> states_done(layout.units.size(), false);
  // A LoRA job: the adapters' optimizer states are those of LoraAdapterLayout's units
  // ("<block>.lora.<state>", sharded as the adapters are); the adapters themselves and a
  // quantized (NF4/INT8) base's buffers are whole on every rank below stage 3; at stage 3 the
  // base's quantized bytes are byte shards ("<unit>.qbase") resharded by range.
  const ModelLayout adapters = LoraAdapterLayout(layout);
  std::vector<bool> adapter_states_done(adapters.units.size(), false);
  for (const BufferSpec* b : CheckpointedBuffers(plan, weights_only)) {
    int u = -1;
    std::string role;
    if (layout.lora && SplitName(adapters, b->name, &u, &role)) {
      if (!adapter_states_done[u]) {
        ZT_RETURN_IF_ERROR(ReshardUnitOptimizerState(saved, job, rank, adapters.units[u], arenas));
        adapter_states_done[u] = true;
      }
      continue;
    }
    if (layout.lora && b->name.ends_with(".qbase")) {
      // Stage 3: this rank's byte range of the block's quantized bytes.
      const UnitLayout* unit = nullptr;
      for (const UnitLayout& candidate : layout.units) {
        if (QuantizedShardName(candidate) == b->name) unit = &candidate;
      }
      if (unit == nullptr) {
        return absl::InternalError(
            absl::StrCat("resharding a checkpoint: buffer ", b->name, " belongs to no unit"));
      }
      const UnitShard want = ShardOf(QuantizedBytesOf(layout, *unit).words(),
                                     ParallelLayout::ForJob(job, rank).shard());
      ZT_ASSIGN_OR_RETURN(Tensor dst, arenas.Get(b->name));
      ZT_RETURN_IF_ERROR(ReadQuantizedBytes(saved, saved_job, layout, *unit, want.offset * 4,
                                            (want.offset + want.shard_numel) * 4,
                                            static_cast<uint8_t*>(dst.raw())));
      continue;
    }
    if (layout.lora && IsQuantizedBaseBuffer(b->name) && ShardsQuantizedBase(saved_job, layout)) {
      // Below stage 3 from a stage-3 checkpoint: the piece's bytes out of the saved shards.
      for (const UnitLayout& unit : layout.units) {
        for (const QuantizedPiece& piece : QuantizedBytesOf(layout, unit).pieces) {
          if (piece.name != b->name) continue;
          ZT_ASSIGN_OR_RETURN(Tensor dst, arenas.Get(b->name));
          ZT_RETURN_IF_ERROR(ReadQuantizedBytes(saved, saved_job, layout, unit, piece.offset,
                                                piece.offset + piece.bytes,
                                                static_cast<uint8_t*>(dst.raw())));
        }
      }
      continue;
    }
    if (layout.lora && (b->name.ends_with(".lora") || IsQuantizedBaseBuffer(b->name))) {
      // Saved rank 0's copy; "<unit>.lora" is padded at stages ≥ 1, so the unit's adapters.
      int64_t n = b->numel();
      if (b->name.ends_with(".lora") && SplitName(layout, b->name, &u, &role)) {
        n = layout.units[u].lora_numel;
      }
      ZT_ASSIGN_OR_RETURN(Tensor dst, arenas.Get(b->name));
      ZT_ASSIGN_OR_RETURN(absl::Span<const uint8_t> bytes, saved.Buffer(0, b->name, b->dtype, n));
      std::memcpy(dst.raw(), bytes.data(), static_cast<size_t>(n * DTypeSize(b->dtype)));
      continue;
    }
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
