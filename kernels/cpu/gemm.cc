// CPU GEMM through oneDNN's matmul primitive or OpenBLAS's sgemm, and the linear layer built
// on it.
// Accumulation rule: dweight and dbias +=; dinp = or += as the caller says.
// Precision: products are summed in fp32 and each result is rounded once to its tensor's
// dtype. bf16 · bf16 runs natively on oneDNN; other 16-bit operands are widened to f32 in the
// workspace (exactly) and run through the f32 GEMM, the f32 result rounded into c after.
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <exception>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "kernels/status_macros.h"

namespace zt::cpu {
namespace {

// Width of the column strips dbias is reduced in: one strip's accumulators stay in registers
// while the rows stream past, and every column is summed in row order by exactly one thread.
constexpr int64_t kBiasStrip = 64;

const char* IsaName(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_all:
      return "all";
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx512_mic:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
  }
  return "unknown";
}

// Scratch pieces are whole multiples of this, so each starts as aligned as the workspace.
constexpr int64_t kScratchAlign = 64;

int64_t AlignUp(int64_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

bool IsF32(const GemmCall& call) {
  return call.a.dtype == DType::kF32 && call.b.dtype == DType::kF32 && call.c.dtype == DType::kF32;
}

// "Gemm 256x192x512 (NN)", with the dtypes appended when any is 16-bit.
std::string ShapeLabel(int64_t m, int64_t n, int64_t k, Transpose ta, Transpose tb, DType a,
                       DType b, DType c) {
  std::string label =
      absl::StrCat("Gemm ", m, "x", n, "x", k, " (", ta == Transpose::kYes ? "T" : "N",
                   tb == Transpose::kYes ? "T" : "N");
  if (a != DType::kF32 || b != DType::kF32 || c != DType::kF32) {
    absl::StrAppend(&label, ", ", DTypeName(a), " x ", DTypeName(b), " -> ", DTypeName(c));
  }
  return label + ")";
}

// What a oneDNN matmul primitive is specialised to. alpha is a creation-time output scale
// (runtime scales make oneDNN 2.6 fall back to its gemm:jit path, which mallocs its packing
// buffers), beta the scale of a sum post-op, and the thread count sizes the per-thread scratch
// and the work split.
struct MatmulKey {
  int64_t m, n, k, lda, ldb, ldc;
  Transpose trans_a, trans_b;
  DType a_dtype, b_dtype, c_dtype;
  uint32_t alpha_bits, beta_bits;
  int threads;

  auto operator<=>(const MatmulKey&) const = default;
};

struct MatmulEntry {
  // False for a 16-bit key oneDNN has no optimised kernel for on this CPU (it refused, or
  // offered only its reference implementation): those calls take the widening path.
  bool supported = true;
  dnnl::matmul::primitive_desc pd;
  dnnl::memory::desc a, b, c, scratch;
  int64_t scratch_bytes = 0;
  // Created on the first GEMM of this key: sizing a workspace needs only the descriptor, and
  // JIT-compiling kernels of GEMMs that never run would cost memory the plan does not hold.
  dnnl::matmul primitive;
};

std::string ShapeLabel(const MatmulKey& key) {
  return ShapeLabel(key.m, key.n, key.k, key.trans_a, key.trans_b, key.a_dtype, key.b_dtype,
                    key.c_dtype);
}

dnnl::memory::data_type DnnlType(DType t) {
  switch (t) {
    case DType::kBF16:
      return dnnl::memory::data_type::bf16;
    case DType::kF16:
      return dnnl::memory::data_type::f16;
    default:
      return dnnl::memory::data_type::f32;
  }
}

absl::Status OneDnnError(const MatmulKey& key, const char* what, const std::exception& e) {
  if (const auto* d = dynamic_cast<const dnnl::error*>(&e)) {
    return absl::InternalError(absl::StrCat(ShapeLabel(key), ": oneDNN ", what,
                                            " failed: ", d->what(), " (status ", d->status, ")"));
  }
  return absl::InternalError(
      absl::StrCat(ShapeLabel(key), ": oneDNN ", what, " failed: ", e.what()));
}

// The CPU engine every primitive and stream belongs to, created on first use and never
// destroyed (primitives in the cache refer to it until the process ends).
struct EngineHolder {
  dnnl::engine engine;
  std::string error;
};

const EngineHolder& CpuEngine() {
  static const EngineHolder* const holder = [] {
    auto* h = new EngineHolder;
    try {
      h->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    } catch (const std::exception& e) {
      h->error = e.what();
    }
    return h;
  }();
  return *holder;
}

// oneDNN streams are not documented as safe to share between threads; each rank thread
// gets its own, once.
absl::StatusOr<dnnl::stream*> ThreadStream(const MatmulKey& key, const dnnl::engine& engine) {
  thread_local dnnl::stream stream;
  if (!stream) {
    try {
      stream = dnnl::stream(engine);
    } catch (const std::exception& e) {
      return OneDnnError(key, "stream creation", e);
    }
  }
  return &stream;
}

// Process-wide: entries are created once and never removed, so a pointer handed out stays
// valid, and an entry's primitive, once set under the lock, is only read.
class MatmulCache {
 public:
  // The entry of `key`, created with the calling thread's OpenMP thread count (the caller has
  // set it to key.threads); with `with_primitive`, a supported entry's primitive exists on
  // return.
  absl::StatusOr<const MatmulEntry*> Find(const MatmulKey& key, bool with_primitive) {
    const EngineHolder& engine = CpuEngine();
    if (!engine.error.empty()) {
      return absl::InternalError(
          absl::StrCat(ShapeLabel(key), ": oneDNN CPU engine unavailable: ", engine.error));
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      ZT_ASSIGN_OR_RETURN(MatmulEntry entry, Describe(key, engine.engine));
      it = entries_.emplace(key, std::move(entry)).first;
    }
    MatmulEntry& entry = it->second;
    if (with_primitive && entry.supported && !entry.primitive) {
      try {
        entry.primitive = dnnl::matmul(entry.pd);
      } catch (const std::exception& e) {
        return OneDnnError(key, "matmul primitive creation", e);
      }
    }
    return &entry;
  }

  int64_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(entries_.size());
  }

 private:
  static absl::StatusOr<MatmulEntry> Describe(const MatmulKey& key, const dnnl::engine& engine) {
    using dnnl::memory;
    const bool all_f32 =
        key.a_dtype == DType::kF32 && key.b_dtype == DType::kF32 && key.c_dtype == DType::kF32;
    MatmulEntry e;
    try {
      // Row-major operands described by their strides, so transposed ones need no copy.
      e.a = memory::desc(
          {key.m, key.k}, DnnlType(key.a_dtype),
          key.trans_a == Transpose::kYes ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
      e.b = memory::desc(
          {key.k, key.n}, DnnlType(key.b_dtype),
          key.trans_b == Transpose::kYes ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
      e.c = memory::desc({key.m, key.n}, DnnlType(key.c_dtype), memory::dims{key.ldc, 1});
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const float alpha = std::bit_cast<float>(key.alpha_bits);
      const float beta = std::bit_cast<float>(key.beta_bits);
      if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
      if (beta != 0.0f) {
        dnnl::post_ops post;
        post.append_sum(beta);  // c = beta · c + alpha · op(a) · op(b)
        attr.set_post_ops(post);
      }
      if (all_f32) {
        e.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.a, e.b, e.c), attr, engine);
      } else {
        try {
          e.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.a, e.b, e.c), attr, engine);
        } catch (const dnnl::error&) {
          e.supported = false;  // no kernel for these dtypes: the widening path runs instead
          return e;
        }
        // The reference kernel is orders of magnitude slower than widening to the f32 GEMM.
        if (std::string_view(e.pd.impl_info_str()).starts_with("ref")) {
          e.supported = false;
          return e;
        }
      }
      e.scratch = e.pd.scratchpad_desc();
      e.scratch_bytes = static_cast<int64_t>(e.scratch.get_size());
    } catch (const std::exception& ex) {
      return OneDnnError(key, "matmul descriptor creation", ex);
    }
    return e;
  }

  std::mutex mu_;
  std::map<MatmulKey, MatmulEntry> entries_;  // guarded by mu_
};

MatmulCache& Cache() {
  static MatmulCache* const cache = new MatmulCache;
  return *cache;
}

MatmulKey KeyOf(const DeviceContext& ctx, const GemmCall& call) {
  return {.m = call.m,
          .n = call.n,
          .k = call.k,
          .lda = call.a.ld,
          .ldb = call.b.ld,
          .ldc = call.c.ld,
          .trans_a = call.trans_a,
          .trans_b = call.trans_b,
          .a_dtype = call.a.dtype,
          .b_dtype = call.b.dtype,
          .c_dtype = call.c.dtype,
          .alpha_bits = std::bit_cast<uint32_t>(call.alpha),
          .beta_bits = std::bit_cast<uint32_t>(call.beta),
          .threads = ctx.num_threads};
}

// Runs `call` on the primitive of `entry` (supported, primitive created) with its scratch at
// the start of ctx.workspace, which the caller has checked is large enough.
absl::Status OneDnnExecute(const DeviceContext& ctx, const GemmCall& call, const MatmulKey& key,
                           const MatmulEntry& entry) {
  const dnnl::engine& engine = CpuEngine().engine;
  ZT_ASSIGN_OR_RETURN(dnnl::stream * stream, ThreadStream(key, engine));
  try {
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl::memory(entry.a, engine, const_cast<void*>(call.a.data))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(entry.b, engine, const_cast<void*>(call.b.data))},
        {DNNL_ARG_DST, dnnl::memory(entry.c, engine, const_cast<void*>(call.c.data))}};
    if (entry.scratch_bytes > 0) {
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(entry.scratch, engine, ctx.workspace.data));
    }
    entry.primitive.execute(*stream, args);
    stream->wait();
  } catch (const std::exception& e) {
    return OneDnnError(key, "matmul execution", e);
  }
  return absl::OkStatus();
}

absl::Status OpenBlasSgemm(const DeviceContext& ctx, const GemmCall& call) {
  // The pthreads build has one pool per process; resizing it is only done when it differs,
  // since every rank of a process uses the same thread count.
  if (openblas_get_num_threads() != ctx.num_threads) openblas_set_num_threads(ctx.num_threads);
  cblas_sgemm(CblasRowMajor, call.trans_a == Transpose::kYes ? CblasTrans : CblasNoTrans,
              call.trans_b == Transpose::kYes ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(call.m), static_cast<blasint>(call.n),
              static_cast<blasint>(call.k), call.alpha, static_cast<const float*>(call.a.data),
              static_cast<blasint>(call.a.ld), static_cast<const float*>(call.b.data),
              static_cast<blasint>(call.b.ld), call.beta,
              static_cast<float*>(const_cast<void*>(call.c.data)), static_cast<blasint>(call.c.ld));
  return absl::OkStatus();
}

// ---- Widening to f32 and rounding back -------------------------------------------------------

// n elements of `from` (f32, bf16 or f16) to f32. Widening is exact.
void WidenSpan(const void* src, DType from, float* dst, int64_t n) {
  switch (from) {
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#ifdef __AVX512F__
      for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
      }
#endif
      for (; i < n; ++i) dst[i] = HalfToFloat(s[i]);
      return;
    }
    default:
      std::copy_n(static_cast<const float*>(src), n, dst);
      return;
  }
}

// n f32 elements to `to`, rounding to nearest even (f16 overflows to ±inf). The vector f16
// conversion is IEEE's, so it agrees with FloatToHalf on every value but NaN payloads.
void NarrowSpan(const float* src, DType to, void* dst, int64_t n) {
  switch (to) {
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#ifdef __AVX512F__
      for (; i + 16 <= n; i += 16) {
        const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), h);
      }
#endif
      for (; i < n; ++i) d[i] = FloatToHalf(src[i]);
      return;
    }
    default:
      std::copy_n(src, n, static_cast<float*>(dst));
      return;
  }
}

// rows × cols of a matrix with leading dimension `ld` to a packed f32 copy.
void WidenMatrix(const DeviceContext& ctx, const GemmOperand& src, int64_t rows, int64_t cols,
                 float* dst) {
  const int64_t size = DTypeSize(src.dtype);
  const auto* base = static_cast<const uint8_t*>(src.data);
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    WidenSpan(base + i * src.ld * size, src.dtype, dst + i * cols, cols);
  }
}

// A packed f32 matrix rounded into `dst` (leading dimension dst.ld).
void NarrowMatrix(const DeviceContext& ctx, const float* src, int64_t rows, int64_t cols,
                  const GemmOperand& dst) {
  const int64_t size = DTypeSize(dst.dtype);
  auto* base = static_cast<uint8_t*>(const_cast<void*>(dst.data));
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    NarrowSpan(src + i * cols, dst.dtype, base + i * dst.ld * size, cols);
  }
}

// ---- Choosing the path ------------------------------------------------------------------------

// How a call runs and what it takes from the workspace: f32 copies of the widened operands
// and of c (each rounded up to kScratchAlign, in that order), then the library's scratch.
struct GemmPlan {
  bool direct = true;  // the library runs the call's own dtypes
  int64_t a_bytes = 0, b_bytes = 0, c_bytes = 0;
  const MatmulEntry* entry = nullptr;  // oneDNN only: the primitive that runs
  MatmulKey key{};
  int64_t library_bytes = 0;

  int64_t copies_bytes() const { return a_bytes + b_bytes + c_bytes; }
  int64_t total_bytes() const { return copies_bytes() + library_bytes; }
};

// The f32 call the widening path runs: widened operands packed at `copies`, f32 ones in place.
GemmCall WidenedCall(const GemmCall& call, const GemmPlan& plan, uint8_t* copies) {
  const bool ta = call.trans_a == Transpose::kYes;
  const bool tb = call.trans_b == Transpose::kYes;
  GemmCall f32 = call;
  if (plan.a_bytes > 0) f32.a = {copies, DType::kF32, ta ? call.m : call.k};
  if (plan.b_bytes > 0) f32.b = {copies + plan.a_bytes, DType::kF32, tb ? call.k : call.n};
  if (plan.c_bytes > 0) f32.c = {copies + plan.a_bytes + plan.b_bytes, DType::kF32, call.n};
  f32.a.dtype = f32.b.dtype = f32.c.dtype = DType::kF32;
  return f32;
}

// The calling thread's OpenMP thread count is ctx.num_threads (oneDNN descriptors are created
// for it). Data pointers of `call` are not read.
absl::StatusOr<GemmPlan> PlanGemm(const DeviceContext& ctx, const GemmCall& call,
                                  bool with_primitive) {
  GemmPlan plan;
  const bool onednn = ctx.cpu_gemm == CpuGemm::kOneDnn;
  if (onednn && call.a.dtype == DType::kBF16 && call.b.dtype == DType::kBF16 &&
      (call.c.dtype == DType::kF32 || call.c.dtype == DType::kBF16)) {
    plan.key = KeyOf(ctx, call);
    ZT_ASSIGN_OR_RETURN(plan.entry, Cache().Find(plan.key, with_primitive));
    if (plan.entry->supported) {
      plan.library_bytes = plan.entry->scratch_bytes;
      return plan;
    }
  }
  if (!IsF32(call)) {
    plan.direct = false;
    auto f32_bytes = [](int64_t elements) { return AlignUp(elements * int64_t{4}); };
    if (call.a.dtype != DType::kF32) plan.a_bytes = f32_bytes(call.m * call.k);
    if (call.b.dtype != DType::kF32) plan.b_bytes = f32_bytes(call.k * call.n);
    if (call.c.dtype != DType::kF32) plan.c_bytes = f32_bytes(call.m * call.n);
  }
  if (!onednn) return plan;  // OpenBLAS keeps its own buffers
  // Any non-null address gives the widened call's leading dimensions; only they enter the key.
  static uint8_t probe;
  plan.key = KeyOf(ctx, plan.direct ? call : WidenedCall(call, plan, &probe));
  ZT_ASSIGN_OR_RETURN(plan.entry, Cache().Find(plan.key, with_primitive));
  plan.library_bytes = plan.entry->scratch_bytes;
  return plan;
}

// c = beta · c when op(a)·op(b) is empty; the libraries disagree on whether they touch c.
void ScaleOnly(const GemmCall& call) {
  const int64_t size = DTypeSize(call.c.dtype);
  auto* base = static_cast<uint8_t*>(const_cast<void*>(call.c.data));
  std::vector<float> row(static_cast<size_t>(call.n));
  for (int64_t i = 0; i < call.m; ++i) {
    void* dst = base + i * call.c.ld * size;
    WidenSpan(dst, call.c.dtype, row.data(), call.n);
    for (float& x : row) x = call.beta == 0.0f ? 0.0f : call.beta * x;
    NarrowSpan(row.data(), call.c.dtype, dst, call.n);
  }
}

}  // namespace

absl::Status Gemm(const DeviceContext& ctx, const GemmCall& call) {
  if (call.m == 0 || call.n == 0) return absl::OkStatus();
  if (call.k == 0) {
    ScaleOnly(call);
    return absl::OkStatus();
  }
  if (ctx.cpu_gemm != CpuGemm::kOneDnn && ctx.cpu_gemm != CpuGemm::kOpenBlas) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: unknown cpu_gemm ", static_cast<int>(ctx.cpu_gemm)));
  }
  // oneDNN (OpenMP build) sizes its team from the calling thread's nthreads-var ICV, so each
  // rank thread gets its own team of ctx.num_threads; primitives are created for that count.
  if (ctx.cpu_gemm == CpuGemm::kOneDnn) omp_set_num_threads(ctx.num_threads);
  ZT_ASSIGN_OR_RETURN(const GemmPlan plan, PlanGemm(ctx, call, /*with_primitive=*/true));
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < plan.total_bytes()) {
    return absl::FailedPreconditionError(absl::StrCat(
        ShapeLabel(call.m, call.n, call.k, call.trans_a, call.trans_b, call.a.dtype, call.b.dtype,
                   call.c.dtype),
        ": needs ", plan.total_bytes(), " workspace bytes, context has ", have,
        " (size ctx.workspace with GemmWorkspaceBytes / the memory plan's gemm_workspace)"));
  }
  if (plan.direct) {
    if (ctx.cpu_gemm == CpuGemm::kOpenBlas) return OpenBlasSgemm(ctx, call);
    return OneDnnExecute(ctx, call, plan.key, *plan.entry);
  }
  auto* copies = static_cast<uint8_t*>(ctx.workspace.data);
  const GemmCall f32 = WidenedCall(call, plan, copies);
  const bool ta = call.trans_a == Transpose::kYes;
  const bool tb = call.trans_b == Transpose::kYes;
  // Stored (not op()) shapes: a is (k, m) when transposed, b is (n, k).
  if (plan.a_bytes > 0) {
    WidenMatrix(ctx, call.a, ta ? call.k : call.m, ta ? call.m : call.k,
                const_cast<float*>(static_cast<const float*>(f32.a.data)));
  }
  if (plan.b_bytes > 0) {
    WidenMatrix(ctx, call.b, tb ? call.n : call.k, tb ? call.k : call.n,
                const_cast<float*>(static_cast<const float*>(f32.b.data)));
  }
  float* c32 = static_cast<float*>(const_cast<void*>(f32.c.data));
  if (plan.c_bytes > 0 && call.beta != 0.0f) WidenMatrix(ctx, call.c, call.m, call.n, c32);
  DeviceContext library_ctx = ctx;
  library_ctx.workspace = {.data = copies + plan.copies_bytes(),
                           .bytes = have - plan.copies_bytes()};
  if (ctx.cpu_gemm == CpuGemm::kOpenBlas) {
    ZT_RETURN_IF_ERROR(OpenBlasSgemm(ctx, f32));
  } else {
    ZT_RETURN_IF_ERROR(OneDnnExecute(library_ctx, f32, plan.key, *plan.entry));
  }
  if (plan.c_bytes > 0) NarrowMatrix(ctx, c32, call.m, call.n, call.c);
  return absl::OkStatus();
}

namespace {

// Calls f with the element type stored for `t` (f32, bf16 or f16) as a compile-time constant.
template <typename F>
void WithFloatType(DType t, F&& f) {
  switch (t) {
    case DType::kBF16:
      f(std::integral_constant<DType, DType::kBF16>{});
      return;
    case DType::kF16:
      f(std::integral_constant<DType, DType::kF16>{});
      return;
    default:
      f(std::integral_constant<DType, DType::kF32>{});
      return;
  }
}

template <DType T>
float Load(const void* p, int64_t i) {
  if constexpr (T == DType::kF32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (T == DType::kBF16) {
    return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
  } else {
    return HalfToFloat(static_cast<const uint16_t*>(p)[i]);
  }
}

template <DType T>
void Store(void* p, int64_t i, float x) {
  if constexpr (T == DType::kF32) {
    static_cast<float*>(p)[i] = x;
  } else if constexpr (T == DType::kBF16) {
    static_cast<uint16_t*>(p)[i] = FloatToBf16(x);
  } else {
    static_cast<uint16_t*>(p)[i] = FloatToHalf(x);
  }
}

GemmOperand Operand(const Tensor& t) { return {t.raw(), t.dtype(), t.dim(-1)}; }

}  // namespace

absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args) {
  const int64_t m = args.inp.dim(0);
  const int64_t k = args.inp.dim(1);
  const int64_t n = args.weight.dim(0);
  float beta = 0.0f;
  if (!args.bias.empty()) {
    // Seeding out with the bias and letting the GEMM add to it (beta = 1) costs one write pass
    // over out instead of a read-modify-write pass after the GEMM. A 16-bit out holds the bias
    // rounded to its dtype, so the sum is still rounded once.
    std::vector<uint8_t> row(static_cast<size_t>(n * DTypeSize(args.out.dtype())));
    std::vector<float> bias32(static_cast<size_t>(n));
    WidenSpan(args.bias.raw(), args.bias.dtype(), bias32.data(), n);
    NarrowSpan(bias32.data(), args.out.dtype(), row.data(), n);
    auto* out = static_cast<uint8_t*>(args.out.raw());
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t i = 0; i < m; ++i) {
      std::copy(row.begin(), row.end(), out + i * static_cast<int64_t>(row.size()));
    }
    beta = 1.0f;
  }
  return Gemm(ctx, {.trans_a = Transpose::kNo,
                    .trans_b = Transpose::kYes,
                    .m = m,
                    .n = n,
                    .k = k,
                    .a = Operand(args.inp),
                    .b = Operand(args.weight),
                    .beta = beta,
                    .c = Operand(args.out)});
}

absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args) {
  const int64_t m = args.dout.dim(0);
  const int64_t n = args.dout.dim(1);
  const int64_t k = args.weight.dim(1);
  if (!args.dinp.empty()) {
    // dinp (M, K) = dout (M, N) · weight (N, K)
    ZT_RETURN_IF_ERROR(Gemm(ctx, {.m = m,
                                  .n = k,
                                  .k = n,
                                  .a = Operand(args.dout),
                                  .b = Operand(args.weight),
                                  .beta = args.dinp_mode == Accumulate::kAdd ? 1.0f : 0.0f,
                                  .c = Operand(args.dinp)}));
  }
  // dweight (N, K) += doutᵀ (N, M) · inp (M, K)
  ZT_RETURN_IF_ERROR(Gemm(ctx, {.trans_a = Transpose::kYes,
                                .m = n,
                                .n = k,
                                .k = m,
                                .a = Operand(args.dout),
                                .b = Operand(args.inp),
                                .beta = 1.0f,
                                .c = Operand(args.dweight)}));
  if (!args.dbias.empty()) {
    const void* dout = args.dout.raw();
    void* dbias = args.dbias.raw();
    const int64_t strips = (n + kBiasStrip - 1) / kBiasStrip;
    WithFloatType(args.dout.dtype(), [&](auto in) {
      WithFloatType(args.dbias.dtype(), [&](auto acc_type) {
        constexpr DType kIn = decltype(in)::value;
        constexpr DType kOut = decltype(acc_type)::value;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
        for (int64_t s = 0; s < strips; ++s) {
          const int64_t j0 = s * kBiasStrip;
          const int64_t width = std::min(kBiasStrip, n - j0);
          // Double accumulators: the sum runs over all B·T rows, and the order is fixed anyway.
          double acc[kBiasStrip] = {};
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < width; ++j) acc[j] += Load<kIn>(dout, i * n + j0 + j);
          }
          for (int64_t j = 0; j < width; ++j) {
            Store<kOut>(dbias, j0 + j, Load<kOut>(dbias, j0 + j) + static_cast<float>(acc[j]));
          }
        }
      });
    });
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape) {
  // Gemm never reaches a library for empty shapes.
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return 0;
  const bool ta = shape.trans_a == Transpose::kYes;
  const bool tb = shape.trans_b == Transpose::kYes;
  const GemmCall call = {.trans_a = shape.trans_a,
                         .trans_b = shape.trans_b,
                         .m = shape.m,
                         .n = shape.n,
                         .k = shape.k,
                         .a = {nullptr, shape.a_dtype, ta ? shape.m : shape.k},
                         .b = {nullptr, shape.b_dtype, tb ? shape.k : shape.n},
                         .beta = shape.accumulate ? 1.0f : 0.0f,
                         .c = {nullptr, shape.c_dtype, shape.n}};
  // The descriptor is created for the calling thread's OpenMP thread count; a planner's
  // thread keeps its own setting afterwards.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(ctx.num_threads);
  absl::StatusOr<GemmPlan> plan = PlanGemm(ctx, call, /*with_primitive=*/false);
  omp_set_num_threads(saved_threads);
  if (!plan.ok()) return plan.status();
  return plan->total_bytes();
}

int64_t GemmPrimitiveCacheSize() { return Cache().size(); }

std::string GemmDescription(CpuGemm gemm) {
  switch (gemm) {
    case CpuGemm::kOneDnn: {
      const dnnl_version_t* v = dnnl_version();
      return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " matmul, ISA ",
                          IsaName(dnnl_get_effective_cpu_isa()));
    }
    case CpuGemm::kOpenBlas: {
      // openblas_get_config() already starts with "OpenBLAS <version>".
      return absl::StrCat(openblas_get_config(), " (", openblas_get_corename(), ")");
    }
  }
  return "unknown CPU GEMM";
}

}  // namespace zt::cpu
