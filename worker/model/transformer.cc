#include "worker/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/status_macros.h"
#include "kernels/tensor_parallel.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

// FNV-1a: a stable hash, so initialisation streams do not depend on the standard library.
uint64_t StableHash(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Writes elements [begin, end) of a stream of n draws from N(0, std) keyed by (seed, key) to
// out[0, end − begin), via Box–Muller on 53-bit uniforms in chunks of 64Ki draws, each chunk
// its own generator: the same numbers on every platform and thread count, and any range of
// the stream (a ZeRO shard) costs only the chunks it touches.
void FillNormalRange(float* out, int64_t n, int64_t begin, int64_t end, float std, uint64_t seed,
                     std::string_view key) {
  constexpr int64_t kChunk = 1 << 16;
  end = std::min(end, n);
  if (begin >= end) return;
  const int64_t first = begin / kChunk, last = (end - 1) / kChunk;
  const uint64_t base = StableHash(key, seed * 0x9E3779B97F4A7C15ull + 1);
#pragma omp parallel for schedule(static)
  for (int64_t c = first; c <= last; ++c) {
    std::mt19937_64 rng(base ^ (static_cast<uint64_t>(c) * 0xD1B54A32D192ED03ull));
    auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1p-53; };
    const int64_t chunk_end = std::min(n, (c + 1) * kChunk);
    auto put = [&](int64_t i, double v) {
      if (i >= begin && i < end) out[i - begin] = static_cast<float>(v * std);
    };
    for (int64_t i = c * kChunk; i < chunk_end; i += 2) {
      const double r = std::sqrt(-2.0 * std::log(uniform()));
      const double a = 2.0 * std::numbers::pi * uniform();
      put(i, r * std::cos(a));
      if (i + 1 < chunk_end) put(i + 1, r * std::sin(a));
    }
  }
}

}  // namespace

absl::StatusOr<Transformer> Transformer::Bind(const zerotrain::ModelConfig& config,
                                              const Arenas& state, const Arenas& work,
                                              int64_t batch, int64_t seq_len) {
  return Bind(config, state, work, batch, seq_len, TensorParallelGroup{});
}

absl::StatusOr<Transformer> Transformer::Bind(const zerotrain::ModelConfig& config,
                                              const Arenas& state, const Arenas& work,
                                              int64_t batch, int64_t seq_len,
                                              TensorParallelGroup tp) {
  return BindImpl(config, state, work, batch, seq_len, std::move(tp), nullptr);
}

absl::StatusOr<Transformer> Transformer::BindStage(const zerotrain::JobSpec& job,
                                                   const ParallelLayout& layout,
                                                   const Arenas& state, const Arenas& work,
                                                   int64_t batch, int64_t seq_len,
                                                   TensorParallelGroup tp) {
  const zerotrain::ModelConfig& config = job.model();
  if (std::max(1, tp.size) != layout.tensor_size() ||
      (tp.size > 1 && tp.rank != layout.coordinates().tensor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage: the tensor-parallel group (size ", tp.size, ", rank ",
                     tp.rank, ") is not the layout's (size ", layout.tensor_size(), ", rank ",
                     layout.coordinates().tensor, ")"));
  }
  StageSpec stage{.layout = RankModelLayout(job, layout)};
  for (const PipelineChunk& c : PipelineChunksOf(job, layout)) {
    stage.chunks.push_back({.first_unit = c.first, .last_unit = c.last, .in_flight = c.in_flight});
  }
  return BindImpl(config, state, work, batch, seq_len, std::move(tp), &stage);
}

absl::StatusOr<Transformer> Transformer::BindImpl(const zerotrain::ModelConfig& config,
                                                  const Arenas& state, const Arenas& work,
                                                  int64_t batch, int64_t seq_len,
                                                  TensorParallelGroup tp, const StageSpec* stage) {
  Transformer m;
  m.config_ = config;
  const int t = std::max(1, tp.size);
  if (t > 1) {
    // A quantized base is a LoRA job's (its shares: QuantizeBaseWeight); without adapters the
    // base would be trained, and quantized weights are frozen.
    if (!config.has_lora() && (config.base_dtype() == zerotrain::ModelConfig::NF4 ||
                               config.base_dtype() == zerotrain::ModelConfig::INT8)) {
      return absl::UnimplementedError(
          "tensor parallelism splits unquantized weights: a quantized model.base_dtype needs "
          "model.lora");
    }
    if (!tp.all_reduce || !tp.all_gather || (config.n_kv_head() < t && !tp.kv_all_reduce)) {
      return absl::InvalidArgumentError(
          "a tensor-parallel model needs the group's all_reduce and all_gather (and "
          "kv_all_reduce when n_kv_head < tensor_parallel)");
    }
    if (tp.sequence_parallel && !tp.reduce_scatter) {
      return absl::InvalidArgumentError(
          "a sequence-parallel model needs the group's reduce_scatter");
    }
    if (tp.sequence_parallel && (batch * seq_len) % t != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence parallelism: B·T = ", batch * seq_len, " token rows do not divide by ", t));
    }
  }
  if (t <= 1) tp.sequence_parallel = false;
  m.tp_ = std::move(tp);
  m.tp_.size = t;
  m.layout_ = t > 1 ? TensorParallelModelLayout(config, t) : BuildModelLayout(config);
  // The one-rank model's layout: the streams a tensor-parallel share and a pipeline head's copy
  // of the tied wte are initialised from.
  m.whole_layout_ = BuildModelLayout(config);
  const int n_units = static_cast<int>(m.layout_.units.size());
  m.chunk_ranges_ = {{.first_unit = 0, .last_unit = n_units, .in_flight = 1}};
  if (stage != nullptr) {
    // The whole model's unit indices stay (blocks keep their names and numbers); the stage's
    // own units replace theirs (the head's, with its wte copy) and the rest bind nothing.
    m.pipelined_ = true;
    m.chunk_ranges_ = stage->chunks;
  }
  for (const ChunkRange& c : m.chunk_ranges_) {
    for (int u = c.first_unit; u < c.last_unit; ++u) m.held_units_.push_back(u);
  }
  m.first_unit_ = m.chunk_ranges_.front().first_unit;
  m.last_unit_ = m.chunk_ranges_.front().last_unit;
  if (stage != nullptr) {
    if (m.held_units_.size() != stage->layout.units.size()) {
      return absl::InternalError("pipeline stage: its chunks and its layout hold different units");
    }
    for (size_t local = 0; local < m.held_units_.size(); ++local) {
      m.layout_.units[m.held_units_[local]] = stage->layout.units[local];
    }
    m.layout_.tied_embeddings = stage->layout.tied_embeddings;
    m.stage_layout_ = stage->layout;
  }
  const bool holds_head = m.HoldsUnit(n_units - 1);
  m.gpt2_ = config.family() == zerotrain::ModelConfig::GPT2;
  m.B_ = batch;
  m.T_ = seq_len;
  m.C_ = config.d_model();
  m.D_ = m.C_ / config.n_head();
  m.H_ = config.n_head() / t;
  m.Hkv_ = config.n_kv_head() >= t ? config.n_kv_head() / t : 1;
  m.F_ = config.d_ff() / t;
  m.V_ = (config.vocab_size() + t - 1) / t;
  m.vocab_begin_ = std::min<int64_t>(config.vocab_size(), m.tp_.rank * m.V_);
  m.vocab_valid_ = std::min<int64_t>(config.vocab_size() - m.vocab_begin_, m.V_);

  // Gradients are bound when both the state has them and the workspace has the backward's
  // scratch: an inference plan over trained parameters has neither need.
  // A LoRA model's gradients are its adapters' (every block has adapters: validation requires
  // a target module, and every block has every module), of the first block the model (or its
  // pipeline stage) holds; a stage without blocks trains nothing but still runs its backward.
  int probe_unit = -1;
  for (int u : m.held_units_) {
    if (probe_unit < 0 && (!m.layout_.lora || !m.layout_.units[u].lora.empty())) probe_unit = u;
  }
  const std::string grads_probe = probe_unit < 0 ? std::string("grad.residual")
                                  : m.layout_.lora
                                      ? m.layout_.units[probe_unit].name + ".lora_grads"
                                      : m.layout_.units[probe_unit].name + ".grads";
  const bool with_grads =
      (probe_unit < 0 ? work.Get(grads_probe).ok() : state.Get(grads_probe).ok()) &&
      work.Get("grad.residual").ok();
  for (const UnitLayout& u : m.layout_.units) {
    if (!m.HoldsUnit(static_cast<int>(&u - m.layout_.units.data()))) {
      m.params_.emplace_back();  // another stage's unit
      if (with_grads) m.grads_.emplace_back();
      m.lora_params_.emplace_back();
      m.lora_grads_.emplace_back();
      m.quantized_.emplace_back();
      m.qbase_shards_.emplace_back();
      continue;
    }
    ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, state.Spec(u.name + ".params"));
    if (spec->category == MemoryCategory::kNvme) {
      // offload.params NVME: the stage-3 shard lives in the swap store and compute reads the
      // gathered unit the sharding engine hands it, never this view: its shape, no memory.
      m.params_.emplace_back(nullptr, spec->dtype, std::initializer_list<int64_t>{spec->numel()});
    } else {
      ZT_ASSIGN_OR_RETURN(Tensor p, state.Get(u.name + ".params"));
      m.params_.push_back(p);
    }
    if (with_grads && u.trainable()) {
      // A pipeline stage's backward accumulates the micro-batches' gradients itself: at ZeRO
      // stage 2 into the unit's full accumulation buffer (the engine reduce-scatters it into
      // the rank's ".grads" shard after the schedule), else into ".grads".
      absl::StatusOr<Tensor> accum =
          m.pipelined_ ? state.Get(u.name + ".grad_accum") : absl::NotFoundError("");
      ZT_ASSIGN_OR_RETURN(Tensor g, accum.ok() ? accum : state.Get(u.name + ".grads"));
      m.grads_.push_back(g);
    } else if (with_grads) {
      m.grads_.emplace_back();  // frozen: no gradient
    }
    Tensor lora, lora_grads;
    if (!u.lora.empty()) {
      ZT_ASSIGN_OR_RETURN(lora, state.Get(u.name + ".lora"));
      if (with_grads) {
        // As a trainable unit's: a pipeline stage accumulates into the full buffer where the
        // plan has one (ZeRO stage 2).
        absl::StatusOr<Tensor> accum =
            m.pipelined_ ? state.Get(u.name + ".lora_grad_accum") : absl::NotFoundError("");
        ZT_ASSIGN_OR_RETURN(lora_grads, accum.ok() ? accum : state.Get(u.name + ".lora_grads"));
      }
    }
    m.lora_params_.push_back(lora);
    m.lora_grads_.push_back(lora_grads);
    std::vector<QuantizedWeightBuffers> quantized;
    // Stage 3: the rank's shard of the block's quantized bytes; its weights bind per use. A
    // swapped shard (offload.params NVME) is the store's: no view here, as for its params.
    absl::StatusOr<const BufferSpec*> qspec = state.Spec(QuantizedShardName(u));
    const bool sharded = qspec.ok();
    absl::StatusOr<Tensor> qbase = sharded && (*qspec)->category != MemoryCategory::kNvme
                                       ? state.Get(QuantizedShardName(u))
                                       : absl::StatusOr<Tensor>(Tensor());
    ZT_RETURN_IF_ERROR(qbase.status());
    m.qbase_shards_.push_back(*qbase);
    for (const ParamSpec& p : u.params) {
      if (p.quantized && sharded) {
        quantized.push_back({.name = p.name});
        continue;
      }
      if (!p.quantized) continue;
      QuantizedWeightBuffers q{.name = p.name};
      if (m.layout_.base_quantization == BaseQuantization::kInt8) {
        const std::string prefix = Int8BufferPrefix(u, p);
        ZT_ASSIGN_OR_RETURN(q.int8.codes, state.Get(prefix + "codes"));
        ZT_ASSIGN_OR_RETURN(q.int8.scales, state.Get(prefix + "scales"));
      } else {
        const std::string prefix = Nf4BufferPrefix(u, p);
        q.nf4.numel = p.numel;
        q.nf4.format = m.layout_.nf4_absmax;
        q.nf4.share = Nf4ShareShapeOf(m.layout_, p);
        ZT_ASSIGN_OR_RETURN(q.nf4.codes, state.Get(prefix + "codes"));
        ZT_ASSIGN_OR_RETURN(q.nf4.absmax, state.Get(prefix + "absmax"));
        if (q.nf4.format != Nf4Absmax::kF32) {
          ZT_ASSIGN_OR_RETURN(q.nf4.absmax_scale, state.Get(prefix + "absmax_scale"));
          ZT_ASSIGN_OR_RETURN(q.nf4.absmax_offset, state.Get(prefix + "absmax_offset"));
        }
        if (q.nf4.format == Nf4Absmax::kGroupIndexed) {
          ZT_ASSIGN_OR_RETURN(q.nf4.block_base, state.Get(prefix + "block_base"));
        }
      }
      quantized.push_back(std::move(q));
    }
    m.quantized_.push_back(std::move(quantized));
  }
  // A chunk's saved activations lead with its in-flight micro-batches: each is bound to slot
  // 0 here and remembered, so SelectMicroBatch can move it (the shared "recompute.*" set is
  // one micro-batch's).
  auto chunk_of_unit = [&](int u) {
    for (size_t c = 0; c < m.chunk_ranges_.size(); ++c) {
      if (u >= m.chunk_ranges_[c].first_unit && u < m.chunk_ranges_[c].last_unit) {
        return static_cast<int>(c);
      }
    }
    return -1;
  };
  auto slotted = [&](int chunk) {
    return m.pipelined_ && chunk >= 0 && m.chunk_ranges_[chunk].in_flight > 1;
  };
  // A buffer of more than 3 dimensions comes out of the arena flat: the slot's shape is the
  // plan's without its leading in-flight dimension.
  auto binding = [&](const std::string& name, const Tensor& base,
                     int chunk) -> absl::StatusOr<SlotBinding> {
    ZT_ASSIGN_OR_RETURN(const BufferSpec* spec, work.Spec(name));
    const int in_flight = m.chunk_ranges_[chunk].in_flight;
    if (spec->shape.size() < 2 || spec->shape[0] != in_flight) {
      return absl::InternalError(absl::StrCat("memory plan: buffer '", name,
                                              "' does not lead with its chunk's ", in_flight,
                                              " micro-batches in flight"));
    }
    SlotBinding b;
    b.chunk = chunk;
    b.base = base;
    b.shape.assign(spec->shape.begin() + 1, spec->shape.end());
    return b;
  };
  // residual.i: the input of block i (unit 1 + i) and the output of unit i.
  for (int i = 0; i <= config.n_layer(); ++i) {
    if (!m.HoldsUnit(1 + i) && !m.HoldsUnit(i)) {
      m.residual_.emplace_back();
      continue;
    }
    ZT_ASSIGN_OR_RETURN(Tensor r, work.Get(absl::StrCat("residual.", i)));
    // Kept by the chunk of the block it enters, else of the unit it leaves (the plan's rule).
    const int chunk = m.HoldsUnit(1 + i) ? chunk_of_unit(1 + i) : chunk_of_unit(i);
    if (slotted(chunk)) {
      ZT_ASSIGN_OR_RETURN(SlotBinding b, binding(absl::StrCat("residual.", i), r, chunk));
      b.residual = i;
      ZT_ASSIGN_OR_RETURN(r, SlotView(b, 0));
      m.slots_.push_back(std::move(b));
    }
    m.residual_.push_back(r);
  }
  // Buffers a family does not use (RMSNorm has no means) stay empty views.
  auto optional = [&](const std::string& name) -> Tensor {
    absl::StatusOr<Tensor> t = work.Get(name);
    return t.ok() ? *t : Tensor();
  };
  // A block's tensor is its own ("block.i.x") or, when the plan checkpoints it, the shared
  // recompute set's ("recompute.x").
  auto block_tensor = [&](const std::string& prefix, const char* name,
                          bool* shared) -> absl::StatusOr<Tensor> {
    absl::StatusOr<Tensor> own = work.Get(prefix + name);
    if (own.ok()) return own;
    *shared = true;
    return work.Get(absl::StrCat("recompute.", name));
  };
  for (int i = 0; i < config.n_layer(); ++i) {
    if (!m.HoldsUnit(1 + i)) {
      m.blocks_.emplace_back();  // another stage's block
      continue;
    }
    const std::string p = absl::StrCat("block.", i, ".");
    BlockActs a;
    bool shared_input = false, shared_core = false;
    ZT_ASSIGN_OR_RETURN(a.ln1, block_tensor(p, "ln1", &shared_input));
    ZT_ASSIGN_OR_RETURN(a.ln1_rstd, block_tensor(p, "ln1_rstd", &shared_input));
    ZT_ASSIGN_OR_RETURN(a.qkv, block_tensor(p, "qkv", &shared_input));
    ZT_ASSIGN_OR_RETURN(a.res2, block_tensor(p, "res2", &shared_input));
    ZT_ASSIGN_OR_RETURN(a.ln2, block_tensor(p, "ln2", &shared_input));
    ZT_ASSIGN_OR_RETURN(a.ln2_rstd, block_tensor(p, "ln2_rstd", &shared_input));
    ZT_ASSIGN_OR_RETURN(a.fch, block_tensor(p, "fch", &shared_input));
    if (m.gpt2_) {
      ZT_ASSIGN_OR_RETURN(a.ln1_mean, block_tensor(p, "ln1_mean", &shared_input));
      ZT_ASSIGN_OR_RETURN(a.ln2_mean, block_tensor(p, "ln2_mean", &shared_input));
    }
    ZT_ASSIGN_OR_RETURN(a.atty, block_tensor(p, "atty", &shared_core));
    ZT_ASSIGN_OR_RETURN(a.att_lse, block_tensor(p, "att_lse", &shared_core));
    ZT_ASSIGN_OR_RETURN(a.fch_act, block_tensor(p, "fch_act", &shared_core));
    for (const LoraSite& site : m.layout_.block(i).lora) {
      const std::string name = absl::StrCat(p, "lora.", site.hf_path);
      ZT_ASSIGN_OR_RETURN(Tensor h, work.Get(name));
      if (slotted(chunk_of_unit(1 + i))) {
        // The adapter's kept h, one per micro-batch in flight, as the block's own buffers.
        ZT_ASSIGN_OR_RETURN(SlotBinding b, binding(name, h, chunk_of_unit(1 + i)));
        b.block = i;
        b.lora_site = static_cast<int>(a.lora_h.size());
        ZT_ASSIGN_OR_RETURN(h, SlotView(b, 0));
        m.slots_.push_back(std::move(b));
      }
      a.lora_h.push_back(h);
    }
    a.recompute = shared_input  ? Recompute::kFull
                  : shared_core ? Recompute::kSelective
                                : Recompute::kNone;
    if (slotted(chunk_of_unit(1 + i))) {
      // The block's own buffers (not the shared recompute set's) hold every slot.
      for (Tensor BlockActs::*f :
           {&BlockActs::ln1, &BlockActs::ln1_mean, &BlockActs::ln1_rstd, &BlockActs::qkv,
            &BlockActs::atty, &BlockActs::att_lse, &BlockActs::res2, &BlockActs::ln2,
            &BlockActs::ln2_mean, &BlockActs::ln2_rstd, &BlockActs::fch, &BlockActs::fch_act}) {
        Tensor& t = a.*f;
        if (t.empty()) continue;
        if (!work.Get(p + BlockFieldName(f)).ok()) continue;  // shared: one micro-batch
        ZT_ASSIGN_OR_RETURN(SlotBinding b, binding(p + BlockFieldName(f), t, chunk_of_unit(1 + i)));
        b.block = i;
        b.block_field = f;
        ZT_ASSIGN_OR_RETURN(t, SlotView(b, 0));
        m.slots_.push_back(std::move(b));
      }
    }
    m.blocks_.push_back(a);
  }
  if (holds_head) {
    ZT_ASSIGN_OR_RETURN(m.lnf_, work.Get("head.lnf"));
    m.lnf_mean_ = optional("head.lnf_mean");
    ZT_ASSIGN_OR_RETURN(m.lnf_rstd_, work.Get("head.lnf_rstd"));
    ZT_ASSIGN_OR_RETURN(m.losses_, work.Get("head.losses"));
    ZT_ASSIGN_OR_RETURN(m.logits_, work.Get("logits"));
    if (slotted(chunk_of_unit(n_units - 1))) {
      const std::pair<Tensor Transformer::*, const char*> fields[] = {
          {&Transformer::lnf_, "head.lnf"},
          {&Transformer::lnf_mean_, "head.lnf_mean"},
          {&Transformer::lnf_rstd_, "head.lnf_rstd"},
          {&Transformer::losses_, "head.losses"}};
      for (const auto& [f, name] : fields) {
        Tensor& t = m.*f;
        if (t.empty()) continue;
        ZT_ASSIGN_OR_RETURN(SlotBinding b, binding(name, t, chunk_of_unit(n_units - 1)));
        b.field = f;
        ZT_ASSIGN_OR_RETURN(t, SlotView(b, 0));
        m.slots_.push_back(std::move(b));
      }
    }
  }
  ZT_ASSIGN_OR_RETURN(m.tokens_, work.Get("tokens"));
  ZT_ASSIGN_OR_RETURN(m.targets_, work.Get("targets"));
  if (t > 1) {
    // The parallel cross-entropy's statistics: planned on the head's stage only.
    if (holds_head) {
      ZT_ASSIGN_OR_RETURN(m.ce_maxes_, work.Get("tp.ce_maxes"));
      ZT_ASSIGN_OR_RETURN(m.ce_sums_, work.Get("tp.ce_sums"));
    }
    if (m.tp_.sequence_parallel) {
      ZT_ASSIGN_OR_RETURN(m.sequence_full_, work.Get("tp.sequence_full"));
    }
    for (int i = 0; i < config.n_layer(); ++i) {
      m.kv_ranges_.push_back(ReplicatedKvRanges(config, m.layout_.block(i), t, m.tp_.rank));
    }
  }
  if (m.layout_.lora) {
    // A pipeline stage plans what its units use: the adapters' scratch where it holds blocks,
    // the frozen norms' sink where it holds a norm.
    m.lora_.out = optional("lora.out");
    m.lora_.dout = optional("lora.dout");
    m.lora_.dh = optional("lora.dh");
    m.lora_.dinp = optional("lora.dinp");
    m.lora_.norm_sink = optional("lora.norm_grad_sink");
    m.lora_.dropped = optional("lora.dropped");
  }
  if (m.pipelined_) {
    for (int u : m.held_units_) {
      m.stage_params_.push_back(m.params_[u]);
      if (with_grads) m.stage_grads_.push_back(m.grads_[u]);
      m.stage_lora_.push_back(m.lora_params_[u]);
      m.stage_lora_grads_.push_back(m.lora_grads_[u]);
    }
  }
  if (with_grads) {
    ZT_ASSIGN_OR_RETURN(m.grad_.residual, work.Get("grad.residual"));
    ZT_ASSIGN_OR_RETURN(m.grad_.ln, work.Get("grad.ln"));
    // A stage without blocks has no block gradient scratch in its plan.
    m.grad_.qkv = optional("grad.qkv");
    m.grad_.atty = optional("grad.atty");
    m.grad_.fch = optional("grad.fch");
    m.grad_.fch_act = optional("grad.fch_act");
  }
  return m;
}

const char* Transformer::BlockFieldName(Tensor BlockActs::*f) {
  if (f == &BlockActs::ln1) return "ln1";
  if (f == &BlockActs::ln1_mean) return "ln1_mean";
  if (f == &BlockActs::ln1_rstd) return "ln1_rstd";
  if (f == &BlockActs::qkv) return "qkv";
  if (f == &BlockActs::atty) return "atty";
  if (f == &BlockActs::att_lse) return "att_lse";
  if (f == &BlockActs::res2) return "res2";
  if (f == &BlockActs::ln2) return "ln2";
  if (f == &BlockActs::ln2_mean) return "ln2_mean";
  if (f == &BlockActs::ln2_rstd) return "ln2_rstd";
  if (f == &BlockActs::fch) return "fch";
  return "fch_act";
}

absl::StatusOr<Tensor> Transformer::SlotView(const SlotBinding& b, int slot) {
  int64_t per_slot = 1;
  for (int64_t d : b.shape) per_slot *= d;
  if (slot < 0 || (slot + 1) * per_slot > b.base.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch slot ", slot, " of ", b.base.DebugString(), ": out of range"));
  }
  char* data = static_cast<char*>(b.base.raw()) + slot * per_slot * DTypeSize(b.base.dtype());
  switch (b.shape.size()) {
    case 1:
      return Tensor(data, b.base.dtype(), {b.shape[0]}, b.base.device());
    case 2:
      return Tensor(data, b.base.dtype(), {b.shape[0], b.shape[1]}, b.base.device());
    case 3:
      return Tensor(data, b.base.dtype(), {b.shape[0], b.shape[1], b.shape[2]}, b.base.device());
    default:
      return absl::InvalidArgumentError(absl::StrCat("micro-batch slots of ", b.base.DebugString(),
                                                     ": more than 3 dimensions per slot"));
  }
}

absl::Status Transformer::SetStageComputeParams(const std::vector<Tensor>& units) {
  if (!pipelined_ || units.size() != held_units_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("stage compute parameters: a pipeline stage of ",
                                                   held_units_.size(), " units got ",
                                                   units.size()));
  }
  compute_params_.assign(params_.size(), Tensor());
  for (size_t local = 0; local < units.size(); ++local) {
    if (units[local].numel() < layout_.units[held_units_[local]].numel) {
      return absl::InvalidArgumentError(absl::StrCat("stage compute parameters of unit ",
                                                     layout_.units[held_units_[local]].name,
                                                     ": smaller than the unit"));
    }
    compute_params_[held_units_[local]] = units[local];
  }
  return absl::OkStatus();
}

bool Transformer::HoldsUnit(int u) const {
  for (const ChunkRange& c : chunk_ranges_) {
    if (u >= c.first_unit && u < c.last_unit) return true;
  }
  return false;
}

absl::Status Transformer::SelectMicroBatch(int chunk, int slot) {
  if (chunk < 0 || chunk >= chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model chunk ", chunk, ": the stage holds ", chunks(), " chunks"));
  }
  if (slot < 0 || slot >= in_flight(chunk)) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch slot ", slot, " of chunk ", chunk,
                                                   ": it holds ", in_flight(chunk), " in flight"));
  }
  first_unit_ = chunk_ranges_[chunk].first_unit;
  last_unit_ = chunk_ranges_[chunk].last_unit;
  for (const SlotBinding& b : slots_) {
    if (b.chunk != chunk) continue;
    ZT_ASSIGN_OR_RETURN(Tensor v, SlotView(b, slot));
    if (b.block >= 0 && b.lora_site >= 0) {
      blocks_[b.block].lora_h[b.lora_site] = v;
    } else if (b.block >= 0) {
      blocks_[b.block].*(b.block_field) = v;
    } else if (b.residual >= 0) {
      residual_[b.residual] = v;
    } else {
      this->*(b.field) = v;
    }
  }
  return absl::OkStatus();
}

absl::Status Transformer::StageForward(const DeviceContext& ctx, const LossOptions& options) {
  if (options.write_grad && grads_.empty()) {
    return absl::FailedPreconditionError("forward with gradients on a model bound without them");
  }
  if (head_backward_due_) {
    return absl::FailedPreconditionError(
        "the last stage's forward before the backward of its previous micro-batch (the head's "
        "gradient scratch holds one)");
  }
  const int head = static_cast<int>(layout_.units.size()) - 1;
  if (chunk_is_first()) {
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(0));
    ZT_RETURN_IF_ERROR(EmbeddingForward(ctx, p));
    ZT_RETURN_IF_ERROR(FinishStageUnit(0));
  }
  for (int u = std::max(first_unit_, 1); u < std::min(last_unit_, head); ++u) {
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(u));
    ZT_RETURN_IF_ERROR(BlockForward(ctx, u - 1, p));
    ZT_RETURN_IF_ERROR(FinishStageUnit(u));
  }
  if (!chunk_is_last()) return absl::OkStatus();
  ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(head));
  ZT_RETURN_IF_ERROR(HeadForward(ctx, p));
  head_grad_ = Tensor();
  if (options.write_grad) {
    ZT_ASSIGN_OR_RETURN(head_grad_, StageGradient(ctx, head));
  }
  ZT_RETURN_IF_ERROR(HeadLoss(ctx, p, head_grad_, ComputeParams(0),
                              options.write_grad && HoldsUnit(0) ? grads_.front() : Tensor(),
                              options));
  ZT_RETURN_IF_ERROR(FinishStageUnit(head));
  head_backward_due_ = options.write_grad;
  return absl::OkStatus();
}

absl::Status Transformer::StageBackward(const DeviceContext& ctx) {
  if (grads_.empty()) {
    return absl::FailedPreconditionError("backward on a model bound without gradients");
  }
  const int head = static_cast<int>(layout_.units.size()) - 1;
  if (chunk_is_last()) {
    if (!head_backward_due_) {
      return absl::FailedPreconditionError(
          "the last stage's backward without the forward (with write_grad) of its micro-batch");
    }
    head_backward_due_ = false;
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(head));
    ZT_RETURN_IF_ERROR(HeadBackward(ctx, p, head_grad_));
    ZT_RETURN_IF_ERROR(FinishStageUnit(head));
    ZT_RETURN_IF_ERROR(StageGradientDone(ctx, head));
  }
  for (int u = std::min(last_unit_, head) - 1; u >= std::max(first_unit_, 1); --u) {
    ZT_ASSIGN_OR_RETURN(const Tensor p, AcquireStageUnit(u));
    // The gradient of the block's trainable buffer: its adapters' in a LoRA model.
    ZT_ASSIGN_OR_RETURN(const Tensor g, StageGradient(ctx, u));
    ZT_RETURN_IF_ERROR(BlockBackward(ctx, u - 1, p, g));
    ZT_RETURN_IF_ERROR(FinishStageUnit(u));
    ZT_RETURN_IF_ERROR(StageGradientDone(ctx, u));
  }
  if (chunk_is_first()) {
    ZT_ASSIGN_OR_RETURN(const Tensor g, StageGradient(ctx, 0));
    ZT_RETURN_IF_ERROR(EmbeddingBackward(ctx, g));
    ZT_RETURN_IF_ERROR(StageGradientDone(ctx, 0));
  }
  return absl::OkStatus();
}

Tensor Transformer::View(const UnitLayout& unit, const Tensor& flat, const char* name) const {
  const ParamSpec* p = unit.Find(name);
  if (p == nullptr || p->quantized || flat.empty()) return Tensor();
  // Parameters and gradients may be 16-bit (precision.param_dtype / grad_dtype): the view
  // keeps the buffer's dtype.
  char* data = static_cast<char*>(flat.raw()) + p->offset * DTypeSize(flat.dtype());
  if (p->shape.size() == 1) return Tensor(data, flat.dtype(), {p->shape[0]}, flat.device());
  return Tensor(data, flat.dtype(), {p->shape[0], p->shape[1]}, flat.device());
}

void Transformer::InitializeWeights(uint64_t seed) { InitializeWeights(seed, unit_params()); }

void Transformer::InitializeWeights(uint64_t seed, const std::vector<Tensor>& into) {
  for (size_t u = 0; u < layout().units.size(); ++u) {
    InitializeUnitRange(seed, static_cast<int>(u), 0, layout().units[u].numel,
                        into[u].data<float>());
  }
}

void Transformer::InitializeUnitRange(uint64_t seed, int u, int64_t begin, int64_t end,
                                      float* out) const {
  const UnitLayout& unit = layout_.units[held_units_[u]];  // a stage's u: its own units
  std::fill(out, out + (end - begin), 0.0f);               // padding past the unit's last tensor
  for (const ParamSpec& p : unit.params) {
    if (p.quantized) continue;  // not in the flat buffer: InitializeQuantizedBase
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    float* data = out + (lo - begin);
    const bool is_norm_weight = p.name.starts_with("ln") && p.name.ends_with(".weight");
    if (is_norm_weight) {
      std::fill(data, data + (hi - lo), 1.0f);
    } else if (p.shape.size() == 1) {
      std::fill(data, data + (hi - lo), 0.0f);  // biases
    } else if (pipelined_ && p.name == "lm_head.weight" && whole_layout_.tied_embeddings) {
      // The last stage's copy of the tied embedding starts as the embedding itself (under
      // tensor parallelism as the rank's vocabulary rows of it, the first stage's share).
      const UnitLayout& embedding = whole_layout_.embedding();
      const ParamSpec& wte = *embedding.Find("wte");
      if (tp_.size > 1) {
        FillInitialSlice(seed, embedding, wte, lo - p.offset, hi - p.offset, data);
      } else {
        FillInitialMatrix(seed, embedding, wte, lo - p.offset, hi - p.offset, data);
      }
    } else if (tp_.size > 1) {
      const UnitLayout& whole_unit = whole_layout_.units[&unit - layout_.units.data()];
      FillInitialSlice(seed, whole_unit, *whole_unit.Find(p.name), lo - p.offset, hi - p.offset,
                       data);
    } else {
      FillInitialMatrix(seed, unit, p, lo - p.offset, hi - p.offset, data);
    }
  }
}

void Transformer::FillInitialSlice(uint64_t seed, const UnitLayout& whole_unit,
                                   const ParamSpec& whole, int64_t begin, int64_t end,
                                   float* out) const {
  const TensorParallelSlice s = SliceOf(config_, whole.name, whole.shape, tp_.size, tp_.rank);
  std::fill(out, out + (end - begin), 0.0f);  // padding rows
  const int64_t lc = s.local_cols, gc = s.global_cols;
  std::vector<float> rows;
  for (const TensorParallelSlice::Rows& run : s.rows) {
    // The run's local rows that overlap [begin, end), generated as whole rows of the whole
    // tensor's stream (a row-parallel weight's rows are P times wider than the slice's).
    const int64_t first = std::max(run.local_begin, begin / lc);
    const int64_t last = std::min(run.local_begin + run.count, (end + lc - 1) / lc);
    if (first >= last) continue;
    const int64_t g0 = run.global_begin + (first - run.local_begin);
    rows.resize((last - first) * gc);
    FillInitialMatrix(seed, whole_unit, whole, g0 * gc, (g0 + last - first) * gc, rows.data());
    for (int64_t r = first; r < last; ++r) {
      for (int64_t c = 0; c < lc; ++c) {
        const int64_t local = r * lc + c;
        if (local >= begin && local < end) {
          out[local - begin] = rows[(r - first) * gc + s.col_begin + c];
        }
      }
    }
  }
}

void Transformer::FillInitialMatrix(uint64_t seed, const UnitLayout& unit, const ParamSpec& p,
                                    int64_t begin, int64_t end, float* out) const {
  const float std = config_.init_std();
  const float residual_std = std / std::sqrt(2.0f * static_cast<float>(config_.n_layer()));
  const bool residual_proj = p.name == "attn.proj.weight" || p.name == "mlp.proj.weight";
  FillNormalRange(out, p.numel, begin, end, residual_proj ? residual_std : std, seed,
                  absl::StrCat(unit.name, ".", p.name));
}

absl::Status Transformer::TpAllReduce(const Tensor& t, const std::string& label) {
  if (tp_.size <= 1) return absl::OkStatus();
  return tp_.all_reduce(t, label);
}

absl::Status Transformer::ReduceReplicatedKvGrads(int i, const Tensor& grads) {
  if (tp_.size <= 1) return absl::OkStatus();
  if (layout_.lora && !grads.empty()) {
    // A LoRA block's `grads` are its adapters': a column-parallel site's A is replicated and
    // each rank's gradient of it is the partial dhᵀx of its own output rows (dh = Σ_k dy_k·B_k),
    // summed here over the group so every rank steps the same A.
    // A replicated KV head's B rows (n_kv_head < tp) have, on each rank, the gradient of its own
    // query heads' share of dK / dV only: summed over the ranks sharing the head, as the base's
    // replicated KV rows are below.
    const int64_t size = DTypeSize(grads.dtype());
    const auto flat = [&](const ParamSpec& p) {
      return Tensor(static_cast<char*>(grads.raw()) + p.offset * size, grads.dtype(), {p.numel},
                    grads.device());
    };
    for (const LoraSite& site : layout_.block(i).lora) {
      if (IsRowParallelLoraSite(site)) continue;
      ZT_RETURN_IF_ERROR(tp_.all_reduce(
          flat(site.a),
          absl::StrCat(layout_.block(i).name, " ", site.hf_path, ".lora_A gradient all-reduce")));
      if (IsKvLoraSite(site) && config_.n_kv_head() < tp_.size) {
        ZT_RETURN_IF_ERROR(tp_.kv_all_reduce(
            flat(site.b),
            absl::StrCat(layout_.block(i).name, " ", site.hf_path, ".lora_B kv all-reduce")));
      }
    }
    return absl::OkStatus();
  }
  for (const auto& [begin, end] : kv_ranges_[i]) {
    ZT_RETURN_IF_ERROR(tp_.kv_all_reduce(grads.Slice(begin, end),
                                         absl::StrCat(layout_.block(i).name, " kv all-reduce")));
  }
  return absl::OkStatus();
}

absl::Status Transformer::EmbeddingForward(const DeviceContext& ctx, const Tensor& params) {
  if (vocab_sharded()) return VocabShardedEmbeddingForward(ctx, params);
  const UnitLayout& u = layout_.embedding();
  if (tp_.size > 1) {
    // Each rank looks up the tokens of its vocabulary rows (zero elsewhere); rank 0 adds the
    // positions (a packed batch's, restarting at each document), so the group's sum is the
    // whole table's embedding.
    // With sequence parallelism the sum is reduce-scattered onto the rank's token rows.
    const Tensor out = RowParallelOutput(residual_[0]).Reshape({B_, T_, C_});
    const Tensor wpe = tp_.rank == 0 ? View(u, params, "wpe") : Tensor();
    ZT_RETURN_IF_ERROR(
        VocabShardEmbeddingForward(ctx, {.tokens = tokens_,
                                         .wte = View(u, params, "wte"),
                                         .wpe = wpe,
                                         .vocab_begin = vocab_begin_,
                                         .positions = wpe.empty() ? Tensor() : positions_,
                                         .out = out}));
    return ReduceRowParallelOutput(residual_[0], "embedding all-reduce");
  }
  const Tensor wpe = View(u, params, "wpe");
  return zt::EmbeddingForward(ctx, {.tokens = tokens_,
                                    .wte = View(u, params, "wte"),
                                    .wpe = wpe,
                                    .out = residual_[0].Reshape({B_, T_, C_}),
                                    .positions = wpe.empty() ? Tensor() : positions_});
}

absl::Status Transformer::BlockForward(const DeviceContext& ctx, int i, const Tensor& params) {
  return BlockForwardImpl(ctx, i, params, /*write_output=*/true);
}

absl::Status Transformer::AttentionCore(const DeviceContext& ctx, const BlockActs& a) {
  return AttentionForward(ctx, {.qkv = a.qkv.Reshape({B_, T_, a.qkv.dim(1)}),
                                .out = a.atty.Reshape({B_, T_, H_ * D_}),
                                .lse = a.att_lse,
                                .n_head = static_cast<int>(H_),
                                .n_kv_head = static_cast<int>(Hkv_),
                                .doc_starts = doc_starts_});
}

absl::Status Transformer::MlpActivation(const DeviceContext& ctx, const BlockActs& a) {
  return gpt2_ ? GeluForward(ctx, a.fch, a.fch_act) : SwigluForward(ctx, a.fch, a.fch_act);
}

absl::Status Transformer::BlockForwardImpl(const DeviceContext& ctx, int i, const Tensor& params,
                                           bool write_output) {
  const UnitLayout& u = layout_.block(i);
  const BlockActs& a = blocks_[i];
  const Tensor& x = residual_[i];        // (BT, C) block input
  const Tensor& out = residual_[i + 1];  // (BT, C) block output

  // Attention branch: x -> ln1 -> qkv -> (rope) -> attention -> proj, added to x.
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(LayerNormForward(ctx, {.inp = x,
                                              .weight = View(u, params, "ln1.weight"),
                                              .bias = View(u, params, "ln1.bias"),
                                              .out = a.ln1,
                                              .mean = a.ln1_mean,
                                              .rstd = a.ln1_rstd,
                                              .eps = config_.norm_eps()}));
  } else {
    ZT_RETURN_IF_ERROR(RmsNormForward(ctx, {.inp = x,
                                            .weight = View(u, params, "ln1.weight"),
                                            .out = a.ln1,
                                            .rstd = a.ln1_rstd,
                                            .eps = config_.norm_eps()}));
  }
  // Sequence parallelism: ln1 is the rank's token rows; qkv reads the group's, gathered.
  ZT_ASSIGN_OR_RETURN(const Tensor ln1_in,
                      ColumnParallelInput(a.ln1, absl::StrCat(u.name, " attention gather")));
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "attn.qkv.weight", "attn.qkv.bias", ln1_in,
                                        a.qkv));  // (BT, Q)
  const Tensor qkv3 = a.qkv.Reshape({B_, T_, a.qkv.dim(1)});
  if (!gpt2_) {
    ZT_RETURN_IF_ERROR(RopeApply(ctx, {.qkv = qkv3,
                                       .n_head = static_cast<int>(H_),
                                       .n_kv_head = static_cast<int>(Hkv_),
                                       .theta = config_.rope_theta(),
                                       .positions = positions_}));
  }
  ZT_RETURN_IF_ERROR(AttentionCore(ctx, a));
  // Row-parallel under tensor parallelism: the ranks' partial products are summed (Megatron's
  // g), then the bias is added once.
  const bool tp = tp_.size > 1;
  // (Reduce-scattered onto the rank's token rows with sequence parallelism.)
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "attn.proj.weight",
                                        tp ? "" : "attn.proj.bias", a.atty,
                                        RowParallelOutput(a.res2)));
  if (tp) {
    ZT_RETURN_IF_ERROR(
        ReduceRowParallelOutput(a.res2, absl::StrCat(u.name, " attention all-reduce")));
    if (gpt2_) {
      ZT_RETURN_IF_ERROR(
          AddRowBias(ctx, {.out = a.res2, .bias = View(u, params, "attn.proj.bias")}));
    }
  }
  ZT_RETURN_IF_ERROR(Add(ctx, a.res2, x, a.res2));  // res2 = x + attn(x)

  // MLP branch: res2 -> ln2 -> fc -> gelu | swiglu -> proj, added to res2.
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(LayerNormForward(ctx, {.inp = a.res2,
                                              .weight = View(u, params, "ln2.weight"),
                                              .bias = View(u, params, "ln2.bias"),
                                              .out = a.ln2,
                                              .mean = a.ln2_mean,
                                              .rstd = a.ln2_rstd,
                                              .eps = config_.norm_eps()}));
  } else {
    ZT_RETURN_IF_ERROR(RmsNormForward(ctx, {.inp = a.res2,
                                            .weight = View(u, params, "ln2.weight"),
                                            .out = a.ln2,
                                            .rstd = a.ln2_rstd,
                                            .eps = config_.norm_eps()}));
  }
  ZT_ASSIGN_OR_RETURN(const Tensor ln2_in,
                      ColumnParallelInput(a.ln2, absl::StrCat(u.name, " mlp gather")));
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "mlp.fc.weight", "mlp.fc.bias", ln2_in,
                                        a.fch));  // (BT, F) | (BT, 2F)
  ZT_RETURN_IF_ERROR(MlpActivation(ctx, a));
  // A recompute for the backward stops here: the block's output is kept already.
  if (!write_output) return absl::OkStatus();
  ZT_RETURN_IF_ERROR(BlockLinearForward(ctx, i, params, "mlp.proj.weight",
                                        tp ? "" : "mlp.proj.bias", a.fch_act,
                                        RowParallelOutput(out)));
  if (tp) {
    ZT_RETURN_IF_ERROR(ReduceRowParallelOutput(out, absl::StrCat(u.name, " mlp all-reduce")));
    if (gpt2_) {
      ZT_RETURN_IF_ERROR(AddRowBias(ctx, {.out = out, .bias = View(u, params, "mlp.proj.bias")}));
    }
  }
  return Add(ctx, out, a.res2, out);  // out = res2 + mlp(res2)
}

absl::Status Transformer::HeadForward(const DeviceContext& ctx, const Tensor& params) {
  const UnitLayout& u = layout_.head();
  const Tensor& x = residual_.back();
  if (gpt2_) {
    return LayerNormForward(ctx, {.inp = x,
                                  .weight = View(u, params, "ln_f.weight"),
                                  .bias = View(u, params, "ln_f.bias"),
                                  .out = lnf_,
                                  .mean = lnf_mean_,
                                  .rstd = lnf_rstd_,
                                  .eps = config_.norm_eps()});
  }
  return RmsNormForward(ctx, {.inp = x,
                              .weight = View(u, params, "ln_f.weight"),
                              .out = lnf_,
                              .rstd = lnf_rstd_,
                              .eps = config_.norm_eps()});
}

Tensor Transformer::HeadWeight(const Tensor& params, const Tensor& embedding_params) const {
  return layout_.tied_embeddings ? View(layout_.embedding(), embedding_params, "wte")
                                 : View(layout_.head(), params, "lm_head.weight");
}

absl::Status Transformer::HeadLoss(const DeviceContext& ctx, const Tensor& params,
                                   const Tensor& grads, const Tensor& embedding_params,
                                   const Tensor& embedding_grads, const LossOptions& options) {
  if (vocab_sharded()) {
    // The tied head's weight is the embedding's wte: each rank projects onto its own rows.
    return VocabShardedHeadLoss(ctx, embedding_params, embedding_grads, options);
  }
  const Tensor w = HeadWeight(params, embedding_params);
  const Tensor dw = options.write_grad ? HeadWeight(grads, embedding_grads) : Tensor();
  const Tensor targets = targets_.Reshape({B_ * T_});
  // The logits exist one chunk of rows at a time: project, fuse softmax + cross-entropy
  // (overwriting the chunk with dL/dlogits), then, when training, the projection's backward
  // for the chunk — so (B·T, V) logits are never held at once.
  // Sequence parallelism: the final norm ran on the rank's token rows; the head reads them all.
  ZT_ASSIGN_OR_RETURN(const Tensor lnf_all, ColumnParallelInput(lnf_, "head gather"));
  const int64_t chunk = logits_.dim(0);
  for (int64_t r0 = 0; r0 < B_ * T_; r0 += chunk) {
    const int64_t r1 = std::min(B_ * T_, r0 + chunk);
    const Tensor logits = logits_.Slice(0, r1 - r0);
    const Tensor lnf = lnf_all.Slice(r0, r1);
    ZT_RETURN_IF_ERROR(LinearForward(ctx, {.inp = lnf, .weight = w, .out = logits}));
    if (tp_.size > 1) {
      ZT_RETURN_IF_ERROR(ParallelCrossEntropy(ctx, logits, targets, r0, r1, options));
    } else {
      ZT_RETURN_IF_ERROR(SoftmaxCrossEntropy(ctx, {.logits = logits,
                                                   .targets = targets.Slice(r0, r1),
                                                   .losses = losses_.Slice(r0, r1),
                                                   .grad_scale = options.grad_scale,
                                                   .write_grad = options.write_grad}));
    }
    if (options.write_grad && dw.empty()) {
      // A frozen head (LoRA): only dL/d(norm output) = dlogits · W.
      ZT_RETURN_IF_ERROR(Gemm(ctx, logits, w, grad_.ln.Slice(r0, r1), {}));
    } else if (options.write_grad) {
      ZT_RETURN_IF_ERROR(LinearBackward(ctx, {.dout = logits,
                                              .inp = lnf,
                                              .weight = w,
                                              .dinp = grad_.ln.Slice(r0, r1),
                                              .dweight = dw}));
    }
  }
  // The head's input gradient is the sum of the ranks' vocabulary shares' (Megatron's f); with
  // sequence parallelism HeadBackward reduce-scatters it onto the token rows instead.
  if (options.write_grad && !sequence_parallel()) {
    ZT_RETURN_IF_ERROR(TpAllReduce(grad_.ln, "head all-reduce"));
  }
  if (options.loss_sum.empty()) return absl::OkStatus();
  // Mean over the valid targets of this micro-batch, summed in double in a fixed order.
  return AccumulateMeanLoss(ctx, {.losses = losses_,
                                  .targets = targets,
                                  .divisor = options.loss_divisor,
                                  .sum = options.loss_sum});
}

absl::Status Transformer::ParallelCrossEntropy(const DeviceContext& ctx, const Tensor& logits,
                                               const Tensor& targets, int64_t r0, int64_t r1,
                                               const LossOptions& options) {
  return SplitCrossEntropy(ctx,
                           {.size = tp_.size,
                            .rank = tp_.rank,
                            .vocab_begin = vocab_begin_,
                            .valid = vocab_valid_,
                            .all_gather = tp_.all_gather,
                            .all_reduce = tp_.all_reduce,
                            .maxes = ce_maxes_,
                            .sums = ce_sums_},
                           logits, targets.Slice(r0, r1), losses_.Slice(r0, r1), options);
}

absl::Status Transformer::SplitCrossEntropy(const DeviceContext& ctx, const VocabColumns& columns,
                                            const Tensor& logits, const Tensor& targets,
                                            const Tensor& losses, const LossOptions& options) {
  // Three passes around two collectives, so that no rank ever holds another's logits: the row
  // maxima are gathered, the sums of exp(logit − max) and the target's logit (from the rank
  // that owns it) are summed, then each rank finishes the loss and its columns' gradient.
  const int64_t rows = logits.dim(0), P = columns.size;
  const Tensor& all_maxes = columns.maxes;
  const Tensor maxes = all_maxes.Reshape({all_maxes.numel()}).Slice(0, P * rows).Reshape({P, rows});
  const Tensor mine =
      maxes.Reshape({P * rows}).Slice(columns.rank * rows, (columns.rank + 1) * rows);
  const Tensor sums =
      columns.sums.Reshape({columns.sums.numel()}).Slice(0, 2 * rows).Reshape({rows, 2});
  ZT_RETURN_IF_ERROR(
      VocabShardRowMax(ctx, {.logits = logits, .valid = columns.valid, .max = mine}));
  ZT_RETURN_IF_ERROR(columns.all_gather(mine, maxes.Reshape({P * rows}), "head logit maxima"));
  ZT_RETURN_IF_ERROR(VocabShardExpSum(ctx, {.logits = logits,
                                            .valid = columns.valid,
                                            .maxes = maxes,
                                            .targets = targets,
                                            .vocab_begin = columns.vocab_begin,
                                            .sums = sums}));
  ZT_RETURN_IF_ERROR(columns.all_reduce(sums, "head softmax sums"));
  return VocabShardCrossEntropy(ctx, {.logits = logits,
                                      .valid = columns.valid,
                                      .maxes = maxes,
                                      .sums = sums,
                                      .targets = targets,
                                      .vocab_begin = columns.vocab_begin,
                                      .losses = losses,
                                      .grad_scale = options.grad_scale,
                                      .write_grad = options.write_grad});
}

absl::Status Transformer::ForwardToHead(const DeviceContext& ctx) {
  ZT_RETURN_IF_ERROR(EmbeddingForward(ctx, params_.front()));
  for (int i = 0; i < layout_.n_blocks(); ++i) {
    ZT_RETURN_IF_ERROR(BlockForward(ctx, i, params_[1 + i]));
  }
  return HeadForward(ctx, params_.back());
}

absl::Status Transformer::ForwardLogits(const DeviceContext& ctx) {
  if (pipelined_) {
    return absl::FailedPreconditionError(
        "forward to logits (sampling) on a pipeline stage: sample from a one-rank model");
  }
  if (tp_.size > 1) {
    return absl::UnimplementedError(
        "forward to logits (sampling) on a tensor-parallel model: each rank holds a vocabulary "
        "shard of the logits; sample from a one-rank model");
  }
  if (logits_.dim(0) != B_ * T_) {
    return absl::FailedPreconditionError(
        "forward to logits needs a plan with a logit for every position (PlanInference); a "
        "training plan holds one loss chunk");
  }
  ZT_RETURN_IF_ERROR(ForwardToHead(ctx));
  return LinearForward(
      ctx, {.inp = lnf_, .weight = HeadWeight(params_.back(), params_.front()), .out = logits_});
}

absl::StatusOr<double> Transformer::ForwardLoss(const DeviceContext& ctx,
                                                const LossOptions& options) {
  if (pipelined_) {
    return absl::FailedPreconditionError(
        "ForwardLoss on a pipeline stage: the schedule runs StageForward / StageBackward");
  }
  if (options.write_grad && grads_.empty()) {
    return absl::FailedPreconditionError("forward with gradients on a model bound without them");
  }
  ZT_RETURN_IF_ERROR(ForwardToHead(ctx));
  // The loss accumulates into a host double: an f64 seen as 2 f32 slots (a CPU tensor, so a
  // context on another device is refused by the op, naming both devices).
  double loss = 0;
  LossOptions with_sum = options;
  with_sum.loss_sum = Tensor(&loss, DType::kF32, {2});
  with_sum.loss_divisor = 1.0;
  ZT_RETURN_IF_ERROR(HeadLoss(ctx, params_.back(), options.write_grad ? grads_.back() : Tensor(),
                              params_.front(), options.write_grad ? grads_.front() : Tensor(),
                              with_sum));
  return loss;
}

absl::Status Transformer::HeadBackward(const DeviceContext& ctx, const Tensor& params,
                                       const Tensor& grads) {
  // HeadLoss already ran the projection's backward: grad_.ln holds dL/d(final norm output).
  const UnitLayout& u = layout_.head();
  const Tensor& x = residual_.back();
  // The frozen norms' unused weight gradients add into the sink: emptied at the start of each
  // backward, so it holds one backward's sums and never grows into inf or NaN.
  if (!lora_.norm_sink.empty()) ZT_RETURN_IF_ERROR(Zero(ctx, lora_.norm_sink));
  // With sequence parallelism the rank's token rows of it, summed over the group.
  Tensor dout = grad_.ln;
  if (sequence_parallel()) {
    dout = SequenceShardScratch();
    ZT_RETURN_IF_ERROR(ScatterSequence(grad_.ln, dout, "head backward reduce-scatter"));
  }
  if (gpt2_) {
    return LayerNormBackward(ctx, {.dout = dout,
                                   .inp = x,
                                   .weight = View(u, params, "ln_f.weight"),
                                   .mean = lnf_mean_,
                                   .rstd = lnf_rstd_,
                                   .dinp = grad_.residual,
                                   .dweight = NormGrad(u, grads, "ln_f.weight"),
                                   .dbias = NormGrad(u, grads, "ln_f.bias")});
  }
  return RmsNormBackward(ctx, {.dout = dout,
                               .inp = x,
                               .weight = View(u, params, "ln_f.weight"),
                               .rstd = lnf_rstd_,
                               .dinp = grad_.residual,
                               .dweight = NormGrad(u, grads, "ln_f.weight")});
}

absl::Status Transformer::BlockBackward(const DeviceContext& ctx, int i, const Tensor& params,
                                        const Tensor& grads) {
  const UnitLayout& u = layout_.block(i);
  const BlockActs& a = blocks_[i];
  const Tensor& x = residual_[i];
  switch (a.recompute) {
    case Recompute::kFull:
      ZT_RETURN_IF_ERROR(BlockForwardImpl(ctx, i, params, /*write_output=*/false));
      break;
    case Recompute::kSelective:
      ZT_RETURN_IF_ERROR(AttentionCore(ctx, a));
      ZT_RETURN_IF_ERROR(MlpActivation(ctx, a));
      break;
    case Recompute::kNone:
      break;
  }
  // grad_.residual holds dL/d(block output) on entry and dL/d(block input) on exit: both
  // branches add their input gradient to it in place.

  // With sequence parallelism grad_.residual and the norms' tensors are the rank's token rows:
  // a row-parallel backward reads the group's rows of its output gradient gathered, a
  // column-parallel one its input (ln1, ln2) gathered again, and its input gradient is
  // reduce-scattered onto the rows (the conjugates of the forward's collectives).

  // MLP branch, reversed.
  ZT_ASSIGN_OR_RETURN(const Tensor mlp_dout,
                      RowParallelOutputGrad(absl::StrCat(u.name, " mlp backward gather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "mlp.proj.weight", "mlp.proj.bias",
                                         mlp_dout, a.fch_act, grad_.fch_act));
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(GeluBackward(ctx, a.fch, grad_.fch_act, grad_.fch));
  } else {
    ZT_RETURN_IF_ERROR(SwigluBackward(ctx, a.fch, grad_.fch_act, grad_.fch));
  }
  ZT_ASSIGN_OR_RETURN(const Tensor ln2_in,
                      ColumnParallelInput(a.ln2, absl::StrCat(u.name, " mlp input regather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "mlp.fc.weight", "mlp.fc.bias",
                                         grad_.fch, ln2_in, grad_.ln));
  // Column-parallel input: the ranks' shares of dL/d(ln2 output) sum (Megatron's f backward).
  ZT_ASSIGN_OR_RETURN(const Tensor dln2,
                      ColumnParallelInputGrad(absl::StrCat(u.name, " mlp backward all-reduce")));
  if (gpt2_) {
    ZT_RETURN_IF_ERROR(LayerNormBackward(ctx, {.dout = dln2,
                                               .inp = a.res2,
                                               .weight = View(u, params, "ln2.weight"),
                                               .mean = a.ln2_mean,
                                               .rstd = a.ln2_rstd,
                                               .dinp = grad_.residual,
                                               .dweight = NormGrad(u, grads, "ln2.weight"),
                                               .dbias = NormGrad(u, grads, "ln2.bias"),
                                               .dinp_mode = Accumulate::kAdd}));
  } else {
    ZT_RETURN_IF_ERROR(RmsNormBackward(ctx, {.dout = dln2,
                                             .inp = a.res2,
                                             .weight = View(u, params, "ln2.weight"),
                                             .rstd = a.ln2_rstd,
                                             .dinp = grad_.residual,
                                             .dweight = NormGrad(u, grads, "ln2.weight"),
                                             .dinp_mode = Accumulate::kAdd}));
  }

  // Attention branch, reversed.
  ZT_ASSIGN_OR_RETURN(const Tensor attn_dout,
                      RowParallelOutputGrad(absl::StrCat(u.name, " attention backward gather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "attn.proj.weight",
                                         "attn.proj.bias", attn_dout, a.atty, grad_.atty));
  const int64_t Q = a.qkv.dim(1);
  ZT_RETURN_IF_ERROR(AttentionBackward(ctx, {.qkv = a.qkv.Reshape({B_, T_, Q}),
                                             .out = a.atty.Reshape({B_, T_, H_ * D_}),
                                             .lse = a.att_lse,
                                             .dout = grad_.atty.Reshape({B_, T_, H_ * D_}),
                                             .dqkv = grad_.qkv.Reshape({B_, T_, Q}),
                                             .n_head = static_cast<int>(H_),
                                             .n_kv_head = static_cast<int>(Hkv_),
                                             .doc_starts = doc_starts_}));
  if (!gpt2_) {
    // RoPE is a rotation: its backward rotates dq, dk back by −θ.
    ZT_RETURN_IF_ERROR(RopeApply(ctx, {.qkv = grad_.qkv.Reshape({B_, T_, Q}),
                                       .n_head = static_cast<int>(H_),
                                       .n_kv_head = static_cast<int>(Hkv_),
                                       .theta = config_.rope_theta(),
                                       .positions = positions_,
                                       .direction = RopeDirection::kInverse}));
  }
  ZT_ASSIGN_OR_RETURN(const Tensor ln1_in,
                      ColumnParallelInput(a.ln1, absl::StrCat(u.name, " attention regather")));
  ZT_RETURN_IF_ERROR(BlockLinearBackward(ctx, i, params, grads, "attn.qkv.weight", "attn.qkv.bias",
                                         grad_.qkv, ln1_in, grad_.ln));
  ZT_ASSIGN_OR_RETURN(const Tensor dln1, ColumnParallelInputGrad(absl::StrCat(
                                             u.name, " attention backward all-reduce")));
  if (gpt2_) {
    return LayerNormBackward(ctx, {.dout = dln1,
                                   .inp = x,
                                   .weight = View(u, params, "ln1.weight"),
                                   .mean = a.ln1_mean,
                                   .rstd = a.ln1_rstd,
                                   .dinp = grad_.residual,
                                   .dweight = NormGrad(u, grads, "ln1.weight"),
                                   .dbias = NormGrad(u, grads, "ln1.bias"),
                                   .dinp_mode = Accumulate::kAdd});
  }
  return RmsNormBackward(ctx, {.dout = dln1,
                               .inp = x,
                               .weight = View(u, params, "ln1.weight"),
                               .rstd = a.ln1_rstd,
                               .dinp = grad_.residual,
                               .dweight = NormGrad(u, grads, "ln1.weight"),
                               .dinp_mode = Accumulate::kAdd});
}

absl::Status Transformer::EmbeddingBackward(const DeviceContext& ctx, const Tensor& grads) {
  if (vocab_sharded()) return VocabShardedEmbeddingBackward(ctx, grads);
  const UnitLayout& u = layout_.embedding();
  if (!u.trainable()) return absl::OkStatus();  // a frozen embedding has no gradient to take
  if (tp_.size > 1) {
    // dL/d(embedding output) is whole on every rank (gathered from the token rows' shards with
    // sequence parallelism): each takes its vocabulary rows, and every rank the positions'
    // (replicated) gradient, at the forward's (packed) positions.
    ZT_ASSIGN_OR_RETURN(const Tensor dout, RowParallelOutputGrad("embedding backward gather"));
    const Tensor dwpe = View(u, grads, "wpe");
    return VocabShardEmbeddingBackward(ctx, {.tokens = tokens_,
                                             .dout = dout.Reshape({B_, T_, C_}),
                                             .dwte = View(u, grads, "wte"),
                                             .dwpe = dwpe,
                                             .vocab_begin = vocab_begin_,
                                             .positions = dwpe.empty() ? Tensor() : positions_});
  }
  const Tensor dwpe = View(u, grads, "wpe");
  return zt::EmbeddingBackward(ctx, {.tokens = tokens_,
                                     .dout = grad_.residual.Reshape({B_, T_, C_}),
                                     .dwte = View(u, grads, "wte"),
                                     .dwpe = dwpe,
                                     .positions = dwpe.empty() ? Tensor() : positions_});
}

absl::Status Transformer::Backward(const DeviceContext& ctx) {
  if (pipelined_) {
    return absl::FailedPreconditionError(
        "Backward on a pipeline stage: the schedule runs StageForward / StageBackward");
  }
  if (grads_.empty()) {
    return absl::FailedPreconditionError("backward on a model bound without gradients");
  }
  ZT_RETURN_IF_ERROR(HeadBackward(ctx, params_.back(), grads_.back()));
  for (int i = layout_.n_blocks() - 1; i >= 0; --i) {
    // The gradient of the block's trainable buffer: its adapters' in a LoRA model.
    const Tensor& grads = layout_.lora ? lora_grads_[1 + i] : grads_[1 + i];
    ZT_RETURN_IF_ERROR(BlockBackward(ctx, i, params_[1 + i], grads));
  }
  return EmbeddingBackward(ctx, grads_.front());
}

}  // namespace zt
