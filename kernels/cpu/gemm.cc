// CPU GEMM through oneDNN's or OpenBLAS's sgemm, and the linear layer built on it.
// Accumulation rule: dweight and dbias +=; dinp = or += as the caller says.
#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>

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

char TransChar(Transpose t) { return t == Transpose::kYes ? 'T' : 'N'; }

absl::Status OneDnnSgemm(const DeviceContext& ctx, const SgemmCall& call) {
  // oneDNN (OpenMP build) sizes its team from the calling thread's nthreads-var ICV, so each
  // rank thread gets its own team of ctx.num_threads.
  omp_set_num_threads(ctx.num_threads);
  const dnnl_status_t st =
      dnnl_sgemm(TransChar(call.trans_a), TransChar(call.trans_b), call.m, call.n, call.k,
                 call.alpha, call.a, call.lda, call.b, call.ldb, call.beta, call.c, call.ldc);
  if (st != dnnl_success) {
    return absl::InternalError(absl::StrCat("Gemm: dnnl_sgemm failed with status ", st, " (m ",
                                            call.m, ", n ", call.n, ", k ", call.k, ")"));
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

std::string GemmDescription(CpuGemm gemm) {
  switch (gemm) {
    case CpuGemm::kOneDnn: {
      const dnnl_version_t* v = dnnl_version();
      return absl::StrCat("oneDNN ", v->major, ".", v->minor, ".", v->patch, " sgemm, ISA ",
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
