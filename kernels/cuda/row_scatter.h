// The deterministic scatter-add of rows shared by the CUDA embeddings' backwards
// (kernels/cuda/embedding.cu, kernels/cuda/tensor_parallel.cu): table[id(i) − begin] += src[i]
// for every row i whose id falls in the table's rows, each table element summed in f32 from
// its current value in increasing i and rounded once, the order of the CPU ops' scatter-adds,
// so the GPU's sums are bitwise theirs. No float atomics: a counting sort groups the rows by
// id, keeping each group in row order, and each table element is then summed by one thread.
// The sort, in the caller's workspace (RowScatterWorkspaceBytes):
//   1. counts[k] = rows with local id k (integer atomics: the counts do not depend on order);
//   2. one block turns the counts into exclusive offsets (offsets[rows] = rows kept) and
//      copies them to the cursors;
//   3. one block walks the rows in chunks of 256 in order; inside a chunk a row's rank among
//      equal ids is counted in shared memory, it lands at cursor[id] + rank, and the chunk's
//      last occurrence of an id moves the cursor on. Sequential over n / 256 chunks: ~32 steps
//      for 8 × 1024 tokens.
// Device code only (included by .cu files): nothing here allocates or synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {

// The ids of the n source rows: ids[i] when given, else i % period (the position t of a
// (B, T) row-major row i, period T).
struct RowIds {
  const int32_t* ids = nullptr;
  int64_t period = 1;
};

// Workspace bytes of a scatter of n source rows into a table of `rows` rows: offsets
// (rows + 1), cursors (rows) and the sorted rows (n), all i32.
constexpr int64_t RowScatterWorkspaceBytes(int64_t n, int64_t rows) {
  return (2 * rows + 1 + n) * static_cast<int64_t>(sizeof(int32_t));
}

// table (rows, c)[id(i) − begin, :] += src (n, c)[i, :], rows whose id − begin is outside
// [0, rows) skipped. `workspace` holds RowScatterWorkspaceBytes(n, rows) bytes. `op` names
// the caller in a launch error. n and rows below 2^31, c at most 65535 · 256.
absl::Status ScatterAddRows(const char* op, cudaStream_t stream, RowIds ids, int64_t begin,
                            int64_t n, FloatPtr src, FloatPtr table, int64_t rows, int64_t c,
                            void* workspace);

}  // namespace zt::cuda
