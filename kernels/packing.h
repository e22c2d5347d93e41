// Packed sequences: several whole documents laid end to end in one row of a batch, with no
// padding between them. Ops that must not mix documents (attention, RoPE positions) take the
// documents' start offsets, one row of them per batch row, in the cu_seqlens spirit:
//
//   doc_starts (B, S) i32: row b lists the start token of each of its documents, ascending,
//   doc_starts[b][0] = 0; a row with fewer than S documents repeats T after its last one
//   (empty documents at the end). Document d of row b is tokens [start_d, start_{d+1}), the
//   last one ending at T. An unpacked batch is S = 1, every row {0}.
//
// Example, T = 10, documents of 4, 5 and 1 tokens in row 0 and one of 10 in row 1, S = 3:
//   {{0, 4, 9}, {0, 10, 10}}.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt {

// doc_starts is (batch, S ≥ 1) i32 on the context's device; on the CPU also its values: each
// row starts at 0, never decreases and stays within [0, seq]. InvalidArgument names the op,
// the element and the rule. Values on a CUDA device are not read (that would synchronize):
// the caller (the data loader, on the host) checks them before copying them there.
absl::Status CheckDocStarts(const char* op, const Tensor& doc_starts, int64_t batch, int64_t seq,
                            const DeviceContext& ctx);

struct DocumentPositionsArgs {
  Tensor doc_starts;  // (B, S) i32, as above
  Tensor positions;   // (B, T) i32, written: t − (start of t's document)
};
// The positions RoPE (kernels/rope.h, RopeArgs::positions) and learned position embeddings
// take for a packed batch: they restart at 0 at each document. CPU only (positions are built
// on the host with the batch and copied with it): Unimplemented on a CUDA context.
absl::Status DocumentPositions(const DeviceContext& ctx, const DocumentPositionsArgs& args);

}  // namespace zt
