// CUDA token and position embedding.
// Legend: B batch, T sequence, C channels, V vocabulary, N = B·T positions.
// Accumulation rule: dwte and dwpe are added to (+=).
//
// Forward: one thread per output element, out[bt, c] = wte[token, c] (+ wpe[pos, c]), pos
// the token's packed position when given, else t.
//
// Backward is a scatter-add where positions with the same token meet on one dwte row. It is
// deterministic, with no float atomics (kernels/cuda/row_scatter.h): a counting sort groups the
// positions by token keeping their order, then each dwte element is summed by one thread from
// its current value in position order, the CPU's f32 order exactly, so the GPU's dwte is
// bitwise the CPU's (a 16-bit table too: both sum in f32 and round once). With packed
// positions dwpe is the same scatter-add keyed by each token's position; without them dwpe row
// t sums dout[b, t] over b = 0, 1, ... in order: one thread per element, no sort.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/cuda/row_scatter.h"
#include "kernels/status_macros.h"

namespace zt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ bool ValidToken(int32_t token, int64_t v) { return token >= 0 && token < v; }

// A packed position outside [0, T) (device data, unchecked) poisons its row as a bad token
// does.
__global__ void ForwardKernel(const int32_t* tokens, const int32_t* positions, FloatPtr wte,
                              FloatPtr wpe, FloatPtr out, int64_t n, int64_t t, int64_t c,
                              int64_t v) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * c;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = e / c, ch = e % c;
    const int32_t token = tokens[bt];
    float x = NAN;
    if (ValidToken(token, v)) {
      x = wte.Load(token * c + ch);
      if (wpe.data != nullptr) {
        const int64_t pos = positions != nullptr ? int64_t{positions[bt]} : bt % t;
        x = pos >= 0 && pos < t ? x + wpe.Load(pos * c + ch) : NAN;
      }
    }
    out.Store(e, x);
  }
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
  const int32_t* positions = args.positions.empty() ? nullptr : args.positions.data<int32_t>();
  ForwardKernel<<<GridFor(n * c, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      args.tokens.data<int32_t>(), positions, AsFloatPtr(args.wte), wpe, AsFloatPtr(args.out), n, t,
      c, v);
  return LaunchStatus("EmbeddingForward");
}

absl::Status EmbeddingBackward(const DeviceContext& ctx, const EmbeddingBackwardArgs& args) {
  constexpr const char* kOp = "EmbeddingBackward";
  const int64_t b = args.tokens.dim(0), t = args.tokens.dim(1), n = b * t;
  const int64_t v = args.dwte.dim(0), c = args.dwte.dim(1);
  if (n == 0 || c == 0) return absl::OkStatus();
  const cudaStream_t stream = StreamOf(ctx);
  const FloatPtr dout = AsFloatPtr(args.dout);
  // Both sorts use the workspace from its start, one after the other on the stream.
  ZT_RETURN_IF_ERROR(ScatterAddRows(kOp, stream, RowIds{.ids = args.tokens.data<int32_t>()}, 0, n,
                                    dout, AsFloatPtr(args.dwte), v, c, ctx.workspace.data));
  if (args.dwpe.empty()) return absl::OkStatus();
  if (!args.positions.empty()) {
    // Positions lie in [0, T) (the CPU op checks it; on the device they are not read back):
    // the sort covers dwpe's first min(P, T) rows, and a position outside them adds nothing.
    return ScatterAddRows(kOp, stream, RowIds{.ids = args.positions.data<int32_t>()}, 0, n, dout,
                          AsFloatPtr(args.dwpe), std::min(args.dwpe.dim(0), t), c,
                          ctx.workspace.data);
  }
  WpeGradKernel<<<GridFor(t * c, kThreads), kThreads, 0, stream>>>(dout, AsFloatPtr(args.dwpe), b,
                                                                   t, c);
  return LaunchStatus(kOp);
}

}  // namespace zt::cuda
