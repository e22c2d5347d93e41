// CUDA GEMM and linear layer through cuBLASLt (cublasLtMatmul).
//
// Legend: M rows (B·T tokens), K input channels, N output channels.
// Accumulation rule, as on the CPU: dweight and dbias +=, dinp = or += as the caller says.
//
// Layout. Our tensors are row-major; cuBLASLt's default order is column-major. A row-major
// (r, c) matrix is, byte for byte, the column-major (c, r) matrix — its transpose — so
// c(M, N) = op(a) · op(b) is computed as cᵀ (N, M) = op(b)ᵀ · op(a)ᵀ: cuBLASLt's A is our b, its
// B is our a, each with our transpose flag, and no data moves.
//
// Numerics, the CPU's rule: products accumulated in fp32 (CUBLAS_COMPUTE_32F; f32 inputs with
// full f32 products unless ctx.allow_tf32), alpha · Σ + beta · c rounded once to c's dtype.
// Split-K reductions that keep partial sums in the output dtype (INPLACE, OUTPUT_TYPE) would
// round a bf16 output more than once, so the heuristic may pick only NONE or COMPUTE_TYPE.
//
// Dtypes. cuBLASLt takes A and B of one dtype, and C/D in that dtype or (for 16-bit inputs)
// f32. Any other mix the CPU op accepts (bf16 · f32, f16 · bf16, f32 · f32 → bf16, ...) widens
// its odd operands to f32 copies in the workspace and, when c is the odd one, computes into an
// f32 copy of c that is then rounded into c: widening is exact, so the numerics are the
// same. The model's GEMMs (activations in the compute dtype, weights in the parameter dtype)
// hit the direct path whenever the two dtypes agree.
//
// Epilogues. LinearForward fuses its bias (CUBLASLT_EPILOGUE_BIAS: alpha · Σ + bias in f32,
// rounded once) when the bias has out's dtype, which is then exactly the CPU's "bias as its
// value in out's dtype"; otherwise out is seeded with the rounded bias and the GEMM adds to
// it (beta = 1), as the CPU does. The linear op has no activation, so no GELU epilogue.
// The bias gradient is not BGRADB: that epilogue overwrites (dbias is +=) and sums in f32
// (the CPU sums the B·T rows in f64); two small kernels do it instead, their f64 partials in
// the workspace (BiasGradWorkspaceBytes, inside the GEMMs' 32 MiB for any real layer).
//
// Scratch and state. The workspace is [f32 a | f32 b | f32 c | cuBLASLt's 32 MiB]: exactly
// GemmWorkspaceBytes. cuBLASLt always gets the same workspace size, so the algorithm (and
// the bits) do not depend on how big the caller's workspace happens to be. One cuBLASLt
// handle per device, created on first use (cublasLtCreate allocates no device memory) and
// kept for the process; algorithms are cached per (device, shape, dtypes, transposes,
// epilogue, alignments, compute type, workspace size). Both maps are mutex-guarded.
#include "kernels/cuda/linear.h"

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/float_io.cuh"
#include "kernels/status_macros.h"

namespace zt::cuda {
namespace {

// cuBLASLt's default minimum alignment of A, B, C, D (and of its workspace): each scratch
// region starts on it.
constexpr int64_t kScratchAlign = 256;

int64_t AlignUp(int64_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// What a GEMM of these dtypes runs as on cuBLASLt.
struct GemmPlan {
  DType in = DType::kF32;   // cuBLASLt's A and B dtype (a and b as stored, or f32 copies)
  DType out = DType::kF32;  // cuBLASLt's C and D dtype (c's own, or an f32 copy)
  int64_t a_bytes = 0;      // f32 copy of a in scratch, or 0
  int64_t b_bytes = 0;
  int64_t c_bytes = 0;

  int64_t total_bytes() const { return a_bytes + b_bytes + c_bytes + kCublasLtWorkspaceBytes; }
};

GemmPlan PlanFor(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c) {
  GemmPlan p;
  if (a == b) {
    p.in = a;
  } else {
    p.in = DType::kF32;
    if (a != DType::kF32) p.a_bytes = AlignUp(m * k * 4);
    if (b != DType::kF32) p.b_bytes = AlignUp(k * n * 4);
  }
  // With CUBLAS_COMPUTE_32F, 16-bit inputs give their own dtype or f32, f32 inputs give f32.
  const bool c_direct = c == p.in || c == DType::kF32;
  p.out = c_direct ? c : DType::kF32;
  if (!c_direct) p.c_bytes = AlignUp(m * n * 4);
  return p;
}

// One GEMM as cuBLASLt sees it: packed row-major operands, c(m, n) = alpha · op(a) · op(b) +
// beta · c [+ bias broadcast over rows].
struct LtCall {
  bool ta = false;
  bool tb = false;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  const void* a = nullptr;
  DType a_dtype = DType::kF32;
  const void* b = nullptr;
  DType b_dtype = DType::kF32;
  void* c = nullptr;
  DType c_dtype = DType::kF32;
  const void* bias = nullptr;  // CUBLASLT_EPILOGUE_BIAS, n elements of c's dtype, or null
};

std::string Label(const char* op, const LtCall& c) {
  return absl::StrCat(op, " (", c.m, " x ", c.n, " x ", c.k, ", a ", DTypeName(c.a_dtype),
                      c.ta ? " transposed" : "", ", b ", DTypeName(c.b_dtype),
                      c.tb ? " transposed" : "", ", c ", DTypeName(c.c_dtype),
                      c.bias != nullptr ? ", bias epilogue" : "", ")");
}

// The largest power of two (up to 256) the address is a multiple of.
uint32_t AlignmentOf(const void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  if (u == 0) return kScratchAlign;
  const uintptr_t low = u & (~u + 1);
  return static_cast<uint32_t>(low < static_cast<uintptr_t>(kScratchAlign) ? low : kScratchAlign);
}

// One handle per device, for the life of the process (destroying it at exit could race the
// driver's own teardown).
absl::StatusOr<cublasLtHandle_t> HandleFor(const char* op, int device) {
  static std::mutex mu;
  static auto* handles = new std::map<int, cublasLtHandle_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = handles->find(device); it != handles->end()) return it->second;
  // The handle belongs to the device current at its creation, as do ctx's stream and memory.
  int current = -1;
  ZT_CUDA_RETURN_IF_ERROR(op, cudaGetDevice(&current));
  if (current != device) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": the calling thread's current CUDA device is ", current,
                     ", the context runs on cuda:", device, " (cudaSetDevice first)"));
  }
  cublasLtHandle_t handle = nullptr;
  ZT_CUBLAS_RETURN_IF_ERROR(op, cublasLtCreate(&handle));
  handles->emplace(device, handle);
  return handle;
}

struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayoutOpaque_t* l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreferenceOpaque_t* p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDesc = std::unique_ptr<cublasLtMatmulDescOpaque_t, MatmulDescDeleter>;
using Layout = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, LayoutDeleter>;
using Preference = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, PreferenceDeleter>;

absl::StatusOr<Layout> MakeLayout(const char* op, DType dtype, int64_t rows, int64_t cols) {
  cublasLtMatrixLayout_t layout = nullptr;
  ZT_CUBLAS_RETURN_IF_ERROR(
      op, cublasLtMatrixLayoutCreate(&layout, CudaType(dtype), static_cast<uint64_t>(rows),
                                     static_cast<uint64_t>(cols), rows));
  return Layout(layout);
}

// Everything the heuristic's choice depends on.
struct AlgoQuery {
  cublasLtHandle_t handle;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  uint32_t align_a, align_b, align_c;
  std::string key;
};

absl::StatusOr<cublasLtMatmulAlgo_t> AlgoFor(const std::string& label, const AlgoQuery& q) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, cublasLtMatmulAlgo_t>();
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(q.key); it != cache->end()) return it->second;
  const char* op = label.c_str();
  cublasLtMatmulPreference_t raw = nullptr;
  ZT_CUBLAS_RETURN_IF_ERROR(op, cublasLtMatmulPreferenceCreate(&raw));
  const Preference pref(raw);
  const uint64_t workspace = kCublasLtWorkspaceBytes;
  const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, q.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, q.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, q.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, q.align_c}};
  ZT_CUBLAS_RETURN_IF_ERROR(
      op, cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace, sizeof(workspace)));
  ZT_CUBLAS_RETURN_IF_ERROR(
      op, cublasLtMatmulPreferenceSetAttribute(
              pref.get(), CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes)));
  for (const auto& [attr, value] : aligns) {
    ZT_CUBLAS_RETURN_IF_ERROR(
        op, cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &value, sizeof(value)));
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  ZT_CUBLAS_RETURN_IF_ERROR(
      op, cublasLtMatmulAlgoGetHeuristic(q.handle, q.desc, q.la, q.lb, q.lc, q.lc, pref.get(), 1,
                                         &result, &found));
  if (found == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": cuBLASLt has no algorithm for this combination (alignments a ",
                     q.align_a, ", b ", q.align_b, ", c ", q.align_c, " bytes)"));
  }
  cache->emplace(q.key, result.algo);
  return result.algo;
}

template <typename T>
absl::Status SetDesc(const char* op, cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                     const T& value) {
  ZT_CUBLAS_RETURN_IF_ERROR(op, cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
  return absl::OkStatus();
}

// The cuBLASLt call proper, on operands cuBLASLt takes as they are (a_dtype == b_dtype, c
// in that dtype or f32), `workspace` holding kCublasLtWorkspaceBytes.
absl::Status LtMatmul(const DeviceContext& ctx, const std::string& label, const LtCall& call,
                      void* workspace) {
  const char* op = label.c_str();
  ZT_ASSIGN_OR_RETURN(cublasLtHandle_t handle, HandleFor(op, ctx.device.index));
  const bool f32_inputs = call.a_dtype == DType::kF32;
  const cublasComputeType_t compute =
      f32_inputs && ctx.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDesc_t raw_desc = nullptr;
  ZT_CUBLAS_RETURN_IF_ERROR(op, cublasLtMatmulDescCreate(&raw_desc, compute, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  // cuBLASLt's A is our b, its B our a (see the top of the file).
  const cublasOperation_t trans_lt_a = call.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_lt_b = call.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  ZT_RETURN_IF_ERROR(SetDesc(op, desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, trans_lt_a));
  ZT_RETURN_IF_ERROR(SetDesc(op, desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, trans_lt_b));
  if (call.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    ZT_RETURN_IF_ERROR(SetDesc(op, desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
    ZT_RETURN_IF_ERROR(SetDesc(op, desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, call.bias));
  }
  // Stored shapes, column-major: b is (n, k) col-major when not transposed (row-major (k, n)).
  ZT_ASSIGN_OR_RETURN(Layout lt_a, MakeLayout(op, call.b_dtype, call.tb ? call.k : call.n,
                                              call.tb ? call.n : call.k));
  ZT_ASSIGN_OR_RETURN(Layout lt_b, MakeLayout(op, call.a_dtype, call.ta ? call.m : call.k,
                                              call.ta ? call.k : call.m));
  ZT_ASSIGN_OR_RETURN(Layout lt_c, MakeLayout(op, call.c_dtype, call.n, call.m));
  AlgoQuery q{.handle = handle,
              .desc = desc.get(),
              .la = lt_a.get(),
              .lb = lt_b.get(),
              .lc = lt_c.get(),
              .align_a = AlignmentOf(call.b),
              .align_b = AlignmentOf(call.a),
              .align_c = AlignmentOf(call.c)};
  q.key = absl::StrCat(
      ctx.device.index, "|", call.m, "x", call.n, "x", call.k, "|", static_cast<int>(call.a_dtype),
      static_cast<int>(call.c_dtype), "|", call.ta, call.tb, "|", call.bias != nullptr, ":",
      call.bias != nullptr ? AlignmentOf(call.bias) : 0, "|", q.align_a, ",", q.align_b, ",",
      q.align_c, "|", static_cast<int>(compute), "|", kCublasLtWorkspaceBytes);
  ZT_ASSIGN_OR_RETURN(const cublasLtMatmulAlgo_t algo, AlgoFor(label, q));
  ZT_CUBLAS_RETURN_IF_ERROR(
      op, cublasLtMatmul(handle, desc.get(), &call.alpha, call.b, lt_a.get(), call.a, lt_b.get(),
                         &call.beta, call.c, lt_c.get(), call.c, lt_c.get(), &algo, workspace,
                         kCublasLtWorkspaceBytes, StreamOf(ctx)));
  return absl::OkStatus();
}

// Any LtCall the CPU op accepts: empty and k = 0 shapes, odd dtypes widened through scratch.
absl::Status RunGemm(const DeviceContext& ctx, const char* op, const LtCall& call) {
  if (call.m == 0 || call.n == 0) return absl::OkStatus();
  if (call.k == 0) {
    // c = beta · c, and exactly 0 (not 0 · inf) when beta is 0, as the CPU's ScaleOnly.
    const int64_t count = call.m * call.n;
    if (call.beta == 0.0f) return ZeroBytes(ctx, call.c, count * DTypeSize(call.c_dtype));
    return Scale(ctx, call.c, call.c_dtype, call.beta, count);
  }
  const std::string label = Label(op, call);
  const GemmPlan plan = PlanFor(call.m, call.n, call.k, call.a_dtype, call.b_dtype, call.c_dtype);
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < plan.total_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        label, ": needs ", plan.total_bytes(), " workspace bytes, context has ", have,
        " (size ctx.workspace with GemmWorkspaceBytes / the memory plan's gemm_workspace)"));
  }
  if (AlignmentOf(ctx.workspace.data) < kScratchAlign) {
    return absl::FailedPreconditionError(absl::StrCat(label, ": ctx.workspace.data must be ",
                                                      kScratchAlign,
                                                      "-byte aligned (as cudaMalloc returns it)"));
  }
  auto* scratch = static_cast<uint8_t*>(ctx.workspace.data);
  void* const a32 = scratch;
  void* const b32 = scratch + plan.a_bytes;
  void* const c32 = scratch + plan.a_bytes + plan.b_bytes;
  void* const lt_workspace = scratch + plan.a_bytes + plan.b_bytes + plan.c_bytes;
  LtCall lt = call;
  if (plan.a_bytes > 0) {
    ZT_RETURN_IF_ERROR(Cast(ctx, call.a, call.a_dtype, a32, DType::kF32, call.m * call.k));
    lt.a = a32;
    lt.a_dtype = DType::kF32;
  }
  if (plan.b_bytes > 0) {
    ZT_RETURN_IF_ERROR(Cast(ctx, call.b, call.b_dtype, b32, DType::kF32, call.k * call.n));
    lt.b = b32;
    lt.b_dtype = DType::kF32;
  }
  if (plan.c_bytes > 0) {
    if (call.beta != 0.0f) {
      ZT_RETURN_IF_ERROR(Cast(ctx, call.c, call.c_dtype, c32, DType::kF32, call.m * call.n));
    }
    lt.c = c32;
    lt.c_dtype = DType::kF32;
  }
  ZT_RETURN_IF_ERROR(LtMatmul(ctx, label, lt, lt_workspace));
  if (plan.c_bytes > 0) {
    ZT_RETURN_IF_ERROR(Cast(ctx, c32, DType::kF32, call.c, call.c_dtype, call.m * call.n));
  }
  return absl::OkStatus();
}

// out (m, n) = every row the bias, rounded to out's dtype.
__global__ void BroadcastRowsKernel(FloatPtr bias, FloatPtr out, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out.Store(i, bias.Load(i % n));
  }
}

// dbias (n) += column sums of dout (m, n), summed in f64 in a fixed order, in two passes so
// that a GPT-2 layer's 16384 rows spread over many blocks: block (x, y) sums column strip x
// (kBiasCols columns) over row chunk y — its kBiasRowThreads rows of threads each a fixed
// stride of rows, added in row-thread order — into partials[y][j]; then one thread per column
// adds the chunks in chunk order and adds the total to dbias (in f32, rounded once, as the
// CPU does). The chunk count depends on m alone (BiasGradChunks), so the bits never change.
constexpr int kBiasCols = 32;
constexpr int kBiasRowThreads = 16;

__global__ void BiasGradPartials(FloatPtr dout, int64_t m, int64_t n, int64_t rows_per_chunk,
                                 double* partials) {
  __shared__ double partial[kBiasRowThreads][kBiasCols + 1];
  const int64_t j = blockIdx.x * static_cast<int64_t>(kBiasCols) + threadIdx.x;
  const int64_t first = blockIdx.y * rows_per_chunk;
  const int64_t end = first + rows_per_chunk < m ? first + rows_per_chunk : m;
  double sum = 0;
  if (j < n) {
    for (int64_t i = first + threadIdx.y; i < end; i += kBiasRowThreads) {
      sum += dout.Load(i * n + j);
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    double total = 0;
    for (int r = 0; r < kBiasRowThreads; ++r) total += partial[r][threadIdx.x];
    partials[blockIdx.y * n + j] = total;
  }
}

__global__ void BiasGradFinish(const double* partials, int64_t chunks, int64_t n, FloatPtr dbias) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += partials[c * n + j];
    dbias.Store(j, dbias.Load(j) + static_cast<float>(total));
  }
}

// Enqueues dbias += column sums of dout; the partials go to the start of ctx.workspace (the
// GEMMs before it on the stream are done with it by then).
absl::Status BiasGrad(const DeviceContext& ctx, const Tensor& dout, const Tensor& dbias) {
  constexpr const char* kOp = "LinearBackward dbias";
  const int64_t m = dout.dim(0), n = dout.dim(1);
  const int64_t need = BiasGradWorkspaceBytes(m, n);
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < need || AlignmentOf(ctx.workspace.data) < 8) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOp, ": needs ", need, " workspace bytes (8-byte aligned) for ", m, " x ", n,
                     ", context has ", have, " (size ctx.workspace with LinearWorkspaceBytes)"));
  }
  const int64_t chunks = BiasGradChunks(m);
  const int64_t rows_per_chunk = (m + chunks - 1) / chunks;
  auto* partials = static_cast<double*>(ctx.workspace.data);
  const dim3 grid(static_cast<unsigned int>((n + kBiasCols - 1) / kBiasCols),
                  static_cast<unsigned int>(chunks));
  const dim3 block(kBiasCols, kBiasRowThreads);
  BiasGradPartials<<<grid, block, 0, StreamOf(ctx)>>>(AsFloatPtr(dout), m, n, rows_per_chunk,
                                                      partials);
  constexpr int kThreads = 256;
  BiasGradFinish<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(partials, chunks, n,
                                                                       AsFloatPtr(dbias));
  return LaunchStatus(kOp);
}

}  // namespace

absl::Status Gemm(const DeviceContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c,
                  const GemmArgs& args) {
  const bool ta = args.trans_a == Transpose::kYes;
  const bool tb = args.trans_b == Transpose::kYes;
  return RunGemm(ctx, "Gemm",
                 {.ta = ta,
                  .tb = tb,
                  .m = ta ? a.dim(1) : a.dim(0),
                  .n = tb ? b.dim(0) : b.dim(1),
                  .k = ta ? a.dim(0) : a.dim(1),
                  .alpha = args.alpha,
                  .beta = args.beta,
                  .a = a.raw(),
                  .a_dtype = a.dtype(),
                  .b = b.raw(),
                  .b_dtype = b.dtype(),
                  .c = c.raw(),
                  .c_dtype = c.dtype()});
}

absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args) {
  const int64_t m = args.inp.dim(0);
  const int64_t k = args.inp.dim(1);
  const int64_t n = args.weight.dim(0);
  LtCall call{.ta = false,
              .tb = true,
              .m = m,
              .n = n,
              .k = k,
              .a = args.inp.raw(),
              .a_dtype = args.inp.dtype(),
              .b = args.weight.raw(),
              .b_dtype = args.weight.dtype(),
              .c = args.out.raw(),
              .c_dtype = args.out.dtype()};
  if (!args.bias.empty() && m > 0 && n > 0) {
    const GemmPlan plan = PlanFor(m, n, k, call.a_dtype, call.b_dtype, call.c_dtype);
    // The epilogue reads the bias in D's dtype; 16-byte alignment keeps its vector loads legal.
    const bool fuse = k > 0 && args.bias.dtype() == args.out.dtype() &&
                      plan.out == args.out.dtype() && AlignmentOf(args.bias.raw()) >= 16;
    if (fuse) {
      call.bias = args.bias.raw();
    } else {
      constexpr int kThreads = 256;
      BroadcastRowsKernel<<<GridFor(m * n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
          AsFloatPtr(args.bias), AsFloatPtr(args.out), m, n);
      ZT_RETURN_IF_ERROR(LaunchStatus("LinearForward"));
      call.beta = 1.0f;
    }
  }
  return RunGemm(ctx, "LinearForward", call);
}

absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args) {
  const int64_t m = args.dout.dim(0);
  const int64_t n = args.dout.dim(1);
  const int64_t k = args.weight.dim(1);
  if (!args.dinp.empty()) {
    // dinp (M, K) = dout (M, N) · weight (N, K)
    ZT_RETURN_IF_ERROR(RunGemm(ctx, "LinearBackward dinp",
                               {.m = m,
                                .n = k,
                                .k = n,
                                .beta = args.dinp_mode == Accumulate::kAdd ? 1.0f : 0.0f,
                                .a = args.dout.raw(),
                                .a_dtype = args.dout.dtype(),
                                .b = args.weight.raw(),
                                .b_dtype = args.weight.dtype(),
                                .c = args.dinp.raw(),
                                .c_dtype = args.dinp.dtype()}));
  }
  // dweight (N, K) += doutᵀ (N, M) · inp (M, K)
  ZT_RETURN_IF_ERROR(RunGemm(ctx, "LinearBackward dweight",
                             {.ta = true,
                              .m = n,
                              .n = k,
                              .k = m,
                              .beta = 1.0f,
                              .a = args.dout.raw(),
                              .a_dtype = args.dout.dtype(),
                              .b = args.inp.raw(),
                              .b_dtype = args.inp.dtype(),
                              .c = args.dweight.raw(),
                              .c_dtype = args.dweight.dtype()}));
  if (!args.dbias.empty() && n > 0) ZT_RETURN_IF_ERROR(BiasGrad(ctx, args.dout, args.dbias));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext&, const GemmShape& shape) {
  // RunGemm reaches cuBLASLt only for non-empty shapes.
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return 0;
  return PlanFor(shape.m, shape.n, shape.k, shape.a_dtype, shape.b_dtype, shape.c_dtype)
      .total_bytes();
}

}  // namespace zt::cuda
