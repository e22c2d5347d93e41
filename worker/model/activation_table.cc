#include "worker/model/activation_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/adafactor.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"

namespace zt {
namespace {

struct Dims {
  int64_t BT, B, T, C, Q, HD, H, F, V;
  bool gpt2;
};

Dims DimsOf(const zerotrain::ModelConfig& m, int64_t batch, int64_t seq_len) {
  const int64_t D = m.d_model() / m.n_head();
  return Dims{.BT = batch * seq_len,
              .B = batch,
              .T = seq_len,
              .C = m.d_model(),
              .Q = (m.n_head() + 2 * m.n_kv_head()) * D,
              .HD = m.n_head() * D,
              .H = m.n_head(),
              .F = m.d_ff(),
              .V = m.vocab_size(),
              .gpt2 = m.family() == zerotrain::ModelConfig::GPT2};
}

}  // namespace

std::vector<BufferSpec> ActivationTable(const zerotrain::ModelConfig& m,
                                        const zerotrain::MemoryConfig& memory, int64_t batch,
                                        int64_t seq_len, DType compute) {
  using Ckpt = zerotrain::MemoryConfig;
  const Dims d = DimsOf(m, batch, seq_len);
  std::vector<BufferSpec> t;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back({std::move(name), MemoryCategory::kActivations, compute, std::move(shape)});
  };
  auto add_stat = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back({std::move(name), MemoryCategory::kActivations, DType::kF32, std::move(shape)});
  };
  // What a block saves for its backward, in two groups: the inputs of the GEMMs and norms,
  // and the "core" — the attention output and the MLP activation — that SELECTIVE recomputes.
  auto add_inputs = [&](const std::string& p) {
    add(p + "ln1", {d.BT, d.C});
    if (d.gpt2) add_stat(p + "ln1_mean", {d.BT});
    add_stat(p + "ln1_rstd", {d.BT});
    add(p + "qkv", {d.BT, d.Q});   // after RoPE for LLAMA: the attention's actual input
    add(p + "res2", {d.BT, d.C});  // residual after attention, input of ln2
    add(p + "ln2", {d.BT, d.C});
    if (d.gpt2) add_stat(p + "ln2_mean", {d.BT});
    add_stat(p + "ln2_rstd", {d.BT});
    add(p + "fch", {d.BT, d.gpt2 ? d.F : 2 * d.F});  // MLP pre-activation ([gate|up] LLAMA)
  };
  auto add_core = [&](const std::string& p) {
    add(p + "atty", {d.BT, d.HD});
    add_stat(p + "att_lse", {d.B, d.H, d.T});
    add(p + "fch_act", {d.BT, d.F});
  };
  auto checkpointed = [&](int i) {
    switch (memory.activation_checkpointing()) {
      case Ckpt::FULL:
        return true;
      case Ckpt::EVERY_K:
        return i % memory.checkpoint_every_k() == 0;
      default:
        return false;
    }
  };

  // The residual stream between units is always kept: it is every checkpoint's input.
  for (int i = 0; i <= m.n_layer(); ++i) add(absl::StrCat("residual.", i), {d.BT, d.C});
  bool any_checkpointed = false;
  for (int i = 0; i < m.n_layer(); ++i) {
    const std::string p = absl::StrCat("block.", i, ".");
    if (checkpointed(i)) {
      any_checkpointed = true;
      continue;
    }
    add_inputs(p);
    if (memory.activation_checkpointing() != Ckpt::SELECTIVE) add_core(p);
  }
  // One shared set, reused by every block that recomputes: the backward visits one block at a
  // time, recomputes into the set, and consumes it before the next block.
  if (any_checkpointed) add_inputs("recompute.");
  if (any_checkpointed || memory.activation_checkpointing() == Ckpt::SELECTIVE) {
    add_core("recompute.");
  }
  add("head.lnf", {d.BT, d.C});
  if (d.gpt2) add_stat("head.lnf_mean", {d.BT});
  add_stat("head.lnf_rstd", {d.BT});
  add_stat("head.losses", {d.BT});
  return t;
}

int64_t GemmWorkspaceBytesFor(const zerotrain::ModelConfig& m, int64_t batch, int64_t seq_len,
                              const DeviceContext& ctx, const LinearDTypes& dtypes,
                              int64_t logits_rows) {
  const Dims d = DimsOf(m, batch, seq_len);
  if (logits_rows <= 0) logits_rows = d.BT;
  // (K inputs, N outputs) of each linear layer, as worker/model/transformer.cc calls them; every
  // one sees M = B·T rows. Tied or not, the head is (C → V).
  const std::pair<int64_t, int64_t> layers[] = {
      {d.C, d.Q},                     // attn.qkv
      {d.HD, d.C},                    // attn.proj
      {d.C, d.gpt2 ? d.F : 2 * d.F},  // mlp.fc ([gate|up] for LLAMA)
      {d.F, d.C},                     // mlp.proj
  };
  int64_t most = 0;
  for (const auto& [k, n] : layers) {
    const absl::StatusOr<int64_t> bytes = LinearWorkspaceBytes(ctx, d.BT, k, n, dtypes);
    if (bytes.ok()) most = std::max(most, *bytes);
  }
  // lm_head (C → V) runs on chunks of logits_rows rows and on the remainder.
  for (const int64_t rows : {logits_rows, d.BT % logits_rows}) {
    if (rows == 0) continue;
    const absl::StatusOr<int64_t> bytes = LinearWorkspaceBytes(ctx, rows, d.C, d.V, dtypes);
    if (bytes.ok()) most = std::max(most, *bytes);
  }
  // Every other op of a step takes its scratch from the same workspace (one op runs at a time
  // on a context): on the CPU they need none, on CUDA the attention backward's row sums, the
  // embedding backward's sort, the norms' and Adafactor's partial sums and the gradient norm's.
  // The largest parameter matrix has max(V, Q, 2F, C) rows; a shard of one is no larger.
  const DeviceKind kind = ctx.device.kind;
  const int64_t rows = std::max({d.V, d.Q, 2 * d.F, d.C});
  return std::max(
      {most, AttentionWorkspaceBytes(kind, d.B, d.T, static_cast<int>(d.H)),
       EmbeddingWorkspaceBytes(kind, d.BT, d.V), LayerNormBackwardWorkspaceBytes(kind, d.BT, d.C),
       RmsNormBackwardWorkspaceBytes(kind, d.BT, d.C), AdafactorWorkspaceBytes(kind, rows),
       // The gradient norm's partials are capped (~8 KiB) whatever the size.
       ReduceWorkspaceBytes(ctx, int64_t{1} << 40)});
}

std::vector<BufferSpec> WorkspaceTable(const zerotrain::ModelConfig& m, int64_t batch,
                                       int64_t seq_len, bool backward, const DeviceContext& ctx,
                                       DType compute, DType param, DType grad) {
  const Dims d = DimsOf(m, batch, seq_len);
  std::vector<BufferSpec> t;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape) {
    t.push_back({std::move(name), MemoryCategory::kWorkspace, dtype, std::move(shape)});
  };
  add("tokens", DType::kI32, {d.B, d.T});
  add("targets", DType::kI32, {d.B, d.T});
  // Training computes the loss one chunk of rows at a time (Transformer::HeadLoss): the
  // logits buffer holds one chunk. Inference keeps every position's logits.
  const int64_t logits_rows = backward ? LossChunkRows(d.BT) : d.BT;
  add("logits", compute, {logits_rows, d.V});
  // One for all GEMMs: the ops of a rank run one after another.
  add("gemm_workspace", DType::kU8,
      {GemmWorkspaceBytesFor(m, batch, seq_len, ctx,
                             LinearDTypes::ForPrecision(compute, param, grad), logits_rows)});
  if (backward) {
    // One set, reused by every unit in turn: the backward visits one unit at a time.
    add("grad.residual", compute, {d.BT, d.C});  // dL/d residual stream, carried down
    add("grad.ln", compute, {d.BT, d.C});
    add("grad.qkv", compute, {d.BT, d.Q});
    add("grad.atty", compute, {d.BT, d.HD});
    add("grad.fch", compute, {d.BT, d.gpt2 ? d.F : 2 * d.F});
    add("grad.fch_act", compute, {d.BT, d.F});
  }
  return t;
}

}  // namespace zt
