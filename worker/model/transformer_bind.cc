// Transformer's binding (worker/model/transformer.h): the layout of the model (or of a pipeline
// stage's units, or of a tensor-parallel share), its parameters, gradients and activations
// bound to the plan's arenas, and the micro-batch slots a pipeline stage selects among.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/model/tensor_parallel_slice.h"
#include "worker/model/transformer.h"
#include "worker/plan/lora_plan.h"
#include "worker/plan/parallel_plan.h"

namespace zt {

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

}  // namespace zt
