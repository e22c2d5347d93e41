#include "worker/checkpoint/lora_export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/int8_linear.h"
#include "kernels/nf4.h"
#include "kernels/status_macros.h"
#include "kernels/tensor.h"
#include "worker/checkpoint/durable_file.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/tensor_parallel_reshard.h"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/model/param_layout.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/parallel_plan.h"
#include "worker/checkpoint/rank_state.h"

namespace zt {
namespace {

std::string RankFile(const std::string& step_dir, int rank) {
  return (std::filesystem::path(step_dir) / absl::StrFormat("rank-%05d.safetensors", rank))
      .string();
}

// The f32 base weights of a LoRA checkpoint, one vector per unit of `layout`.
absl::StatusOr<std::vector<std::vector<float>>> ReadBase(const zerotrain::JobSpec& saved,
                                                         const ModelLayout& layout,
                                                         const std::string& step_dir) {
  std::vector<std::vector<float>> base;
  std::vector<float*> units;
  for (const UnitLayout& u : layout.units) {
    base.emplace_back(static_cast<size_t>(u.numel));
    units.push_back(base.back().data());
  }
  const std::string& from = saved.model().init_from();
  if (!from.empty()) {
    // Not in the checkpoint: the job reloads it from model.init_from at every start.
    ZT_RETURN_IF_ERROR(IsCheckpoint(from) ? ReadCheckpointWeights(from, saved.model(), units)
                                          : ImportHuggingFace(from, saved.model(), layout, units));
    return base;
  }
  auto rank_file = [&](int r) { return RankFile(step_dir, r); };
  for (size_t u = 0; u < layout.units.size(); ++u) {
    // A pipeline or tensor-parallel checkpoint: each unit joined from the ranks of its stage
    // (their shares; f32 bases only).
    ZT_RETURN_IF_ERROR(
        saved.parallel().pipeline_parallel() > 1 || saved.parallel().tensor_parallel() > 1
            ? ReadWholeUnitFromShares(saved, rank_file, static_cast<int>(u), "params", units[u])
            : ReadUnitRange(saved, rank_file, static_cast<int>(u), "params", 0,
                            layout.units[u].numel, units[u]));
  }
  return base;
}

// Reads one quantized-base buffer `name` of the checkpoint's rank 0 file (below ZeRO stage 3 a
// quantized base is whole on every rank) into `dst`, checking its size.
absl::Status ReadQuantizedBuffer(const SafetensorsFile& file, const std::string& name,
                                 const Tensor& dst) {
  const SafetensorsTensorInfo* info = file.Find(name);
  if (info == nullptr) {
    return absl::DataLossError(
        absl::StrCat(file.path(), " has no tensor ", name, " (a seeded quantized base is saved)"));
  }
  const absl::Span<const uint8_t> bytes = file.Bytes(*info);
  if (static_cast<int64_t>(bytes.size()) != dst.size_bytes()) {
    return absl::DataLossError(absl::StrCat(file.path(), ": ", name, " holds ", bytes.size(),
                                            " bytes, the layout needs ", dst.size_bytes()));
  }
  std::memcpy(dst.raw(), bytes.data(), bytes.size());
  return absl::OkStatus();
}

// Reads the saved quantized buffer `name` into `dst` (its whole size).
using QuantizedReader = std::function<absl::Status(const std::string& name, const Tensor& dst)>;

// A reader of the pieces of one unit's flat quantized bytes `bytes` (QuantizedBytesOf's
// `pieces`, the bytes a stage-3 checkpoint shards as "<unit>.qbase"), which must outlive it.
QuantizedReader PieceReader(const std::string& unit, const QuantizedUnitBytes& pieces,
                            const uint8_t* bytes) {
  return [unit, &pieces, bytes](const std::string& name, const Tensor& dst) -> absl::Status {
    for (const QuantizedPiece& piece : pieces.pieces) {
      if (piece.name != name || piece.bytes != dst.size_bytes()) continue;
      std::memcpy(dst.raw(), bytes + piece.offset, static_cast<size_t>(piece.bytes));
      return absl::OkStatus();
    }
    return absl::InternalError(
        absl::StrCat(name, " is no piece of ", unit, "'s quantized bytes of its size"));
  };
}

// The quantized bytes of `unit` (QuantizedBytesOf(layout, unit).words() f32 words into
// `words`) that saved rank `place` holds as its tensor-parallel share of its pipeline stage,
// joined from the "<unit>.qbase" byte shards of the members of its data-parallel group (a
// stage-3 checkpoint shards each rank's share inside its DP group: ShardOf over the member's
// geometry, the plan's LoraStateBuffers). The replicas of hybrid sharding write the same bytes.
absl::Status ReadShareQuantizedBytes(const zerotrain::JobSpec& saved,
                                     const std::function<std::string(int)>& rank_file,
                                     const ParallelLayout& place, const ModelLayout& layout,
                                     const UnitLayout& unit, std::vector<float>& words) {
  const int64_t n = QuantizedBytesOf(layout, unit).words();
  words.assign(static_cast<size_t>(n), 0.0f);
  std::vector<bool> covered(static_cast<size_t>(n), false);
  const std::string name = QuantizedShardName(unit);
  for (const int r : place.DataGroup()) {
    const UnitShard have = ShardOf(n, ParallelLayout::ForJob(saved, r).shard());
    const int64_t end = std::min(n, have.offset + have.shard_numel);
    if (have.offset >= end) continue;
    ZT_ASSIGN_OR_RETURN(const std::unique_ptr<SafetensorsFile> file,
                        SafetensorsFile::Open(rank_file(r)));
    const SafetensorsTensorInfo* info = file->Find(name);
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat(file->path(), " has no tensor ", name,
                                              " (a seeded quantized base saved at stage 3)"));
    }
    const absl::Span<const uint8_t> bytes = file->Bytes(*info);
    if (static_cast<int64_t>(bytes.size()) < (end - have.offset) * 4) {
      return absl::DataLossError(absl::StrCat(file->path(), ": ", name, " holds ", bytes.size(),
                                              " bytes, its shard needs ", (end - have.offset) * 4));
    }
    std::memcpy(words.data() + have.offset, bytes.data(),
                static_cast<size_t>((end - have.offset) * 4));
    std::fill(covered.begin() + have.offset, covered.begin() + end, true);
  }
  if (std::find(covered.begin(), covered.end(), false) != covered.end()) {
    return absl::DataLossError(absl::StrCat("checkpoint: the saved ranks of rank ", place.rank(),
                                            "'s data-parallel group leave part of ", name,
                                            " unsaved"));
  }
  return absl::OkStatus();
}

// Quantized weight p of `unit` in f32 as the job computed with it, into `values` ((numel) f32):
// with `read` its saved buffers dequantized; without, `values` (the file's weight) quantized
// as the job's start quantized it (StreamQuantizedBase), then dequantized. `layout` is the
// saving rank's: a tensor-parallel rank's NF4 share indexes the one-rank group scales
// (ModelLayout::nf4_absmax kGroupIndexed), one rank's double-quantizes its whole weight.
absl::Status DequantizedWeight(const DeviceContext& ctx, const ModelLayout& layout,
                               const UnitLayout& unit, const ParamSpec& p,
                               const QuantizedReader& read, const Tensor& values) {
  if (layout.base_quantization == BaseQuantization::kInt8) {
    const int64_t rows = p.shape[0], cols = p.shape[1];
    std::vector<uint8_t> codes(static_cast<size_t>(p.numel));
    std::vector<float> scales(static_cast<size_t>(rows));
    const Int8Weight w{.codes = Tensor(codes.data(), DType::kU8, {rows, cols}),
                       .scales = Tensor(scales.data(), DType::kF32, {rows})};
    const Tensor matrix(values.raw(), DType::kF32, {rows, cols});
    if (!read) {
      ZT_RETURN_IF_ERROR(Int8QuantizeWeight(ctx, {.src = matrix, .dst = w}));
    } else {
      const std::string prefix = Int8BufferPrefix(unit, p);
      ZT_RETURN_IF_ERROR(read(prefix + "codes", w.codes));
      ZT_RETURN_IF_ERROR(read(prefix + "scales", w.scales));
    }
    return Int8DequantizeWeight(ctx, {.src = w, .dst = matrix});
  }
  // Without `read` the weight is quantized here as one rank's start quantizes it.
  const Nf4Absmax format = read ? layout.nf4_absmax : Nf4Absmax::kDoubleQuantized;
  const Nf4ShareShape shape = read ? Nf4ShareShapeOf(layout, p) : Nf4ShareShape{};
  const Nf4Layout l = Nf4LayoutFor(p.numel, format, shape);
  const bool f32 = format == Nf4Absmax::kF32;
  std::vector<uint8_t> codes(l.code_bytes);
  std::vector<float> absmax(l.blocks), scale(l.absmax_groups), offset(1);  // f32 words
  std::vector<int32_t> block_base(l.rows);
  Nf4Tensor w{.numel = p.numel,
              .format = format,
              .codes = Tensor(codes.data(), DType::kU8, {l.code_bytes}),
              .absmax = Tensor(absmax.data(), f32 ? DType::kF32 : DType::kU8, {l.blocks}),
              .share = shape};
  if (!f32) {
    w.absmax_scale = Tensor(scale.data(), DType::kF32, {l.absmax_groups});
    w.absmax_offset = Tensor(offset.data(), DType::kF32, {1});
  }
  if (format == Nf4Absmax::kGroupIndexed) {
    w.block_base = Tensor(block_base.data(), DType::kI32, {l.rows});
  }
  if (!read) {
    ZT_RETURN_IF_ERROR(Nf4Quantize(ctx, {.src = values, .dst = w}));
  } else {
    const std::string prefix = Nf4BufferPrefix(unit, p);
    ZT_RETURN_IF_ERROR(read(prefix + "codes", w.codes));
    ZT_RETURN_IF_ERROR(read(prefix + "absmax", w.absmax));
    if (!f32) {
      ZT_RETURN_IF_ERROR(read(prefix + "absmax_scale", w.absmax_scale));
      ZT_RETURN_IF_ERROR(read(prefix + "absmax_offset", w.absmax_offset));
    }
    if (format == Nf4Absmax::kGroupIndexed) {
      ZT_RETURN_IF_ERROR(read(prefix + "block_base", w.block_base));
    }
  }
  return Nf4Dequantize(ctx, {.src = w, .dst = values});
}

// Quantized weight `wp` of whole unit `u` (of `whole`, the saved job's one-rank layout) of a
// seeded base saved on pipeline stages or tensor-parallel ranks, dequantized into `out`
// ((wp.numel) f32): each saved rank of the unit's stage (one data-parallel replica) dequantizes
// its share with its own layout (DequantizedWeight: a tensor-parallel NF4 share's one-rank codes,
// absmax codes and the group scales they index, an INT8 share's one-rank codes and whole-row
// scales; a stage's whole weight at tensor_parallel 1) and the share is placed where one rank holds
// it (PlaceSlice). Below ZeRO stage 3 the share's buffers are the rank's own "<unit>.nf4.*" /
// "<unit>.int8.*"; at stage 3 they are pieces of the share's quantized bytes, joined from the
// "<unit>.qbase" byte shards of the rank's data-parallel group (ReadShareQuantizedBytes). Each
// share dequantizes to the one-rank dequantized weight's slice bit for bit
// (Transformer::QuantizeBaseWeight), so the join is one rank's dequantized weight bit for bit.
absl::Status JoinDequantizedShares(const zerotrain::JobSpec& saved,
                                   const std::function<std::string(int)>& rank_file,
                                   const UnitLayout& whole_unit, const ParamSpec& wp, float* out) {
  const DeviceContext ctx = CpuContext(1);
  std::vector<bool> placed(static_cast<size_t>(std::max(1, saved.parallel().tensor_parallel())),
                           false);
  for (int r = 0; r < saved.parallel().world_size(); ++r) {
    const ParallelLayout place = ParallelLayout::ForJob(saved, r);
    if (place.coordinates().data != 0) continue;  // the replicas hold the same shares
    const ModelLayout rank_layout = RankModelLayout(saved, place);
    const UnitLayout* local = nullptr;
    for (const UnitLayout& unit : rank_layout.units) {
      if (unit.name == whole_unit.name) local = &unit;
    }
    if (local == nullptr) continue;  // another stage's unit
    const ParamSpec* p = local->Find(wp.name);
    if (p == nullptr || !p->quantized) {
      return absl::InternalError(absl::StrCat(whole_unit.name, ".", wp.name,
                                              " is not quantized in rank ", r, "'s layout"));
    }
    std::vector<float> share(static_cast<size_t>(p->numel));
    std::vector<float> share_bytes;  // f32 words keep the f32 pieces aligned
    const QuantizedUnitBytes pieces = QuantizedBytesOf(rank_layout, *local);
    std::unique_ptr<SafetensorsFile> file;
    QuantizedReader read;
    if (ShardsQuantizedBase(saved, rank_layout)) {
      // Stage 3: the share's bytes joined from its data-parallel group's "<unit>.qbase" shards.
      ZT_RETURN_IF_ERROR(
          ReadShareQuantizedBytes(saved, rank_file, place, rank_layout, *local, share_bytes));
      read = PieceReader(local->name, pieces, reinterpret_cast<const uint8_t*>(share_bytes.data()));
    } else {
      ZT_ASSIGN_OR_RETURN(file, SafetensorsFile::Open(rank_file(r)));
      read = [&](const std::string& name, const Tensor& dst) {
        return ReadQuantizedBuffer(*file, name, dst);
      };
    }
    ZT_RETURN_IF_ERROR(DequantizedWeight(ctx, rank_layout, *local, *p, read,
                                         Tensor(share.data(), DType::kF32, {p->numel})));
    const int k = place.coordinates().tensor;
    PlaceSlice(SliceOf(saved.model(), wp.name, wp.shape, place.tensor_size(), k), share.data(),
               out);
    placed[static_cast<size_t>(k)] = true;
  }
  for (size_t k = 0; k < placed.size(); ++k) {
    if (!placed[k]) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: no saved rank holds tensor-parallel share ", k, " of ",
                       whole_unit.name, ".", wp.name));
    }
  }
  return absl::OkStatus();
}

// The f32 base a quantized (NF4 or INT8) job trained against, in the layout of its model
// without base_dtype (`plain_layout`: the quantized weights back in the flat buffers): what
// the quantized weights dequantize to. From model.init_from, the file's values quantized as
// the job's start quantized them and dequantized; from a seeded job, the checkpoint's
// "<unit>.params" (the unquantized rest) and "<unit>.nf4.*" / "<unit>.int8.*" buffers.
absl::StatusOr<std::vector<std::vector<float>>> ReadDequantizedBase(
    const zerotrain::JobSpec& saved, const ModelLayout& quantized_layout,
    const zerotrain::ModelConfig& plain, const ModelLayout& plain_layout,
    const std::string& step_dir) {
  std::vector<std::vector<float>> base;
  std::vector<float*> units;
  for (const UnitLayout& u : plain_layout.units) {
    base.emplace_back(static_cast<size_t>(u.numel));
    units.push_back(base.back().data());
  }
  const DeviceContext ctx = CpuContext(1);
  const std::string& from = saved.model().init_from();
  std::unique_ptr<SafetensorsFile> rank0;
  if (!from.empty()) {
    ZT_RETURN_IF_ERROR(ImportHuggingFace(from, plain, plain_layout, units));
  } else {
    ZT_ASSIGN_OR_RETURN(rank0, SafetensorsFile::Open(RankFile(step_dir, 0)));
  }
  auto rank_file = [&](int r) { return RankFile(step_dir, r); };
  // A seeded base saved on pipeline stages or tensor-parallel ranks: joined from the stages'
  // shares (JoinDequantizedShares; the unquantized rest by ReadWholeUnitFromShares).
  const bool staged =
      saved.parallel().pipeline_parallel() > 1 || saved.parallel().tensor_parallel() > 1;
  for (size_t u = 0; u < quantized_layout.units.size(); ++u) {
    const UnitLayout& unit = quantized_layout.units[u];
    std::vector<float> rest;
    if (rank0 != nullptr) {
      rest.resize(static_cast<size_t>(unit.numel));
      ZT_RETURN_IF_ERROR(staged ? ReadWholeUnitFromShares(saved, rank_file, static_cast<int>(u),
                                                          "params", rest.data())
                                : ReadUnitRange(saved, rank_file, static_cast<int>(u), "params", 0,
                                                unit.numel, rest.data()));
    }
    // A seeded base's quantized buffers on one stage and tensor_parallel 1: rank 0's whole ones
    // below ZeRO stage 3; at stage 3 the block's quantized bytes, assembled from every rank's
    // shard. (On stages or TP ranks JoinDequantizedShares reads each share's.)
    QuantizedReader read;
    std::vector<float> unit_bytes;  // f32 words keep the f32 pieces aligned
    const QuantizedUnitBytes pieces = QuantizedBytesOf(quantized_layout, unit);
    if (rank0 != nullptr && !staged && ShardsQuantizedBase(saved, quantized_layout)) {
      unit_bytes.resize(static_cast<size_t>(pieces.words()));
      ZT_RETURN_IF_ERROR(ReadQuantizedUnitBytes(saved, rank_file, quantized_layout, unit, 0,
                                                pieces.bytes,
                                                reinterpret_cast<uint8_t*>(unit_bytes.data())));
      read = PieceReader(unit.name, pieces, reinterpret_cast<const uint8_t*>(unit_bytes.data()));
    } else if (rank0 != nullptr) {
      read = [&](const std::string& name, const Tensor& dst) {
        return ReadQuantizedBuffer(*rank0, name, dst);
      };
    }
    for (const ParamSpec& p : unit.params) {
      const ParamSpec* q = plain_layout.units[u].Find(p.name);
      if (q == nullptr || q->numel != p.numel) {
        return absl::InternalError(absl::StrCat(unit.name, " ", p.name, " differs between the ",
                                                "quantized layout and the plain one"));
      }
      float* dst = units[u] + q->offset;
      if (!p.quantized) {
        if (rank0 != nullptr)
          std::copy(rest.begin() + p.offset, rest.begin() + p.offset + p.numel, dst);
        continue;
      }
      if (rank0 != nullptr && staged) {
        ZT_RETURN_IF_ERROR(JoinDequantizedShares(saved, rank_file, unit, p, dst));
        continue;
      }
      ZT_RETURN_IF_ERROR(DequantizedWeight(ctx, quantized_layout, unit, p, read,
                                           Tensor(dst, DType::kF32, {p.numel})));
    }
  }
  return base;
}

}  // namespace

absl::StatusOr<bool> IsLoraCheckpoint(const std::string& checkpoint) {
  ZT_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> ckpt, OpenVerified(checkpoint));
  ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec saved, SavedJobSpec(*ckpt));
  return saved.model().has_lora();
}

absl::StatusOr<LoraExportResult> ExportLoraCheckpoint(const std::string& checkpoint,
                                                      const std::string& out_dir,
                                                      const LoraExportOptions& options) {
  ZT_ASSIGN_OR_RETURN(const std::unique_ptr<Checkpoint> ckpt, OpenVerified(checkpoint));
  ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec saved, SavedJobSpec(*ckpt));
  if (!saved.model().has_lora()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint '", ckpt->path(),
                     "' was not saved by a LoRA job (its model has no lora): "
                     "export it without --merge-adapters as a Hugging Face model"));
  }
  const ModelLayout layout = BuildModelLayout(saved.model());
  const bool quantized = layout.base_quantization != BaseQuantization::kNone;
  // The adapters: the copy of the first rank that holds them (every rank whole after a step;
  // with pipeline parallelism the ranks of the block's stage); with tensor parallelism each
  // block's shares joined from the ranks of its stage (what FullAdapters gathers in a run).
  const bool shares = saved.parallel().tensor_parallel() > 1;
  auto rank_file = [&](int r) { return RankFile(ckpt->path(), r); };
  std::vector<std::unique_ptr<SafetensorsFile>> files(saved.parallel().world_size());
  std::vector<std::vector<float>> adapters(layout.units.size());
  std::vector<Tensor> unit_lora(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& unit = layout.units[u];
    if (unit.lora_numel == 0) continue;
    if (shares) {
      adapters[u].resize(static_cast<size_t>(unit.lora_numel));
      ZT_RETURN_IF_ERROR(
          ReadWholeAdaptersFromShares(saved, rank_file, static_cast<int>(u), adapters[u].data()));
      unit_lora[u] = Tensor(adapters[u].data(), DType::kF32, {unit.lora_numel});
      continue;
    }
    const std::string name = unit.name + ".lora";
    const SafetensorsTensorInfo* info = nullptr;
    SafetensorsFile* file = nullptr;
    for (size_t r = 0; r < files.size() && info == nullptr; ++r) {
      if (files[r] == nullptr) {
        ZT_ASSIGN_OR_RETURN(files[r],
                            SafetensorsFile::Open(RankFile(ckpt->path(), static_cast<int>(r))));
      }
      file = files[r].get();
      info = file->Find(name);
      if (saved.parallel().pipeline_parallel() <= 1) break;  // rank 0 holds every block's
    }
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat("checkpoint '", ckpt->path(), "': ", file->path(),
                                              " has no tensor ", name, " (the unit's adapters)"));
    }
    std::vector<float> all(static_cast<size_t>(info->numel()));
    ZT_RETURN_IF_ERROR(file->ReadAsF32(*info, absl::MakeSpan(all)));
    if (static_cast<int64_t>(all.size()) < unit.lora_numel) {
      return absl::DataLossError(absl::StrCat("checkpoint '", ckpt->path(), "': ", name, " holds ",
                                              all.size(), " values, the layout needs ",
                                              unit.lora_numel));
    }
    all.resize(static_cast<size_t>(unit.lora_numel));
    adapters[u] = std::move(all);
    unit_lora[u] = Tensor(adapters[u].data(), DType::kF32, {unit.lora_numel});
  }
  LoraExportResult result{.checkpoint = ckpt->path(), .step = ckpt->step()};
  if (!options.merge_adapters) {
    ZT_RETURN_IF_ERROR(WritePeftAdapter(saved.model(), layout, unit_lora, out_dir,
                                        {.base_model_name_or_path = saved.model().init_from()}));
    return result;
  }
  // A quantized base merges as what it dequantizes to, in the layout of the same model without
  // base_dtype (its adapters are laid out alike: the sites do not depend on the base's dtype).
  zerotrain::ModelConfig merged_model = saved.model();
  if (quantized) {
    merged_model.clear_base_dtype();
    merged_model.clear_int8_threshold();
  }
  const ModelLayout merged_layout = quantized ? BuildModelLayout(merged_model) : layout;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    if (merged_layout.units[u].lora_numel != layout.units[u].lora_numel) {
      return absl::InternalError(
          absl::StrCat(layout.units[u].name, ": the adapters' layout depends on base_dtype"));
    }
  }
  std::vector<std::vector<float>> base;
  if (quantized) {
    ZT_ASSIGN_OR_RETURN(
        base, ReadDequantizedBase(saved, layout, merged_model, merged_layout, ckpt->path()));
  } else {
    ZT_ASSIGN_OR_RETURN(base, ReadBase(saved, layout, ckpt->path()));
  }
  DType dtype = DType::kF32;
  if (options.dtype.has_value()) {
    dtype = *options.dtype;
  } else if (const std::string& from = saved.model().init_from();
             !from.empty() && !IsCheckpoint(from)) {
    ZT_ASSIGN_OR_RETURN(dtype, HuggingFaceWeightsDType(from, merged_model, merged_layout));
  } else if (saved.precision().param_dtype() == zerotrain::PrecisionConfig::BF16) {
    dtype = DType::kBF16;
  } else if (saved.precision().param_dtype() == zerotrain::PrecisionConfig::FP16) {
    dtype = DType::kF16;
  }
  std::vector<const float*> pointers;
  for (const std::vector<float>& b : base) pointers.push_back(b.data());
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return durable_file::ErrnoStatus(ec.value(), "create the export directory", out_dir);
  const std::string weights = (std::filesystem::path(out_dir) / kHfWeightsName).string();
  ZT_RETURN_IF_ERROR(
      ExportMergedHuggingFace(weights, merged_model, merged_layout, pointers, unit_lora, dtype));
  // The merged model is a plain one: its config has no adapters.
  zerotrain::ModelConfig plain = saved.model();
  plain.clear_lora();
  plain.clear_base_dtype();
  plain.clear_int8_threshold();
  ZT_ASSIGN_OR_RETURN(const nlohmann::json config, HuggingFaceConfig(plain, dtype));
  ZT_RETURN_IF_ERROR(durable_file::WriteSyncedFile(
      (std::filesystem::path(out_dir) / kHfConfigName).string(), config.dump(2) + "\n"));
  return result;
}

}  // namespace zt
