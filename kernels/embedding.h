// Token (and learned position) embedding.
// Legend: B batch, T sequence, C channels, V vocabulary, P max positions.
// Accumulation rule: dwte and dwpe are added to (+=).
// Storage: wte, wpe, out, dout, dwte and dwpe may each be f32, bf16 or f16 (computed in f32,
// rounded to nearest even once on store; a 16-bit dwte/dwpe gets the whole batch's sum added
// in f32 and is rounded once, not once per token).
#pragma once

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

struct EmbeddingForwardArgs {
  Tensor tokens;  // (B, T) i32, each in [0, V)
  Tensor wte;     // (V, C)
  Tensor wpe;     // (P, C) with P ≥ T, or empty (no learned positions)
  Tensor out;     // (B, T, C) = wte[tokens] (+ wpe[positions or t])
  // (B, T) i32 row of wpe for each token, each in [0, T), or empty for t: packed sequences
  // restart positions at each document (DocumentPositions, kernels/packing.h).
  Tensor positions;
};
// Returns InvalidArgument naming the first token id outside [0, V). On CUDA the tokens are on
// the device and are not read back (that would wait for the stream): such a position's output
// row is NaN instead, and the backward adds nothing for it (kernels/cuda/embedding.h); so for a
// position outside [0, T).
absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args);

struct EmbeddingBackwardArgs {
  Tensor tokens;  // (B, T) i32
  Tensor dout;    // (B, T, C)
  Tensor dwte;    // (V, C) +=
  Tensor dwpe;    // (P, C) += or empty
  Tensor positions;  // as the forward's
};
// Deterministic: the result does not depend on the thread count or schedule.
// Scratch comes from ctx.workspace: FailedPrecondition (naming both sizes) when it holds fewer
// bytes than EmbeddingWorkspaceBytes says.
absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args);

// Scratch bytes EmbeddingBackward needs in ctx.workspace on a device of this kind, for
// `positions` = B·T token positions and a vocabulary of `vocab` rows (EmbeddingForward needs
// none). The CUDA backward sorts the positions by token there (a counting sort: offsets and
// cursors per vocabulary row, the sorted positions); the CPU's needs none (its sort lives in
// per-thread heap buffers), so it is 0. With positions the CUDA backward sorts them too, by
// position, in the same bytes after the tokens' sort: the size covers max(V, B·T) rows.
int64_t EmbeddingWorkspaceBytes(DeviceKind kind, int64_t positions, int64_t vocab);

}  // namespace zt
