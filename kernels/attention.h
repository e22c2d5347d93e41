// Causal multi-head self-attention with grouped key/value heads (GQA; MQA when Hkv = 1),
// computed tile by tile with an online softmax (FlashAttention's algorithm): memory is linear
// in T — no T×T buffer is ever formed; the forward saves only the output and the per-row
// log-sum-exp, and the backward recomputes the probabilities tile by tile.
//
// Legend: B batch, T sequence, H query heads, Hkv key/value heads (H % Hkv == 0),
// D head size. Query head h attends with key/value head h / (H / Hkv).
// Scores are scaled by 1/sqrt(D).
// Storage: qkv, out, dout and dqkv may each be f32, bf16 or f16 (computed in f32, rounded to
// nearest even once on store); lse is always f32.
//
// Packed sequences (kernels/packing.h): with doc_starts, query t attends to the keys of its
// own document only, [start of t's document, t] — block-diagonal causal — so each document's
// output and gradients are those of running it alone, and nothing is read across a boundary
// (a NaN in another document's q, k or v stays there). Key tiles that no query of a query
// tile may see are skipped, so a packed row costs about Σ (document length)² rather than T².
// Give RoPE positions that restart at each document (DocumentPositions) to match too.
// On CUDA the values of doc_starts are not checked (kernels/packing.h): the caller checks them
// on the host.
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct AttentionForwardArgs {
  Tensor qkv;  // (B, T, (H + 2·Hkv)·D) packed [q heads | k heads | v heads]
  Tensor out;  // (B, T, H·D), written
  Tensor lse;  // (B, H, T) f32, written: log Σ_j exp(score_ij), saved for backward
  int n_head = 0;
  int n_kv_head = 0;
  Tensor doc_starts;  // (B, S) i32 document starts (kernels/packing.h), or empty: one per row
};
absl::Status AttentionForward(const DeviceContext& ctx, const AttentionForwardArgs& args);

struct AttentionBackwardArgs {
  Tensor qkv;   // (B, T, (H + 2·Hkv)·D), the forward input
  Tensor out;   // (B, T, H·D), the forward output
  Tensor lse;   // (B, H, T), from the forward
  Tensor dout;  // (B, T, H·D)
  Tensor dqkv;  // (B, T, (H + 2·Hkv)·D), written (=)
  int n_head = 0;
  int n_kv_head = 0;
  Tensor doc_starts;  // as the forward's
};
// Deterministic: every dk/dv row is reduced by one thread in a fixed order.
// Scratch comes from ctx.workspace: FailedPrecondition (naming both sizes) when it holds fewer
// bytes than AttentionWorkspaceBytes says.
absl::Status AttentionBackward(const DeviceContext& ctx, const AttentionBackwardArgs& args);

// Scratch bytes AttentionForward and AttentionBackward need in ctx.workspace on a device of
// this kind, for B = batch, T = seq, H = n_head. The forward needs none. The CUDA backward
// keeps Di = rowsum(dO ∘ O) of every query row there, (B, H, T) f32; the CPU's needs none
// (its tiles live on each thread's stack and a 16-bit dQ sum in per-thread heap scratch, see
// kernels/cpu/attention.h), so it is 0.
int64_t AttentionWorkspaceBytes(DeviceKind kind, int64_t batch, int64_t seq, int n_head);

}  // namespace zt
