// Hugging Face interop: model weights in the tensor names and layouts that transformers'
// GPT2LMHeadModel and LlamaForCausalLM save, read into and written from ZeroTrain's per-unit
// flat buffers (worker/model/param_layout.h).
//
// The name map (i = block, C = d_model, F = d_ff, H/Hkv = heads, D = C/H, V = vocab,
// P = max_seq_len; HF shapes as stored):
//
//   GPT-2 (names read with or without "transformer."; written with it, as GPT2LMHeadModel):
//     wte.weight [V, C]                 → embedding wte
//     wpe.weight [P, C]                 → embedding wpe
//     h.i.ln_1.weight/bias [C]          → block.i ln1.weight/bias
//     h.i.attn.c_attn.weight [C, 3C]    → block.i attn.qkv.weight (3C, C)   transposed
//     h.i.attn.c_attn.bias [3C]         → block.i attn.qkv.bias
//     h.i.attn.c_proj.weight [C, C]     → block.i attn.proj.weight          transposed
//     h.i.attn.c_proj.bias [C]          → block.i attn.proj.bias
//     h.i.ln_2.weight/bias [C]          → block.i ln2.weight/bias
//     h.i.mlp.c_fc.weight [C, F]        → block.i mlp.fc.weight (F, C)      transposed
//     h.i.mlp.c_fc.bias [F]             → block.i mlp.fc.bias
//     h.i.mlp.c_proj.weight [F, C]      → block.i mlp.proj.weight (C, F)    transposed
//     h.i.mlp.c_proj.bias [C]           → block.i mlp.proj.bias
//     ln_f.weight/bias [C]              → head ln_f.weight/bias
//     lm_head.weight [V, C] (untied)    → head lm_head.weight
//   GPT-2's Conv1D stores weights (in, out), hence the transposes. h.i.attn.bias and
//   h.i.attn.masked_bias (causal-mask constants older files carry) are read and skipped.
//
//   Llama (LlamaForCausalLM; nn.Linear weights are already (out, in)):
//     model.embed_tokens.weight [V, C]                 → embedding wte
//     model.layers.i.input_layernorm.weight [C]        → block.i ln1.weight
//     model.layers.i.self_attn.q_proj.weight [H·D, C]  → block.i attn.qkv.weight rows [0, H·D)
//     model.layers.i.self_attn.k_proj.weight [Hkv·D, C]→   rows [H·D, H·D + Hkv·D)
//     model.layers.i.self_attn.v_proj.weight [Hkv·D, C]→   rows [H·D + Hkv·D, Q)
//     model.layers.i.self_attn.o_proj.weight [C, H·D]  → block.i attn.proj.weight
//     model.layers.i.post_attention_layernorm.weight   → block.i ln2.weight
//     model.layers.i.mlp.gate_proj.weight [F, C]       → block.i mlp.fc.weight rows [0, F)
//     model.layers.i.mlp.up_proj.weight [F, C]         →   rows [F, 2F)
//     model.layers.i.mlp.down_proj.weight [C, F]       → block.i mlp.proj.weight
//     model.norm.weight [C]                            → head ln_f.weight
//     lm_head.weight [V, C] (untied)                   → head lm_head.weight
//   model.layers.i.self_attn.rotary_emb.inv_freq (a buffer older transformers saved) is read
//   and skipped. q/k rows are taken as they are: ZeroTrain's rotary embedding is the
//   rotate-half form Hugging Face's Llama uses, so no head permutation is needed.
//
// A tied model (tie_embeddings) has no lm_head.weight; a file for one that carries
// lm_head.weight anyway is accepted when it equals the embedding value for value.
//
// A Hugging Face model directory (what save_pretrained writes, and `zt export`) holds
// config.json and either model.safetensors or, split by size, model-00001-of-0000N.safetensors …
// with model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map": {name: file}}).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "nlohmann/json.hpp"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"

namespace zt {

inline constexpr char kHfWeightsName[] = "model.safetensors";
inline constexpr char kHfIndexName[] = "model.safetensors.index.json";
inline constexpr char kHfConfigName[] = "config.json";

// One tensor of the name map above and where it lives in ZeroTrain's buffers: rows
// [row_offset, row_offset + out) of `param` viewed as (rows, cols), where the HF tensor is
// (out, cols), or (cols, out) when `transpose` (GPT-2 Conv1D); 1-D tensors are (n, 1). Those
// rows are one contiguous range of the unit's flat buffer: [unit_begin(), unit_begin() + numel()).
struct HfTensor {
  std::string name;  // as written (GPT-2: with "transformer.")
  std::vector<int64_t> shape;
  int unit = 0;
  const ParamSpec* param = nullptr;  // points into the layout the list was built from
  int64_t row_offset = 0;
  bool transpose = false;

  int64_t numel() const;
  int64_t unit_begin() const;
};

// Every Hugging Face tensor of `config`, in the order export writes them (the order
// GPT2LMHeadModel / LlamaForCausalLM list their parameters). The entries point into `layout`,
// which must outlive them. InvalidArgument when the family is neither GPT2 nor LLAMA, the
// heads do not divide d_model, or `layout` was not built from `config` (a parameter the map
// does not cover, or a tensor that does not fit its parameter).
absl::StatusOr<std::vector<HfTensor>> HuggingFaceTensors(const zerotrain::ModelConfig& config,
                                                         const ModelLayout& layout);

// Tensor `t` in Hugging Face's row-major order, from `unit_range`, its elements
// [t.unit_begin(), t.unit_begin() + t.numel()) of the unit's flat buffer: `unit_range` itself,
// or its transpose written into `*scratch` (GPT-2 Conv1D weights).
absl::Span<const float> HfOrder(const HfTensor& t, absl::Span<const float> unit_range,
                                std::vector<float>* scratch);

// The config.json transformers needs to build GPT2LMHeadModel or LlamaForCausalLM for
// `config` with `dtype` ("torch_dtype") weights. InvalidArgument for another family or dtype.
absl::StatusOr<nlohmann::json> HuggingFaceConfig(const zerotrain::ModelConfig& config, DType dtype);

// "model-00002-of-00005.safetensors": shard `index` (1-based) of `count`, as transformers
// names them.
std::string HfShardName(int index, int count);

// Fills every unit's flat buffer (unit_params[u] holds layout.units[u].numel floats; null: the
// unit is not read, as a pipeline stage reads only its own units) from the safetensors file at
// `path`, converting F32, F16 and BF16 tensors to f32. `path` may also be a
// Hugging Face model directory: its model.safetensors, or else the shards its
// model.safetensors.index.json lists (config.json is not read: `config` rules). An index that
// does not parse, names a file outside the directory, or disagrees with its shards (a tensor
// it maps to a file that lacks it, or one a shard holds that it maps elsewhere) is DataLoss
// naming the index; a directory with neither file is NotFound naming it.
//
// Nothing is written to the buffers unless the whole file matches the config. InvalidArgument
// naming the file and listing every problem at once: each unknown tensor, each missing tensor,
// each shape mismatch (expected vs actual), each tensor whose dtype is not a float one, a
// tensor given twice (e.g. with and without "transformer."), and a tied model's lm_head.weight
// that differs from the embedding. InvalidArgument too when the config's family is neither
// GPT2 nor LLAMA, or unit_params does not match the layout; the reader's DataLoss/NotFound
// when the file is corrupt or absent.
absl::Status ImportHuggingFace(const std::string& path, const zerotrain::ModelConfig& config,
                               const ModelLayout& layout, const std::vector<float*>& unit_params);

// The dtype (F32, F16 or BF16) of the linear weights of the Hugging Face file or directory at
// `path`: that of its first weight matrix in export order (a released model stores all of
// them alike). What a merged LoRA export writes by default: the base's original dtype.
// ImportHuggingFace's errors for a file that does not match `config`.
absl::StatusOr<DType> HuggingFaceWeightsDType(const std::string& path,
                                              const zerotrain::ModelConfig& config,
                                              const ModelLayout& layout);

// Receives a piece of one tensor of a streamed import: `values` are rows [row, row + k) of
// table entry `t` in ZeroTrain's order, i.e. rows [t.row_offset + row, …) of t.param viewed as
// (rows, cols) (GPT-2's Conv1D weights come whole, row 0, already transposed). Pieces of a
// tensor arrive in order and cover it exactly. The span lives until the sink returns.
using HfTensorSink =
    std::function<absl::Status(const HfTensor& t, int64_t row, absl::Span<const float> values)>;

// Elements per piece StreamHuggingFace hands over (whole rows, at least one): 16 MiB of f32.
inline constexpr int64_t kHfStreamPieceElements = int64_t{1} << 22;

// ImportHuggingFace's reading, a piece at a time into `sink` instead of into whole unit
// buffers: each piece is converted to f32 from the mapped file, handed over, and its mapped
// pages are released, so the reader holds one piece's f32 values (a whole transposed GPT-2
// weight and its transpose) and never the file. This is how an NF4 base quantizes while it
// streams in (quantized parameters, ParamSpec::quantized, are handed over like the rest; their
// unit_begin() means nothing). The whole file is checked first, with ImportHuggingFace's
// errors, before the sink sees a piece; an error from the sink stops the stream and is
// returned with its code, prefixed with the file and the tensor's name.
// `piece_elements` bounds a piece (whole rows, at least one). With `wanted` set, a tensor for
// which it returns false is neither converted nor handed over (a pipeline stage reads its own
// units' tensors only); the whole file is still checked.
absl::Status StreamHuggingFace(const std::string& path, const zerotrain::ModelConfig& config,
                               const ModelLayout& layout, const HfTensorSink& sink,
                               int64_t piece_elements = kHfStreamPieceElements,
                               const std::function<bool(const HfTensor&)>& wanted = {});

// Writes every unit's parameters to `path` in Hugging Face layout (GPT-2 with the
// "transformer." prefix and no lm_head.weight when tied, as GPT2LMHeadModel saves it; Llama as
// LlamaForCausalLM), as F32, F16 or BF16 (rounded to nearest even), with __metadata__
// {"format": "pt"}. Streams tensor by tensor: the extra memory is one transposed weight at
// most. Atomic: `path` appears only once complete. InvalidArgument for another dtype, a family
// that is neither GPT2 nor LLAMA or unit_params that do not match the layout; an
// errno-derived status naming the file on I/O failure.
absl::Status ExportHuggingFace(const std::string& path, const zerotrain::ModelConfig& config,
                               const ModelLayout& layout,
                               const std::vector<const float*>& unit_params,
                               DType dtype = DType::kF32);

}  // namespace zt
