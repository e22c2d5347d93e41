#include "worker/plan/parallel_plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/model/activation_table.h"
#include "worker/model/lora_tensor_parallel.h"
#include "worker/plan/pipeline_schedule.h"

namespace zt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows of attn.qkv one tensor-parallel rank holds: its query heads and the KV heads they read.
int64_t LocalQkvRows(const zerotrain::ModelConfig& m, int tp) {
  const int64_t D = m.d_model() / m.n_head();
  const int64_t kv = m.n_kv_head() >= tp ? m.n_kv_head() / tp : 1;
  return (m.n_head() / tp + 2 * kv) * D;
}

// The tensor-parallel share of `p` (see the header).
std::vector<int64_t> LocalShape(const ParamSpec& p, const zerotrain::ModelConfig& m, int tp) {
  std::vector<int64_t> s = p.shape;
  if (p.name == "wte" || p.name == "lm_head.weight") {
    s[0] = CeilDiv(s[0], tp);
  } else if (p.name == "attn.qkv.weight" || p.name == "attn.qkv.bias") {
    s[0] = LocalQkvRows(m, tp);
  } else if (p.name == "mlp.fc.weight" || p.name == "mlp.fc.bias") {
    s[0] /= tp;
  } else if (p.name == "attn.proj.weight" || p.name == "mlp.proj.weight") {
    s[1] /= tp;
  }
  return s;
}

// Units of the whole model: embedding 0, block i at 1 + i, head n_layer + 1.
int UnitOfBlock(int block) { return 1 + block; }

// In-flight micro-batches of each of pipeline rank p's v chunks (the header's rules).
std::vector<int> InFlight(const zerotrain::ParallelConfig& parallel, int pp, int p) {
  const int v = parallel.virtual_stages() >= 1 ? parallel.virtual_stages() : 1;
  const int m = std::max(1, parallel.micro_batches());
  std::vector<int> counts(v, 0);
  switch (parallel.pipeline_schedule()) {
    case zerotrain::ParallelConfig::GPIPE:
      std::fill(counts.begin(), counts.end(), m);
      break;
    case zerotrain::ParallelConfig::INTERLEAVED: {
      // Megatron's interleaved 1F1B: what its order (PipelineStageOps) holds per chunk. Not
      // the warmup window alone: in the steady state the backwards go through the chunks in
      // reverse, so chunk 0's forwards keep arriving while its backwards wait behind the
      // later chunks' (p 2, v 2, m 4: rank 0's chunk 0 holds all 4).
      const std::vector<PipelineOp> ops =
          PipelineStageOps(zerotrain::ParallelConfig::INTERLEAVED, pp, p, m, v);
      for (int c = 0; c < v; ++c) counts[c] = MaxInFlight(ops, c);
      break;
    }
    default:  // ONE_F_ONE_B
      std::fill(counts.begin(), counts.end(), std::min(pp - p, m));
      break;
  }
  for (int& c : counts) c = std::max(c, 1);
  return counts;
}

// "block.<i>.<rest>" → i, or -1.
int BlockIndexOf(const std::string& name) {
  if (!absl::StartsWith(name, "block.")) return -1;
  const size_t dot = name.find('.', 6);
  int i = -1;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(6, dot - 6), &i)) return -1;
  return i;
}

// What the activation or workspace buffer `name` holds per token, for the dividing rules: the
// part after "block.<i>.", "recompute.", "head." or "grad.".
std::string Role(const std::string& name) {
  for (const char* prefix : {"recompute.", "head.", "grad."}) {
    if (absl::StartsWith(name, prefix)) return name.substr(std::string(prefix).size());
  }
  if (BlockIndexOf(name) >= 0) return name.substr(name.find('.', 6) + 1);
  return name;
}

// Divides `b` by tensor parallelism (and sequence parallelism) as the header says.
void DivideActivation(BufferSpec& b, const zerotrain::ModelConfig& m, int tp, bool sequence) {
  const std::string role = Role(b.name);
  if (role == "qkv") {
    b.shape[1] = LocalQkvRows(m, tp);
  } else if (role == "atty" || role == "fch" || role == "fch_act") {
    b.shape[1] /= tp;
  } else if (role == "att_lse") {
    b.shape[1] /= tp;  // (B, H, T): heads
  } else if (sequence && role != "losses") {
    // ln*, res2, residual.*, lnf and the norm statistics: the sequence's 1/tp slice. The
    // losses stay per token: the vocabulary-parallel cross-entropy reduces over the TP group.
    b.shape[0] = CeilDiv(b.shape[0], tp);
  }
}

}  // namespace

std::vector<int> BalancedPartition(const std::vector<int64_t>& costs, int chunks) {
  const int n = static_cast<int>(costs.size());
  // The smallest bound B for which greedy packing needs at most `chunks` runs, by bisection.
  int64_t lo = *std::max_element(costs.begin(), costs.end());
  int64_t hi = std::accumulate(costs.begin(), costs.end(), int64_t{0});
  auto runs_needed = [&](int64_t bound) {
    int runs = 1;
    int64_t sum = 0;
    for (int64_t c : costs) {
      if (sum + c > bound) {
        ++runs;
        sum = 0;
      }
      sum += c;
    }
    return runs;
  };
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (runs_needed(mid) <= chunks) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  // Pack under the bound, closing a run early when the units left are just enough for the
  // runs left, so that every run is non-empty (splitting a run never raises the largest sum).
  std::vector<int> starts = {0};
  int64_t sum = 0;
  for (int u = 0; u < n; ++u) {
    const int runs_left = chunks - static_cast<int>(starts.size());
    const bool full = sum > 0 && sum + costs[u] > lo;
    const bool must_split = sum > 0 && n - u == runs_left;
    if (runs_left > 0 && (full || must_split)) {
      starts.push_back(u);
      sum = 0;
    }
    sum += costs[u];
  }
  starts.push_back(n);
  return starts;
}

ModelLayout TensorParallelModelLayout(const zerotrain::ModelConfig& model, int tensor_parallel) {
  ModelLayout layout = BuildModelLayout(model);
  if (tensor_parallel <= 1) return layout;
  // An NF4 share holds the one-rank weight's blocks, their 8-bit absmax codes and the one-rank
  // group scales they index (ModelLayout::nf4_absmax; Transformer::QuantizeBaseWeight builds it).
  layout.nf4_absmax = Nf4Absmax::kGroupIndexed;
  layout.total_numel = 0;
  for (UnitLayout& u : layout.units) {
    u.numel = 0;
    for (ParamSpec& p : u.params) {
      p.whole_numel = p.numel;
      p.shape = LocalShape(p, model, tensor_parallel);
      p.numel = 1;
      for (int64_t s : p.shape) p.numel *= s;
      layout.total_numel += p.numel;
      // A quantized base weight stays out of the flat buffer, as in BuildModelLayout: its
      // share lives in its NF4 / INT8 buffers (QuantizedBytesOf).
      if (p.quantized) continue;
      p.offset = u.numel;
      u.numel += p.numel;
    }
  }
  if (layout.lora) {
    // The adapters' shares (worker/model/lora_tensor_parallel.h).
    layout.lora_numel = 0;
    for (UnitLayout& u : layout.units) {
      SplitLoraSites(model, tensor_parallel, u);
      layout.lora_numel += u.lora_numel;
    }
  }
  return layout;
}

std::vector<PipelineChunk> PipelineChunksOf(const zerotrain::JobSpec& job,
                                            const ParallelLayout& layout) {
  const int pp = layout.pipeline_size();
  const int n_units = job.model().n_layer() + 2;
  if (pp <= 1) return {{.first = 0, .last = n_units, .in_flight = 1}};
  const zerotrain::ParallelConfig& parallel = job.parallel();
  const int v = parallel.pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED
                    ? std::max(1, parallel.virtual_stages())
                    : 1;
  const ModelLayout tp_layout = TensorParallelModelLayout(job.model(), layout.tensor_size());
  std::vector<int64_t> costs;
  // A unit's cost is its parameters' count, quantized base weights included (they leave the
  // flat buffer but not the work: a QLoRA block costs what the unquantized block does).
  for (const UnitLayout& u : tp_layout.units) {
    int64_t cost = 0;
    for (const ParamSpec& p : u.params) cost += p.numel;
    costs.push_back(std::max<int64_t>(1, cost));
  }
  const int chunks = std::min(pp * v, n_units);
  const std::vector<int> starts = BalancedPartition(costs, chunks);
  const int p = layout.coordinates().pipeline;
  const std::vector<int> in_flight = InFlight(parallel, pp, p);
  std::vector<PipelineChunk> mine;
  for (int k = 0; p + k * pp < chunks; ++k) {
    const int c = p + k * pp;
    mine.push_back({.first = starts[c], .last = starts[c + 1], .in_flight = in_flight[k]});
  }
  return mine;
}

ModelLayout RankModelLayout(const zerotrain::JobSpec& job, const ParallelLayout& layout) {
  const int tp = layout.tensor_size();
  if (tp <= 1 && layout.pipeline_size() <= 1) return BuildModelLayout(job.model());
  ModelLayout whole = TensorParallelModelLayout(job.model(), tp);
  if (layout.pipeline_size() <= 1) return whole;
  const int head = static_cast<int>(whole.units.size()) - 1;
  // The stage keeps the model's settings (LoRA's rank, scale and dropout, the base's
  // quantization); its units and totals are its own.
  ModelLayout mine = whole;
  mine.units.clear();
  mine.total_numel = 0;
  mine.lora_numel = 0;
  bool has_embedding = false, has_head = false;
  for (const PipelineChunk& c : PipelineChunksOf(job, layout)) {
    for (int u = c.first; u < c.last; ++u) {
      has_embedding |= u == 0;
      has_head |= u == head;
      mine.units.push_back(whole.units[u]);
    }
  }
  mine.tied_embeddings = whole.tied_embeddings && has_embedding && has_head;
  if (whole.tied_embeddings && has_head && !has_embedding) {
    // The head's stage keeps its own copy of the tied embedding.
    UnitLayout& h = mine.units.back();
    ParamSpec copy = *whole.embedding().Find("wte");
    copy.name = "lm_head.weight";
    // The same parameter as wte: the optimizer treats it as wte (no weight decay unless
    // decay_all_parameters), so the two copies stay equal.
    copy.is_embedding = false;
    copy.offset = h.numel;
    h.numel += copy.numel;
    h.params.push_back(std::move(copy));
  }
  for (const UnitLayout& u : mine.units) {
    mine.total_numel += u.numel;
    mine.lora_numel += u.lora_numel;
  }
  return mine;
}

std::vector<BufferSpec> RankActivationTable(const zerotrain::JobSpec& job,
                                            const ParallelLayout& layout, int64_t batch,
                                            int64_t seq_len, DType compute) {
  std::vector<BufferSpec> all = ActivationTable(job.model(), job.memory(), batch, seq_len, compute);
  const int tp = layout.tensor_size();
  if (tp <= 1 && layout.pipeline_size() <= 1) return all;
  const bool sequence = job.parallel().sequence_parallel() && tp > 1;
  const int head = job.model().n_layer() + 1;
  // Which chunk keeps each residual index and each unit's buffers.
  const std::vector<PipelineChunk> chunks = PipelineChunksOf(job, layout);
  auto chunk_of_unit = [&](int unit) -> const PipelineChunk* {
    for (const PipelineChunk& c : chunks) {
      if (unit >= c.first && unit < c.last) return &c;
    }
    return nullptr;
  };
  // residual.i is the input of block i (unit 1 + i) and the output of unit i: kept by the
  // chunk of either.
  auto chunk_of_residual = [&](int i) -> const PipelineChunk* {
    const PipelineChunk* in = chunk_of_unit(UnitOfBlock(i));
    return in != nullptr ? in : chunk_of_unit(i);
  };
  bool holds_blocks = false;
  for (const PipelineChunk& c : chunks) {
    holds_blocks |= std::max(c.first, 1) < std::min(c.last, head);
  }
  std::vector<BufferSpec> mine;
  for (BufferSpec& b : all) {
    const PipelineChunk* owner = nullptr;
    int residual = -1;
    if (BlockIndexOf(b.name) >= 0) {
      owner = chunk_of_unit(UnitOfBlock(BlockIndexOf(b.name)));
    } else if (absl::StartsWith(b.name, "head.")) {
      owner = chunk_of_unit(head);
    } else if (absl::StartsWith(b.name, "residual.") &&
               absl::SimpleAtoi(b.name.substr(9), &residual)) {
      owner = chunk_of_residual(residual);
    } else if (absl::StartsWith(b.name, "recompute.")) {
      if (!holds_blocks) continue;
      DivideActivation(b, job.model(), tp, sequence);
      mine.push_back(std::move(b));
      continue;
    }
    if (owner == nullptr) continue;
    DivideActivation(b, job.model(), tp, sequence);
    if (owner->in_flight > 1) b.shape.insert(b.shape.begin(), owner->in_flight);
    mine.push_back(std::move(b));
  }
  return mine;
}

std::vector<BufferSpec> RankWorkspaceTable(const zerotrain::JobSpec& job,
                                           const ParallelLayout& layout, int64_t batch,
                                           int64_t seq_len, const DeviceContext& ctx, DType compute,
                                           DType param, DType grad) {
  std::vector<BufferSpec> all =
      WorkspaceTable(job.model(), batch, seq_len, /*backward=*/true, ctx, compute, param, grad);
  const int tp = layout.tensor_size();
  if (tp <= 1 && layout.pipeline_size() <= 1) return all;
  const bool sequence = job.parallel().sequence_parallel() && tp > 1;
  const int head = job.model().n_layer() + 1;
  bool has_head = false, holds_blocks = false;
  for (const PipelineChunk& c : PipelineChunksOf(job, layout)) {
    has_head |= head >= c.first && head < c.last;
    holds_blocks |= std::max(c.first, 1) < std::min(c.last, head);
  }
  std::vector<BufferSpec> mine;
  for (BufferSpec& b : all) {
    const std::string role = Role(b.name);
    if (b.name == "logits") {
      if (!has_head) continue;
      b.shape[1] = CeilDiv(b.shape[1], tp);
      if (tp > 1) {
        // The parallel cross-entropy's per-row statistics of one loss chunk: every rank's
        // row maxima (all-gathered) and the (Σexp, target logit) pairs (all-reduced).
        const int64_t rows = b.shape[0];
        mine.push_back({"tp.ce_maxes", MemoryCategory::kWorkspace, DType::kF32, {tp, rows}});
        mine.push_back({"tp.ce_sums", MemoryCategory::kWorkspace, DType::kF32, {rows, 2}});
      }
    } else if (absl::StartsWith(b.name, "grad.") && role != "residual" && role != "ln") {
      if (!holds_blocks) continue;
      DivideActivation(b, job.model(), tp, /*sequence=*/false);
    } else if (b.name == "grad.residual" && sequence) {
      b.shape[0] = CeilDiv(b.shape[0], tp);
    }
    if (b.name == "grad.ln" && sequence) {
      // The engine's one whole-sequence buffer (worker/model/transformer_sequence_parallel.cc):
      // a gathered norm output or residual gradient, a row-parallel product before its
      // reduce-scatter. The activations keep only the rank's rows; this holds the rest, one
      // use at a time (B·T·C, as grad.ln, which the backward needs beside it).
      mine.push_back({"tp.sequence_full", MemoryCategory::kWorkspace, b.dtype, b.shape});
    }
    mine.push_back(std::move(b));
  }
  return mine;
}

}  // namespace zt
