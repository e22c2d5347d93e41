// The LoRA side of Transformer (transformer.h): a block's linear layers with their adapters,
// and the frozen base's gradient routing. Legend as in transformer.h; per adapter site
// (worker/model/param_layout.h's LoraSite): r rank, n its output columns, K its input width.
//
//   forward   h = scale · dropout(x) · Aᵀ            (BT, r)   kept for the backward
//             out[:, c0 : c0 + n] += h · Bᵀ           (BT, n)
//   backward  dy = dout[:, c0 : c0 + n]
//             dB += dyᵀ · h,  dh = scale · dy · B
//             dA += dhᵀ · dropout(x),  dinp += dropout'(dh · A)
// Folding the scale into h makes B's gradient and the merged weight W + scale·B·A follow
// without a second scaling pass.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/elementwise.h"
#include "kernels/int8_linear.h"
#include "kernels/linear.h"
#include "kernels/lora.h"
#include "kernels/nf4_linear.h"
#include "kernels/quantization.h"
#include "kernels/status_macros.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/model/transformer.h"
#include "worker/plan/lora_plan.h"

namespace zt {
namespace {

// A (rows, cols) view at `offset` elements into the f32 adapter buffer `flat`.
// In the buffer's own dtype: the adapters are f32, their gradients precision.grad_dtype (a
// bf16 gradient buffer viewed as f32 would be written twice its size).
Tensor AdapterView(const Tensor& flat, const ParamSpec& p) {
  if (flat.empty()) return Tensor();
  return Tensor(static_cast<char*>(flat.raw()) + p.offset * DTypeSize(flat.dtype()), flat.dtype(),
                {p.shape[0], p.shape[1]}, flat.device());
}

// The first `cols` columns' worth of a (rows, widest) scratch buffer, as a dense (rows, cols).
Tensor ScratchView(const Tensor& scratch, int64_t cols) {
  return Tensor(scratch.raw(), scratch.dtype(), {scratch.dim(0), cols}, scratch.device());
}

}  // namespace

uint64_t Transformer::LoraSiteSeed(int block, size_t site) const {
  return LoraDropoutSeed(lora_seed_, block, static_cast<int64_t>(site));
}

LoraDropoutArgs Transformer::LoraDropoutOf(int block, size_t site, const Tensor& inp,
                                           const Tensor& out) const {
  LoraDropoutArgs args{
      .inp = inp, .out = out, .p = layout_.lora_dropout, .seed = LoraSiteSeed(block, site)};
  const LoraSite& s = layout_.block(block).lora[site];
  if (tp_.size > 1 && IsRowParallelLoraSite(s)) {
    // The rank holds input columns [rank · in, (rank + 1) · in) of the site's logical input:
    // it draws their masks, so the group drops exactly what one rank drops.
    args.logical_cols = s.in * tp_.size;
    args.col_begin = s.in * tp_.rank;
  }
  return args;
}

// Where unit u's adapters (u of layout_, held) are written: its buffer, or `into`'s entry for
// it (indexed as unit_lora(): a pipeline stage's own units in held order).
float* Transformer::LoraTarget(int u, const std::vector<Tensor>* into) const {
  if (into == nullptr) return lora_params_[u].data<float>();
  size_t k = static_cast<size_t>(u);
  if (pipelined_) {
    k = static_cast<size_t>(std::find(held_units_.begin(), held_units_.end(), u) -
                            held_units_.begin());
  }
  return (*into)[k].data<float>();
}

void Transformer::InitializeLora(uint64_t seed, const std::vector<Tensor>* into) {
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    // A pipeline stage's own units; each matrix's stream is named by the whole model's unit
    // index, so the stages together hold the one-rank model's adapters.
    if (!HoldsUnit(static_cast<int>(u))) continue;
    const UnitLayout& unit = layout_.units[u];
    for (size_t k = 0; k < unit.lora.size(); ++k) {
      const LoraSite& site = unit.lora[k];
      // A tensor-parallel rank draws the whole A's stream and keeps its share
      // (LoraSliceOf), so the group starts as one rank does.
      const LoraSite& whole = whole_layout_.units[u].lora[k];
      std::vector<float> drawn(tp_.size > 1 ? whole.a.numel : 0);
      float* const target = LoraTarget(static_cast<int>(u), into);
      float* a = tp_.size > 1 ? drawn.data() : target + site.a.offset;
      // kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain·sqrt(3 / fan_in) =
      // 1 / sqrt(fan_in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(whole.in));
      // seed_seq's mixing is specified by the standard: the same draws everywhere.
      std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                        static_cast<uint32_t>(u), static_cast<uint32_t>(k)};
      std::mt19937_64 rng(seq);
      for (int64_t i = 0; i < whole.a.numel; ++i) {
        const double unit_draw = static_cast<double>(rng() >> 11) * 0x1p-53;  // [0, 1)
        a[i] = static_cast<float>((2.0 * unit_draw - 1.0) * bound);
      }
      if (tp_.size > 1) {
        ExtractSlice(LoraSliceOf(config_, whole, /*a=*/true, tp_.size, tp_.rank), drawn.data(),
                     target + site.a.offset);
      }
      float* b = target + site.b.offset;
      std::fill(b, b + site.b.numel, 0.0f);
    }
  }
}

void Transformer::SetLoraFromWhole(const std::vector<std::vector<float>>& whole,
                                   const std::vector<Tensor>* into) {
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    if (!HoldsUnit(static_cast<int>(u))) continue;
    const UnitLayout& unit = layout_.units[u];
    for (size_t k = 0; k < unit.lora.size(); ++k) {
      const LoraSite& site = unit.lora[k];
      const LoraSite& w = whole_layout_.units[u].lora[k];
      for (const bool a : {true, false}) {
        ExtractSlice(LoraSliceOf(config_, w, a, tp_.size, tp_.rank),
                     whole[u].data() + (a ? w.a.offset : w.b.offset),
                     LoraTarget(static_cast<int>(u), into) + (a ? site.a.offset : site.b.offset));
      }
    }
  }
}

const Nf4Tensor* Transformer::QuantizedWeight(int u, std::string_view name) const {
  if (layout_.base_quantization != BaseQuantization::kNf4) return nullptr;
  for (const QuantizedWeightBuffers& q : quantized_[u]) {
    if (q.name == name) return &q.nf4;
  }
  return nullptr;
}

const Int8Weight* Transformer::Int8QuantizedWeight(int u, std::string_view name) const {
  if (layout_.base_quantization != BaseQuantization::kInt8) return nullptr;
  for (const QuantizedWeightBuffers& q : quantized_[u]) {
    if (q.name == name) return &q.int8;
  }
  return nullptr;
}

namespace {

// A view of `shape` (1 or 2 dimensions) at `data`.
Tensor PieceView(uint8_t* data, DType dtype, const std::vector<int64_t>& shape, Device device) {
  if (shape.size() == 2) return Tensor(data, dtype, {shape[0], shape[1]}, device);
  return Tensor(data, dtype, {shape[0]}, device);
}

// INT8 on a tensor-parallel rank: the whole (one-rank) weight `values` quantized as one rank
// quantizes it, and the share's codes and row scales taken from it. A row's scale is its whole
// row's absmax (a row-parallel share holds some of its columns), so every code reads back as
// one rank's W̃ (Int8DequantizeWeight: the code times w_n / 127, both the one rank's).
absl::Status QuantizeInt8Share(const DeviceContext& ctx, const std::string& what,
                               const Tensor& values, const TensorParallelSlice& share,
                               const Int8Weight& dst) {
  const int64_t rows = share.global_rows, cols = share.global_cols, lc = share.local_cols;
  if (values.numel() != rows * cols || dst.codes.dim(0) != share.local_rows ||
      dst.codes.dim(1) != lc) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeight: ", what, " takes the whole ", rows, " x ", cols,
                     " weight for its share of ", share.local_rows, " x ", lc, ", got ",
                     values.numel(), " elements"));
  }
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
  std::vector<float> scales(static_cast<size_t>(rows));
  const Int8Weight whole{.codes = Tensor(codes.data(), DType::kU8, {rows, cols}),
                         .scales = Tensor(scales.data(), DType::kF32, {rows})};
  ZT_RETURN_IF_ERROR(Int8QuantizeWeight(
      ctx, {.src = Tensor(values.raw(), DType::kF32, {rows, cols}), .dst = whole}));
  auto* out_codes = static_cast<uint8_t*>(dst.codes.raw());
  auto* out_scales = static_cast<float*>(dst.scales.raw());
  // Padding rows (none for the block linears today) read back as 0.
  std::fill(out_codes, out_codes + dst.codes.numel(), uint8_t{0});
  std::fill(out_scales, out_scales + dst.scales.numel(), 0.0f);
  for (const TensorParallelSlice::Rows& run : share.rows) {
    for (int64_t i = 0; i < run.count; ++i) {
      const int64_t g = run.global_begin + i, l = run.local_begin + i;
      std::memcpy(out_codes + l * lc, codes.data() + g * cols + share.col_begin,
                  static_cast<size_t>(lc));
      out_scales[l] = scales[g];
    }
  }
  return absl::OkStatus();
}

// NF4 on a tensor-parallel rank: the whole (one-rank) weight `values` quantized as one rank
// quantizes it (double-quantized), and the share given its elements' one-rank codes, its blocks'
// one-rank 8-bit absmax codes, the one-rank group scales and μ, and per share row the one-rank
// index of its first block (dst.format kGroupIndexed, ModelLayout::nf4_absmax), so each share
// block reads its absmax back as fma(map[k_b], s_g, μ) of its one-rank block and group, and
// the share dequantizes to the one-rank dequantized weight's slice bit for bit. That needs every
// share row to be a run of whole one-rank blocks (the share's columns and the weight's columns
// multiples of 64, the first column too): CheckEngineSupport refuses the shapes where it would
// not (d_model / t and d_ff / t multiples of 64); a share row that is not is an InternalError
// here.
absl::Status QuantizeNf4Share(const DeviceContext& ctx, const std::string& what,
                              const Tensor& values, const TensorParallelSlice& share,
                              const Nf4Tensor& dst) {
  const int64_t n = share.global_rows * share.global_cols, lc = share.local_cols;
  if (values.numel() != n || dst.numel != share.local_rows * lc ||
      dst.format != Nf4Absmax::kGroupIndexed || dst.share.whole_numel != n ||
      dst.share.row_blocks * kNf4Block != lc) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeight: ", what, " takes the whole weight of ", n,
                     " elements for a group-indexed share of ", share.local_rows, " rows of ", lc,
                     " (of a whole weight of ", dst.share.whole_numel, ", rows of ",
                     dst.share.row_blocks * kNf4Block, "), got ", values.numel()));
  }
  if (lc % kNf4Block != 0 || share.global_cols % kNf4Block != 0 ||
      share.col_begin % kNf4Block != 0) {
    return absl::InternalError(absl::StrCat(
        "QuantizeBaseWeight: ", what, "'s share holds columns [", share.col_begin, ", ",
        share.col_begin + lc, ") of ", share.global_cols, "; its rows must be whole ", kNf4Block,
        "-element NF4 blocks of the whole weight (CheckEngineSupport refuses such shapes)"));
  }
  const Nf4Layout l = Nf4LayoutFor(n, Nf4Absmax::kDoubleQuantized);
  std::vector<uint8_t> codes(static_cast<size_t>(l.code_bytes)),
      absmax(static_cast<size_t>(l.blocks));
  std::vector<float> group_scale(static_cast<size_t>(l.absmax_groups)), offset(1);
  const Nf4Tensor whole{.numel = n,
                        .format = Nf4Absmax::kDoubleQuantized,
                        .codes = Tensor(codes.data(), DType::kU8, {l.code_bytes}),
                        .absmax = Tensor(absmax.data(), DType::kU8, {l.blocks}),
                        .absmax_scale = Tensor(group_scale.data(), DType::kF32, {l.absmax_groups}),
                        .absmax_offset = Tensor(offset.data(), DType::kF32, {1})};
  ZT_RETURN_IF_ERROR(Nf4Quantize(ctx, {.src = values, .dst = whole}));
  if (dst.absmax_scale.numel() != l.absmax_groups || dst.absmax_offset.numel() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeight: ", what, "'s share keeps ", dst.absmax_scale.numel(),
                     " group scales, the whole weight has ", l.absmax_groups));
  }
  std::memcpy(dst.absmax_scale.raw(), group_scale.data(), group_scale.size() * sizeof(float));
  std::memcpy(dst.absmax_offset.raw(), offset.data(), sizeof(float));
  auto* out_codes = static_cast<uint8_t*>(dst.codes.raw());
  auto* out_absmax = static_cast<uint8_t*>(dst.absmax.raw());
  auto* out_base = static_cast<int32_t*>(dst.block_base.raw());
  // Padding rows (none for the block linears today): the zero level of block 0's scale.
  std::fill(out_codes, out_codes + dst.codes.numel(), uint8_t{kNf4ZeroCode * 17});
  std::fill(out_absmax, out_absmax + dst.absmax.numel(), uint8_t{0});
  std::fill(out_base, out_base + dst.block_base.numel(), int32_t{0});
  const int64_t row_blocks = lc / kNf4Block;
  for (const TensorParallelSlice::Rows& run : share.rows) {
    for (int64_t i = 0; i < run.count; ++i) {
      const int64_t local_row = run.local_begin + i;
      const int64_t first = (run.global_begin + i) * share.global_cols + share.col_begin;
      // A share row starts on a block, so its codes are whole bytes of the whole weight's.
      std::memcpy(out_codes + local_row * lc / 2, codes.data() + first / 2,
                  static_cast<size_t>(lc / 2));
      std::memcpy(out_absmax + local_row * row_blocks, absmax.data() + first / kNf4Block,
                  static_cast<size_t>(row_blocks));
      if (first / kNf4Block > std::numeric_limits<int32_t>::max()) {
        return absl::InternalError(absl::StrCat("QuantizeBaseWeight: ", what, " has more than ",
                                                std::numeric_limits<int32_t>::max(),
                                                " NF4 blocks; block_base is i32"));
      }
      out_base[local_row] = static_cast<int32_t>(first / kNf4Block);
    }
  }
  return absl::OkStatus();
}

// Quantizes `values` into `q` (NF4 or INT8, whichever `q` holds). On a tensor-parallel rank
// (`share` set) `values` is the whole weight and `q` the rank's share of it.
absl::Status QuantizeInto(const DeviceContext& ctx, const std::string& what, const Tensor& values,
                          const Nf4Tensor* nf4, const Int8Weight* int8,
                          const TensorParallelSlice* share) {
  if (share != nullptr && int8 != nullptr) {
    return QuantizeInt8Share(ctx, what, values, *share, *int8);
  }
  if (share != nullptr && nf4 != nullptr) return QuantizeNf4Share(ctx, what, values, *share, *nf4);
  if (int8 != nullptr) {
    // The flat values as the (out, in) matrix whose rows get one scale each.
    if (values.numel() != int8->codes.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("QuantizeBaseWeight: ", what, " has ",
                                                     int8->codes.numel(), " elements, got ",
                                                     values.numel()));
    }
    const Tensor src(values.raw(), values.dtype(), {int8->codes.dim(0), int8->codes.dim(1)},
                     values.device());
    return Int8QuantizeWeight(ctx, {.src = src, .dst = *int8});
  }
  if (nf4 == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeight: ", what, " is not a quantized weight"));
  }
  return Nf4Quantize(ctx, {.src = values, .dst = *nf4});
}

}  // namespace

std::vector<Transformer::QuantizedWeightBuffers> Transformer::QuantizedViews(int u, uint8_t* base,
                                                                             int64_t base_offset,
                                                                             Device device) const {
  const UnitLayout& unit = layout_.units[u];
  const QuantizedUnitBytes bytes = QuantizedBytesOf(layout_, unit);
  std::vector<QuantizedWeightBuffers> out;
  for (const ParamSpec& p : unit.params) {
    if (!p.quantized) continue;
    QuantizedWeightBuffers q{.name = p.name};
    const bool int8 = layout_.base_quantization == BaseQuantization::kInt8;
    const std::string prefix = int8 ? Int8BufferPrefix(unit, p) : Nf4BufferPrefix(unit, p);
    for (const QuantizedPiece& piece : bytes.pieces) {
      if (!piece.name.starts_with(prefix)) continue;
      const Tensor view =
          PieceView(base + (piece.offset - base_offset), piece.dtype, piece.shape, device);
      const std::string_view field = std::string_view(piece.name).substr(prefix.size());
      if (field == "codes") (int8 ? q.int8.codes : q.nf4.codes) = view;
      if (field == "scales") q.int8.scales = view;
      if (field == "absmax") q.nf4.absmax = view;
      if (field == "absmax_scale") q.nf4.absmax_scale = view;
      if (field == "absmax_offset") q.nf4.absmax_offset = view;
      if (field == "block_base") q.nf4.block_base = view;
    }
    if (!int8) {
      q.nf4.numel = p.numel;
      q.nf4.format = layout_.nf4_absmax;
      q.nf4.share = Nf4ShareShapeOf(layout_, p);
    }
    out.push_back(std::move(q));
  }
  return out;
}

absl::Status Transformer::BindQuantizedBase(int u, const Tensor& gathered) {
  const int64_t need = QuantizedBytesOf(layout_, layout_.units[u]).bytes;
  if (gathered.size_bytes() < need) {
    return absl::InternalError(absl::StrCat("BindQuantizedBase: ", layout_.units[u].name,
                                            "'s quantized bytes need ", need, " bytes, got ",
                                            gathered.size_bytes()));
  }
  quantized_[u] = QuantizedViews(u, static_cast<uint8_t*>(gathered.raw()), 0, gathered.device());
  return absl::OkStatus();
}

absl::Status Transformer::QuantizeBaseWeight(const DeviceContext& ctx, int u, std::string_view name,
                                             const Tensor& values) {
  const std::string what = absl::StrCat(layout_.units[u].name, ".", std::string(name));
  // A tensor-parallel rank: `values` is the whole weight, quantized as one rank quantizes it,
  // and this rank keeps its share (QuantizeNf4Share / QuantizeInt8Share).
  std::optional<TensorParallelSlice> share;
  if (tp_.size > 1) {
    const ParamSpec* whole = whole_layout_.units[u].Find(std::string(name));
    if (whole == nullptr || !whole->quantized) {
      return absl::InvalidArgumentError(
          absl::StrCat("QuantizeBaseWeight: ", what, " is not a quantized weight"));
    }
    share = SliceOf(config_, whole->name, whole->shape, tp_.size, tp_.rank);
  }
  const TensorParallelSlice* slice = share ? &*share : nullptr;
  if (!qbase_shards_.empty() && !qbase_shards_[u].empty()) {
    return QuantizeIntoShard(ctx, u, name, values, qbase_shards_[u], slice,
                             upload_ ? &upload_ : nullptr);
  }
  if (!upload_) {
    return QuantizeInto(ctx, what, values, QuantizedWeight(u, name), Int8QuantizedWeight(u, name),
                        slice);
  }
  // The device's buffers of this weight get the host staging's, piece by piece.
  const QuantizedWeightBuffers* device = nullptr;
  for (const QuantizedWeightBuffers& q : quantized_[u]) {
    if (q.name == name) device = &q;
  }
  if (device == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeight: ", what, " is not a quantized weight"));
  }
  ZT_ASSIGN_OR_RETURN(const StagedQuantizedWeight staged,
                      QuantizeIntoStaging(ctx, u, name, values, slice));
  const auto pieces = [](const QuantizedWeightBuffers& q) {
    return std::array<const Tensor*, 7>{
        &q.nf4.codes,      &q.nf4.absmax, &q.nf4.absmax_scale, &q.nf4.absmax_offset,
        &q.nf4.block_base, &q.int8.codes, &q.int8.scales};
  };
  const auto to = pieces(*device), from = pieces(staged.views);
  for (size_t k = 0; k < to.size(); ++k) {
    if (to[k]->empty()) continue;
    if (to[k]->size_bytes() != from[k]->size_bytes()) {
      return absl::InternalError(absl::StrCat("QuantizeBaseWeight: ", what, "'s device piece ", k,
                                              " holds ", to[k]->size_bytes(),
                                              " bytes, its host staging ", from[k]->size_bytes()));
    }
    ZT_RETURN_IF_ERROR(upload_(*to[k], from[k]->raw()));
  }
  return absl::OkStatus();
}

absl::Status Transformer::QuantizeBaseWeightIntoShard(const DeviceContext& ctx, int u,
                                                      std::string_view name, const Tensor& values,
                                                      const Tensor& shard) {
  if (u < 0 || u >= static_cast<int>(held_units_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeightIntoShard: unit ", u, " is not one the model holds"));
  }
  const int whole = held_units_[u];
  std::optional<TensorParallelSlice> share;
  if (tp_.size > 1) {
    const ParamSpec* p = whole_layout_.units[whole].Find(std::string(name));
    if (p == nullptr || !p->quantized) {
      return absl::InvalidArgumentError(
          absl::StrCat("QuantizeBaseWeightIntoShard: ", layout_.units[whole].name, ".",
                       std::string(name), " is not a quantized weight"));
    }
    share = SliceOf(config_, p->name, p->shape, tp_.size, tp_.rank);
  }
  // `shard` is host staging on its way to the swap store: written in place.
  return QuantizeIntoShard(ctx, whole, name, values, shard, share ? &*share : nullptr,
                           /*upload=*/nullptr);
}

absl::StatusOr<Transformer::StagedQuantizedWeight> Transformer::QuantizeIntoStaging(
    const DeviceContext& ctx, int u, std::string_view name, const Tensor& values,
    const TensorParallelSlice* slice) const {
  const std::string what = absl::StrCat(layout_.units[u].name, ".", std::string(name));
  const UnitLayout& unit = layout_.units[u];
  const QuantizedUnitBytes bytes = QuantizedBytesOf(layout_, unit);
  const ParamSpec* p = unit.Find(std::string(name));
  if (p == nullptr || !p->quantized) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeBaseWeight: ", what, " is not a quantized weight"));
  }
  const bool int8 = layout_.base_quantization == BaseQuantization::kInt8;
  const std::string prefix = int8 ? Int8BufferPrefix(unit, *p) : Nf4BufferPrefix(unit, *p);
  StagedQuantizedWeight staged{.lo = bytes.bytes, .hi = 0};
  for (const QuantizedPiece& piece : bytes.pieces) {
    if (!piece.name.starts_with(prefix)) continue;
    staged.lo = std::min(staged.lo, piece.offset);
    staged.hi = std::max(staged.hi, piece.offset + piece.bytes);
  }
  // Every piece's offset is 64-byte aligned, so f32 words keep each f32 piece aligned.
  staged.words.resize(static_cast<size_t>((staged.hi - staged.lo + 3) / 4));
  auto* base = reinterpret_cast<uint8_t*>(staged.words.data());
  for (QuantizedWeightBuffers& q : QuantizedViews(u, base, staged.lo, values.device())) {
    if (q.name != name) continue;
    ZT_RETURN_IF_ERROR(
        QuantizeInto(ctx, what, values, int8 ? nullptr : &q.nf4, int8 ? &q.int8 : nullptr, slice));
    staged.views = std::move(q);
  }
  return staged;
}

absl::Status Transformer::QuantizeIntoShard(const DeviceContext& ctx, int u, std::string_view name,
                                            const Tensor& values, const Tensor& shard,
                                            const TensorParallelSlice* slice,
                                            const HostUpload* upload) {
  // Stage 3: the weight's pieces are bytes [lo, hi) of the unit's quantized bytes; quantize
  // into staging of that size and keep the part inside this rank's shard.
  ZT_ASSIGN_OR_RETURN(const StagedQuantizedWeight staged,
                      QuantizeIntoStaging(ctx, u, name, values, slice));
  const int64_t shard_begin = static_cast<int64_t>(qbase_rank_) * shard.size_bytes();
  const int64_t from = std::max(staged.lo, shard_begin);
  const int64_t to = std::min(staged.hi, shard_begin + shard.size_bytes());
  if (from >= to) return absl::OkStatus();
  uint8_t* dst = static_cast<uint8_t*>(shard.raw()) + (from - shard_begin);
  const uint8_t* src = staged.bytes() + (from - staged.lo);
  if (upload != nullptr) {
    return (*upload)(Tensor(dst, DType::kU8, {to - from}, shard.device()), src);
  }
  std::memcpy(dst, src, static_cast<size_t>(to - from));
  return absl::OkStatus();
}

absl::Status Transformer::InitializeQuantizedShard(const DeviceContext& ctx, uint64_t seed, int u,
                                                   const Tensor& shard) {
  // InitializeQuantizedBase's values, bit for bit: each whole (one-rank) weight generated from
  // the whole layout and quantized as QuantizeBaseWeight does. `u` is layout()'s (a pipeline
  // stage's own units); the whole layout is by whole-model unit.
  if (u < 0 || u >= static_cast<int>(held_units_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("InitializeQuantizedShard: unit ", u, " is not one the model holds"));
  }
  const UnitLayout& whole_unit = whole_layout_.units[held_units_[u]];
  for (const ParamSpec& p : whole_unit.params) {
    if (!p.quantized) continue;
    std::vector<float> values(p.numel);
    FillInitialMatrix(seed, whole_unit, p, 0, p.numel, values.data());
    ZT_RETURN_IF_ERROR(QuantizeBaseWeightIntoShard(
        ctx, u, p.name, Tensor(values.data(), DType::kF32, {p.numel}), shard));
  }
  return absl::OkStatus();
}

absl::Status Transformer::InitializeQuantizedBase(const DeviceContext& ctx, uint64_t seed) {
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    if (!HoldsUnit(static_cast<int>(u))) continue;  // another pipeline stage's
    // The whole (one-rank) weight's values: a tensor-parallel rank quantizes it whole and keeps
    // its share (QuantizeBaseWeight).
    const UnitLayout& whole_unit = whole_layout_.units[u];
    for (const ParamSpec& p : whole_unit.params) {
      if (!p.quantized) continue;
      std::vector<float> values(p.numel);
      FillInitialMatrix(seed, whole_unit, p, 0, p.numel, values.data());
      ZT_RETURN_IF_ERROR(QuantizeBaseWeight(ctx, static_cast<int>(u), p.name,
                                            Tensor(values.data(), DType::kF32, {p.numel})));
    }
  }
  return absl::OkStatus();
}

Tensor Transformer::NormGrad(const UnitLayout& unit, const Tensor& grads, const char* name) const {
  if (unit.trainable()) return View(unit, grads, name);
  if (unit.Find(name) == nullptr) return Tensor();
  const bool bias = std::string_view(name).ends_with(".bias");
  const Tensor sink = lora_.norm_sink.Slice(bias ? C_ : 0, bias ? 2 * C_ : C_);
  return sink;
}

absl::Status Transformer::BlockLinearForward(const DeviceContext& ctx, int i, const Tensor& params,
                                             const char* weight, const char* bias,
                                             const Tensor& inp, const Tensor& out) {
  const UnitLayout& u = layout_.block(i);
  if (const Nf4Tensor* q = QuantizedWeight(1 + i, weight); q != nullptr) {
    ZT_RETURN_IF_ERROR(Nf4LinearForward(
        ctx, {.inp = inp, .weight = *q, .bias = View(u, params, bias), .out = out}));
  } else if (const Int8Weight* w8 = Int8QuantizedWeight(1 + i, weight); w8 != nullptr) {
    ZT_RETURN_IF_ERROR(Int8LinearForward(ctx, {.inp = inp,
                                               .weight = *w8,
                                               .bias = View(u, params, bias),
                                               .out = out,
                                               .outlier_threshold = layout_.int8_threshold}));
  } else {
    ZT_RETURN_IF_ERROR(LinearForward(ctx, {.inp = inp,
                                           .weight = View(u, params, weight),
                                           .bias = View(u, params, bias),
                                           .out = out}));
  }
  const BlockActs& a = blocks_[i];
  for (size_t k = 0; k < u.lora.size(); ++k) {
    const LoraSite& site = u.lora[k];
    if (site.weight != weight) continue;
    Tensor x = inp;
    if (layout_.lora_dropout > 0) {
      x = ScratchView(lora_.dropped, site.in);
      ZT_RETURN_IF_ERROR(LoraDropout(ctx, LoraDropoutOf(i, k, inp, x)));
    }
    const Tensor& h = a.lora_h[k];
    ZT_RETURN_IF_ERROR(LinearForward(
        ctx, {.inp = x, .weight = AdapterView(lora_params_[1 + i], site.a), .out = h}));
    ZT_RETURN_IF_ERROR(Scale(ctx, h, layout_.lora_scale));
    const bool row_parallel = tp_.size > 1 && IsRowParallelLoraSite(site);
    if (row_parallel) {
      // h = Σ_k x_k·A_kᵀ over the group (each rank holds its input columns of A); h·Bᵀ is then
      // the same on every rank, so only rank 0 adds it to its partial product, which the
      // row-parallel all-reduce after this sums.
      ZT_RETURN_IF_ERROR(
          tp_.all_reduce(h, absl::StrCat(u.name, " ", site.hf_path, ".lora h all-reduce")));
      if (tp_.rank != 0) continue;
    }
    const Tensor z = ScratchView(lora_.out, site.rows);
    ZT_RETURN_IF_ERROR(LinearForward(
        ctx, {.inp = h, .weight = AdapterView(lora_params_[1 + i], site.b), .out = z}));
    ZT_RETURN_IF_ERROR(ColumnsAdd(ctx, {.src = z, .dst = out, .col_begin = site.row_begin}));
  }
  return absl::OkStatus();
}

absl::Status Transformer::BlockLinearBackward(const DeviceContext& ctx, int i, const Tensor& params,
                                              const Tensor& grads, const char* weight,
                                              const char* bias, const Tensor& dout,
                                              const Tensor& inp, const Tensor& dinp) {
  const UnitLayout& u = layout_.block(i);
  const Tensor w = View(u, params, weight);
  if (const Nf4Tensor* q = QuantizedWeight(1 + i, weight); q != nullptr) {
    // A quantized base: its input gradient, dequantized tile by tile.
    ZT_RETURN_IF_ERROR(Nf4LinearBackward(ctx, {.dout = dout, .weight = *q, .dinp = dinp}));
  } else if (const Int8Weight* w8 = Int8QuantizedWeight(1 + i, weight); w8 != nullptr) {
    // LLM.int8()'s backward for a frozen weight: dinp = dout · W̃, the int8 rows read back
    // one at a time, never the whole weight in f32.
    ZT_RETURN_IF_ERROR(Int8LinearBackward(ctx, {.dout = dout, .weight = *w8, .dinp = dinp}));
  } else if (u.trainable()) {
    ZT_RETURN_IF_ERROR(LinearBackward(ctx, {.dout = dout,
                                            .inp = inp,
                                            .weight = w,
                                            .dinp = dinp,
                                            .dweight = View(u, grads, weight),
                                            .dbias = View(u, grads, bias)}));
  } else {
    // A frozen base: its input gradient only, dinp (M, K) = dout (M, N) · W (N, K).
    ZT_RETURN_IF_ERROR(Gemm(ctx, dout, w, dinp, {}));
  }
  const BlockActs& a = blocks_[i];
  // A LoRA block's `grads` are its adapters' (the unit's trainable buffer's gradient).
  for (size_t k = 0; k < u.lora.size(); ++k) {
    const LoraSite& site = u.lora[k];
    if (site.weight != weight) continue;
    Tensor dy = dout;
    if (site.rows != dout.dim(1)) {
      dy = ScratchView(lora_.dout, site.rows);
      ZT_RETURN_IF_ERROR(ColumnsCopy(ctx, {.src = dout, .col_begin = site.row_begin, .dst = dy}));
    }
    Tensor x = inp;
    if (layout_.lora_dropout > 0) {
      x = ScratchView(lora_.dropped, site.in);
      ZT_RETURN_IF_ERROR(LoraDropout(ctx, LoraDropoutOf(i, k, inp, x)));
    }
    ZT_RETURN_IF_ERROR(LinearBackward(ctx, {.dout = dy,
                                            .inp = a.lora_h[k],
                                            .weight = AdapterView(lora_params_[1 + i], site.b),
                                            .dinp = lora_.dh,
                                            .dweight = AdapterView(grads, site.b)}));
    ZT_RETURN_IF_ERROR(Scale(ctx, lora_.dh, layout_.lora_scale));
    const Tensor dx = ScratchView(lora_.dinp, site.in);
    ZT_RETURN_IF_ERROR(LinearBackward(ctx, {.dout = lora_.dh,
                                            .inp = x,
                                            .weight = AdapterView(lora_params_[1 + i], site.a),
                                            .dinp = dx,
                                            .dweight = AdapterView(grads, site.a)}));
    if (layout_.lora_dropout > 0) {
      // Dropout's backward is the same mask and scale on the gradient.
      ZT_RETURN_IF_ERROR(LoraDropout(ctx, LoraDropoutOf(i, k, dx, dx)));
    }
    ZT_RETURN_IF_ERROR(AddInPlace(ctx, dinp, dx));
  }
  return absl::OkStatus();
}

}  // namespace zt
