// CPU GEMM through oneDNN's matmul primitive or OpenBLAS's sgemm, and the linear layer built
// on it.
// Accumulation rule: dweight and dbias +=; dinp = or += as the caller says.
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <exception>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
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

// What a oneDNN matmul primitive is specialised to. alpha is a creation-time output scale
// (runtime scales make oneDNN 2.6 fall back to its gemm:jit path, which mallocs its packing
// buffers), beta the scale of a sum post-op, and the thread count sizes the per-thread scratch
// and the work split.
struct MatmulKey {
  int64_t m, n, k, lda, ldb, ldc;
  Transpose trans_a, trans_b;
  uint32_t alpha_bits, beta_bits;
  int threads;

  auto operator<=>(const MatmulKey&) const = default;
};

struct MatmulEntry {
  dnnl::matmul::primitive_desc pd;
  dnnl::memory::desc a, b, c, scratch;
  int64_t scratch_bytes = 0;
  // Created on the first GEMM of this key: sizing a workspace needs only the descriptor, and
  // JIT-compiling kernels of GEMMs that never run would cost memory the plan does not hold.
  dnnl::matmul primitive;
};

std::string ShapeLabel(const MatmulKey& key) {
  return absl::StrCat("Gemm ", key.m, "x", key.n, "x", key.k, " (",
                      key.trans_a == Transpose::kYes ? "T" : "N",
                      key.trans_b == Transpose::kYes ? "T" : "N", ")");
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
  // set it to key.threads); with `with_primitive`, its primitive exists on return.
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
    if (with_primitive && !entry.primitive) {
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
    MatmulEntry e;
    try {
      // Row-major operands described by their strides, so transposed ones need no copy.
      e.a = memory::desc(
          {key.m, key.k}, memory::data_type::f32,
          key.trans_a == Transpose::kYes ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
      e.b = memory::desc(
          {key.k, key.n}, memory::data_type::f32,
          key.trans_b == Transpose::kYes ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
      e.c = memory::desc({key.m, key.n}, memory::data_type::f32, memory::dims{key.ldc, 1});
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
      e.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(e.a, e.b, e.c), attr, engine);
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

MatmulKey KeyOf(const DeviceContext& ctx, const SgemmCall& call) {
  return {.m = call.m,
          .n = call.n,
          .k = call.k,
          .lda = call.lda,
          .ldb = call.ldb,
          .ldc = call.ldc,
          .trans_a = call.trans_a,
          .trans_b = call.trans_b,
          .alpha_bits = std::bit_cast<uint32_t>(call.alpha),
          .beta_bits = std::bit_cast<uint32_t>(call.beta),
          .threads = ctx.num_threads};
}

absl::Status OneDnnSgemm(const DeviceContext& ctx, const SgemmCall& call) {
  // oneDNN (OpenMP build) sizes its team from the calling thread's nthreads-var ICV, so each
  // rank thread gets its own team of ctx.num_threads; primitives are created for that count.
  omp_set_num_threads(ctx.num_threads);
  const MatmulKey key = KeyOf(ctx, call);
  ZT_ASSIGN_OR_RETURN(const MatmulEntry* entry, Cache().Find(key, /*with_primitive=*/true));
  const int64_t have = ctx.workspace.data != nullptr ? ctx.workspace.bytes : 0;
  if (have < entry->scratch_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        ShapeLabel(key), ": needs ", entry->scratch_bytes, " workspace bytes, context has ", have,
        " (size ctx.workspace with GemmWorkspaceBytes / the memory plan's gemm_workspace)"));
  }
  const dnnl::engine& engine = CpuEngine().engine;
  ZT_ASSIGN_OR_RETURN(dnnl::stream * stream, ThreadStream(key, engine));
  try {
    std::unordered_map<int, dnnl::memory> args = {
        {DNNL_ARG_SRC, dnnl::memory(entry->a, engine, const_cast<float*>(call.a))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(entry->b, engine, const_cast<float*>(call.b))},
        {DNNL_ARG_DST, dnnl::memory(entry->c, engine, call.c)}};
    if (entry->scratch_bytes > 0) {
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(entry->scratch, engine, ctx.workspace.data));
    }
    entry->primitive.execute(*stream, args);
    stream->wait();
  } catch (const std::exception& e) {
    return OneDnnError(key, "matmul execution", e);
  }
  return absl::OkStatus();
}

absl::Status OpenBlasSgemm(const DeviceContext& ctx, const SgemmCall& call) {
  // The pthreads build has one pool per process; resizing it is only done when it differs,
  // since every rank of a process uses the same thread count.
  if (openblas_get_num_threads() != ctx.num_threads) openblas_set_num_threads(ctx.num_threads);
  cblas_sgemm(CblasRowMajor, call.trans_a == Transpose::kYes ? CblasTrans : CblasNoTrans,
              call.trans_b == Transpose::kYes ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(call.m), static_cast<blasint>(call.n),
              static_cast<blasint>(call.k), call.alpha, call.a, static_cast<blasint>(call.lda),
              call.b, static_cast<blasint>(call.ldb), call.beta, call.c,
              static_cast<blasint>(call.ldc));
  return absl::OkStatus();
}

}  // namespace

absl::Status Sgemm(const DeviceContext& ctx, const SgemmCall& call) {
  if (call.m == 0 || call.n == 0) return absl::OkStatus();
  if (call.k == 0) {
    // op(a)·op(b) is all zeros; the libraries disagree on whether they touch c at all.
    for (int64_t i = 0; i < call.m; ++i) {
      float* row = call.c + i * call.ldc;
      for (int64_t j = 0; j < call.n; ++j) row[j] = call.beta == 0.0f ? 0.0f : call.beta * row[j];
    }
    return absl::OkStatus();
  }
  switch (ctx.cpu_gemm) {
    case CpuGemm::kOneDnn:
      return OneDnnSgemm(ctx, call);
    case CpuGemm::kOpenBlas:
      return OpenBlasSgemm(ctx, call);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("Gemm: unknown cpu_gemm ", static_cast<int>(ctx.cpu_gemm)));
}

absl::Status LinearForward(const DeviceContext& ctx, const LinearForwardArgs& args) {
  const int64_t m = args.inp.dim(0);
  const int64_t k = args.inp.dim(1);
  const int64_t n = args.weight.dim(0);
  float* out = args.out.data<float>();
  float beta = 0.0f;
  if (!args.bias.empty()) {
    // Seeding out with the bias and letting the GEMM add to it (beta = 1) costs one write pass
    // over out instead of a read-modify-write pass after the GEMM.
    const float* bias = args.bias.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, out + i * n);
    beta = 1.0f;
  }
  return Sgemm(ctx, {.trans_a = Transpose::kNo,
                     .trans_b = Transpose::kYes,
                     .m = m,
                     .n = n,
                     .k = k,
                     .a = args.inp.data<float>(),
                     .lda = k,
                     .b = args.weight.data<float>(),
                     .ldb = k,
                     .beta = beta,
                     .c = out,
                     .ldc = n});
}

absl::Status LinearBackward(const DeviceContext& ctx, const LinearBackwardArgs& args) {
  const int64_t m = args.dout.dim(0);
  const int64_t n = args.dout.dim(1);
  const int64_t k = args.weight.dim(1);
  const float* dout = args.dout.data<float>();
  if (!args.dinp.empty()) {
    // dinp (M, K) = dout (M, N) · weight (N, K)
    ZT_RETURN_IF_ERROR(Sgemm(ctx, {.m = m,
                                   .n = k,
                                   .k = n,
                                   .a = dout,
                                   .lda = n,
                                   .b = args.weight.data<float>(),
                                   .ldb = k,
                                   .beta = args.dinp_mode == Accumulate::kAdd ? 1.0f : 0.0f,
                                   .c = args.dinp.data<float>(),
                                   .ldc = k}));
  }
  // dweight (N, K) += doutᵀ (N, M) · inp (M, K)
  ZT_RETURN_IF_ERROR(Sgemm(ctx, {.trans_a = Transpose::kYes,
                                 .m = n,
                                 .n = k,
                                 .k = m,
                                 .a = dout,
                                 .lda = n,
                                 .b = args.inp.data<float>(),
                                 .ldb = k,
                                 .beta = 1.0f,
                                 .c = args.dweight.data<float>(),
                                 .ldc = k}));
  if (!args.dbias.empty()) {
    float* dbias = args.dbias.data<float>();
    const int64_t strips = (n + kBiasStrip - 1) / kBiasStrip;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t j0 = s * kBiasStrip;
      const int64_t width = std::min(kBiasStrip, n - j0);
      // Double accumulators: the sum runs over all B·T rows, and the order is fixed anyway.
      double acc[kBiasStrip] = {};
      for (int64_t i = 0; i < m; ++i) {
        const float* row = dout + i * n + j0;
        for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
      }
      for (int64_t j = 0; j < width; ++j) dbias[j0 + j] += static_cast<float>(acc[j]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GemmWorkspaceBytes(const DeviceContext& ctx, const GemmShape& shape) {
  // Sgemm never reaches a library for empty shapes.
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return 0;
  if (ctx.cpu_gemm != CpuGemm::kOneDnn) return 0;  // OpenBLAS keeps its own buffers
  const bool ta = shape.trans_a == Transpose::kYes;
  const bool tb = shape.trans_b == Transpose::kYes;
  const SgemmCall call = {.trans_a = shape.trans_a,
                          .trans_b = shape.trans_b,
                          .m = shape.m,
                          .n = shape.n,
                          .k = shape.k,
                          .lda = ta ? shape.m : shape.k,
                          .ldb = tb ? shape.k : shape.n,
                          .beta = shape.accumulate ? 1.0f : 0.0f,
                          .ldc = shape.n};
  // The descriptor is created for the calling thread's OpenMP thread count; a planner's
  // thread keeps its own setting afterwards.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(ctx.num_threads);
  absl::StatusOr<const MatmulEntry*> entry =
      Cache().Find(KeyOf(ctx, call), /*with_primitive=*/false);
  omp_set_num_threads(saved_threads);
  if (!entry.ok()) return entry.status();
  return (*entry)->scratch_bytes;
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
