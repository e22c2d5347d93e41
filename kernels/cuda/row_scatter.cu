// The sorted scatter-add of kernels/cuda/row_scatter.h.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/row_scatter.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kChunk = 256;  // rows the fill kernel ranks at once

// Row i's local id in [0, rows), or −1 when the table does not hold it.
__device__ int64_t LocalId(RowIds ids, int64_t i, int64_t begin, int64_t rows) {
  const int64_t id = ids.ids != nullptr ? int64_t{ids.ids[i]} : i % ids.period;
  const int64_t local = id - begin;
  return local >= 0 && local < rows ? local : -1;
}

__global__ void CountKernel(RowIds ids, int64_t begin, int64_t n, int64_t rows, int32_t* counts) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t local = LocalId(ids, i, begin, rows);
    if (local >= 0) atomicAdd(&counts[local], 1);
  }
}

// counts[0, n) → exclusive prefix sums in place; cursors[0, n − 1) get the same values.
// One block: each thread scans a contiguous stretch, the stretch totals are scanned in
// shared memory (Hillis–Steele), then each stretch is rewritten from its start.
__global__ void __launch_bounds__(kScanThreads)
    ExclusiveScanKernel(int32_t* counts, int64_t n, int32_t* cursors) {
  __shared__ int32_t totals[kScanThreads];
  const int64_t per = (n + kScanThreads - 1) / kScanThreads;
  const int64_t begin = min(n, threadIdx.x * per);
  const int64_t end = min(n, begin + per);
  int32_t sum = 0;
  for (int64_t i = begin; i < end; ++i) sum += counts[i];
  totals[threadIdx.x] = sum;
  __syncthreads();
  for (int off = 1; off < kScanThreads; off *= 2) {
    const int32_t add = threadIdx.x >= off ? totals[threadIdx.x - off] : 0;
    __syncthreads();
    totals[threadIdx.x] += add;
    __syncthreads();
  }
  int32_t run = threadIdx.x > 0 ? totals[threadIdx.x - 1] : 0;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t count = counts[i];
    counts[i] = run;
    if (i < n - 1) cursors[i] = run;
    run += count;
  }
}

// order[cursor[id] + rank] = i, rows visited in increasing order (row_scatter.h).
__global__ void __launch_bounds__(kChunk)
    FillKernel(RowIds ids, int64_t begin, int64_t n, int64_t rows, int32_t* cursors,
               int32_t* order) {
  __shared__ int32_t chunk[kChunk];
  for (int64_t base = 0; base < n; base += kChunk) {
    const int64_t p = base + threadIdx.x;
    const int32_t local = p < n ? static_cast<int32_t>(LocalId(ids, p, begin, rows)) : -1;
    const bool valid = local >= 0;
    chunk[threadIdx.x] = local;
    __syncthreads();
    int rank = 0;
    bool last = true;
    if (valid) {
      for (int i = 0; i < kChunk; ++i) {
        if (chunk[i] != local) continue;
        if (i < static_cast<int>(threadIdx.x)) ++rank;
        if (i > static_cast<int>(threadIdx.x)) last = false;
      }
      order[cursors[local] + rank] = static_cast<int32_t>(p);
    }
    __syncthreads();  // every thread has read its cursor before one moves
    if (valid && last) cursors[local] += rank + 1;
    __syncthreads();  // cursors moved and `chunk` free before the next chunk
  }
}

// table[k, c] += Σ src[i, c] over the rows i of local id k in increasing order. Grid
// (rows, ⌈C / kThreads⌉); rows no source row touches return at once.
__global__ void GatherSumKernel(const int32_t* offsets, const int32_t* order, FloatPtr src,
                                FloatPtr table, int64_t c) {
  const int64_t row = blockIdx.x;
  const int32_t begin = offsets[row], end = offsets[row + 1];
  if (begin == end) return;
  const int64_t ch = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  float acc = table.Load(row * c + ch);
  for (int32_t k = begin; k < end; ++k) acc += src.Load(order[k] * c + ch);
  table.Store(row * c + ch, acc);
}

}  // namespace

absl::Status ScatterAddRows(const char* op, cudaStream_t stream, RowIds ids, int64_t begin,
                            int64_t n, FloatPtr src, FloatPtr table, int64_t rows, int64_t c,
                            void* workspace) {
  if (n == 0 || rows <= 0 || c == 0) return absl::OkStatus();
  if (n > 0x7fffffff || rows > 0x7fffffff || c > 65535LL * kThreads) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", n, " rows into ", rows,
                                                   " must be below 2^31 and C = ", c, " at most ",
                                                   65535LL * kThreads, " on CUDA"));
  }
  int32_t* offsets = static_cast<int32_t*>(workspace);  // (rows + 1)
  int32_t* cursors = offsets + rows + 1;                // (rows)
  int32_t* order = cursors + rows;                      // (n)
  ZT_CUDA_RETURN_IF_ERROR(op, cudaMemsetAsync(offsets, 0, (rows + 1) * sizeof(int32_t), stream));
  CountKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(ids, begin, n, rows, offsets);
  ExclusiveScanKernel<<<1, kScanThreads, 0, stream>>>(offsets, rows + 1, cursors);
  FillKernel<<<1, kChunk, 0, stream>>>(ids, begin, n, rows, cursors, order);
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((c + kThreads - 1) / kThreads));
  GatherSumKernel<<<grid, kThreads, 0, stream>>>(offsets, order, src, table, c);
  return LaunchStatus(op);
}

}  // namespace zt::cuda
