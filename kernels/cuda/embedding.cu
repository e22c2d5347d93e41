// CUDA token and position embedding.
// Legend: B batch, T sequence, C channels, V vocabulary, N = B·T positions.
// Accumulation rule: dwte and dwpe are added to (+=).
//
// Forward: one thread per output element, out[bt, c] = wte[token, c] (+ wpe[t, c]).
//
// Backward is a scatter-add where positions with the same token meet on one dwte row. It is
// deterministic, with no float atomics: a counting sort groups the positions by token, keeping
// each group in position order, and then each dwte element is summed by one thread, starting
// from its current value and adding the group's dout rows in position order — the CPU's f32
// order exactly, so the GPU's dwte is bitwise the CPU's (a 16-bit table too: both sum in f32
// and round once). The sort, in ctx.workspace (EmbeddingWorkspaceBytes):
//   1. counts[v] = positions with token v (integer atomics: the counts do not depend on order);
//   2. one block turns the counts into exclusive offsets (offsets[V] = N) and copies them to
//      the cursors;
//   3. one block walks the positions in chunks of 256 in order; inside a chunk a position's
//      rank among equal tokens is counted in shared memory, it lands at cursor[token] + rank,
//      and the chunk's last occurrence of a token moves the cursor on. Sequential over
//      N / 256 chunks: ~32 steps for 8 × 1024 tokens.
// dwpe row t sums dout[b, t] over b = 0, 1, ... in order: one thread per element, no sort.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/float_io.cuh"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kChunk = 256;  // positions the fill kernel ranks at once

__device__ bool ValidToken(int32_t token, int64_t v) { return token >= 0 && token < v; }

__global__ void ForwardKernel(const int32_t* tokens, FloatPtr wte, FloatPtr wpe, FloatPtr out,
                              int64_t n, int64_t t, int64_t c, int64_t v) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * c;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = e / c, ch = e % c;
    const int32_t token = tokens[bt];
    float x = NAN;
    if (ValidToken(token, v)) {
      x = wte.Load(token * c + ch);
      if (wpe.data != nullptr) x += wpe.Load((bt % t) * c + ch);
    }
    out.Store(e, x);
  }
}

__global__ void CountKernel(const int32_t* tokens, int64_t n, int64_t v, int32_t* counts) {
  for (int64_t bt = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; bt < n;
       bt += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (ValidToken(tokens[bt], v)) atomicAdd(&counts[tokens[bt]], 1);
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

// order[cursor[token] + rank] = position, positions visited in increasing order (see the top).
__global__ void __launch_bounds__(kChunk)
    FillKernel(const int32_t* tokens, int64_t n, int64_t v, int32_t* cursors, int32_t* order) {
  __shared__ int32_t chunk[kChunk];
  for (int64_t base = 0; base < n; base += kChunk) {
    const int64_t p = base + threadIdx.x;
    const int32_t token = p < n ? tokens[p] : -1;
    const bool valid = p < n && ValidToken(token, v);
    chunk[threadIdx.x] = valid ? token : -1;
    __syncthreads();
    int rank = 0;
    bool last = true;
    if (valid) {
      for (int i = 0; i < kChunk; ++i) {
        if (chunk[i] != token) continue;
        if (i < static_cast<int>(threadIdx.x)) ++rank;
        if (i > static_cast<int>(threadIdx.x)) last = false;
      }
      order[cursors[token] + rank] = static_cast<int32_t>(p);
    }
    __syncthreads();  // every thread has read its cursor before one moves
    if (valid && last) cursors[token] += rank + 1;
    __syncthreads();  // cursors moved and `chunk` free before the next chunk
  }
}

// dwte[v, c] += Σ dout[p, c] over the positions p of token v in increasing order. Grid
// (V, ⌈C / kThreads⌉); rows no position touches return at once.
__global__ void WteGradKernel(const int32_t* offsets, const int32_t* order, FloatPtr dout,
                              FloatPtr dwte, int64_t c) {
  const int64_t row = blockIdx.x;
  const int32_t begin = offsets[row], end = offsets[row + 1];
  if (begin == end) return;
  const int64_t ch = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (ch >= c) return;
  float acc = dwte.Load(row * c + ch);
  for (int32_t k = begin; k < end; ++k) acc += dout.Load(order[k] * c + ch);
  dwte.Store(row * c + ch, acc);
}

// dwpe[t, c] += Σ_b dout[b, t, c] in order of b.
__global__ void WpeGradKernel(FloatPtr dout, FloatPtr dwpe, int64_t b, int64_t t, int64_t c) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < t * c;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = dwpe.Load(e);
    for (int64_t i = 0; i < b; ++i) acc += dout.Load(i * t * c + e);
    dwpe.Store(e, acc);
  }
}

}  // namespace

absl::Status EmbeddingForward(const DeviceContext& ctx, const EmbeddingForwardArgs& args) {
  const int64_t t = args.tokens.dim(1), n = args.tokens.dim(0) * t;
  const int64_t v = args.wte.dim(0), c = args.wte.dim(1);
  if (n * c == 0) return absl::OkStatus();
  const FloatPtr wpe = args.wpe.empty() ? FloatPtr{nullptr, DType::kF32} : AsFloatPtr(args.wpe);
  ForwardKernel<<<GridFor(n * c, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      args.tokens.data<int32_t>(), AsFloatPtr(args.wte), wpe, AsFloatPtr(args.out), n, t, c, v);
  return LaunchStatus("EmbeddingForward");
}

absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args) {
  constexpr const char* kOp = "EmbeddingBackward";
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1), n = b * t;
  const int64_t v = args.dwte.dim(0), c = args.dwte.dim(1);
  if (n == 0 || c == 0) return absl::OkStatus();
  if (n > 0x7fffffff || v > 0x7fffffff || c > 65535LL * kThreads) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": B·T = ", n, " and V = ", v,
                                                   " must be below 2^31 and C = ", c, " at most ",
                                                   65535LL * kThreads, " on CUDA"));
  }
  const cudaStream_t stream = StreamOf(ctx);
  const FloatPtr dout = AsFloatPtr(args.dout);
  if (!args.dwpe.empty()) {
    WpeGradKernel<<<GridFor(t * c, kThreads), kThreads, 0, stream>>>(dout, AsFloatPtr(args.dwpe), b,
                                                                     t, c);
  }
  // The workspace, as EmbeddingWorkspaceBytes sizes it.
  int32_t* offsets = static_cast<int32_t*>(ctx.workspace.data);  // (V + 1)
  int32_t* cursors = offsets + v + 1;                            // (V)
  int32_t* order = cursors + v;                                  // (N)
  const int32_t* tokens = args.tokens.data<int32_t>();
  ZT_CUDA_RETURN_IF_ERROR(kOp, cudaMemsetAsync(offsets, 0, (v + 1) * sizeof(int32_t), stream));
  CountKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(tokens, n, v, offsets);
  ExclusiveScanKernel<<<1, kScanThreads, 0, stream>>>(offsets, v + 1, cursors);
  FillKernel<<<1, kChunk, 0, stream>>>(tokens, n, v, cursors, order);
  const dim3 grid(static_cast<unsigned>(v), static_cast<unsigned>((c + kThreads - 1) / kThreads));
  WteGradKernel<<<grid, kThreads, 0, stream>>>(offsets, order, dout, AsFloatPtr(args.dwte), c);
  return LaunchStatus(kOp);
}

}  // namespace zt::cuda
