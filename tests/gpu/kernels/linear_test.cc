// Gemm, LinearForward and LinearBackward on the GPU (cuBLASLt) against the CPU ops
// (kernels/linear.h) on the same inputs: every transpose, f32 (TF32 off) and bf16/f16 inputs
// and outputs, the dtype mixes cuBLASLt cannot take directly (widened through the
// workspace), alpha/beta accumulation, the fused bias epilogue and the seeded bias, and the
// backward's dinp (= and +=), dweight (+=) and dbias (+=, f64 sums). Shapes: a GPT-2 qkv
// layer's 64 x 768 x 2304, 1 x 1 x 1, and odd 37 x 129 x 65.
//
// Bounds (normalized error, ‖gpu − cpu‖ / ‖cpu‖). Both sides accumulate in f32 and round
// once, so they differ by the order of the f32 sums plus the output rounding that order may
// flip:
//  - f32 output: the summation-order difference, ~√k · 2⁻²⁴ ≈ 2e-6 for k = 768, bounded by
//    1e-5 (TF32 would give ~1e-3 and fail it, which is the point of testing with it off).
//  - a 16-bit output is at most one of its ulps apart where a flip happens; even if every
//    element flipped, the normalized error would be ≤ ulp/value: 2⁻⁷ for bf16 (8-bit
//    significand), 2⁻¹⁰ for f16. Bounds: bf16 8e-3, f16 1e-3.
#if ZT_HAVE_CUDA

#include "kernels/linear.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::HostFloats;
using gpu_test::NormalizedError;
using gpu_test::ToDevice;
using gpu_test::ToHostBytes;
using gpu_test::ToHostFloats;
using testing::RandomVector;
using testing::Stored;

// See the file comment.
double Bound(DType out) {
  switch (out) {
    case DType::kBF16:
      return 8e-3;
    case DType::kF16:
      return 1e-3;
    default:
      return 1e-5;
  }
}

// A CPU context (oneDNN) with a host workspace of `bytes`.
class CpuOwned {
 public:
  explicit CpuOwned(int64_t bytes) : ctx_(CpuContext(2)), workspace_(static_cast<size_t>(bytes)) {
    ctx_.workspace = {.data = workspace_.data(), .bytes = bytes};
  }
  const DeviceContext& ctx() const { return ctx_; }

 private:
  DeviceContext ctx_;
  std::vector<uint8_t> workspace_;
};

// A CUDA context on `stream` with a device workspace of `bytes`.
class GpuOwned {
 public:
  GpuOwned(const GpuStream& stream, int64_t bytes) : workspace_(bytes) {
    ctx_ = gpu_test::CudaContext(stream, workspace_.AsWorkspace());
  }
  const DeviceContext& ctx() const { return ctx_; }

 private:
  DeviceBuffer workspace_;
  DeviceContext ctx_;
};

// ---- Gemm ------------------------------------------------------------------------------------

struct GemmCase {
  int64_t m, n, k;
  Transpose ta, tb;
  DType a, b, c;
  float alpha, beta;
};

std::string GemmName(const GemmCase& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) + "_" +
         (c.ta == Transpose::kYes ? "T" : "N") + (c.tb == Transpose::kYes ? "T" : "N") + "_" +
         DTypeName(c.a) + "_" + DTypeName(c.b) + "_" + DTypeName(c.c) +
         (c.beta != 0.0f ? "_accumulate" : "");
}

class GemmGpuTest : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmGpuTest, MatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const GemmCase c = GetParam();
  const bool ta = c.ta == Transpose::kYes, tb = c.tb == Transpose::kYes;
  // At least one element each, so that a k = 0 operand still has memory (a null one is "empty").
  Stored a_host(RandomVector(std::max<int64_t>(c.m * c.k, 1), 1), c.a);
  Stored b_host(RandomVector(std::max<int64_t>(c.k * c.n, 1), 2), c.b);
  Stored c_host(RandomVector(c.m * c.n, 3), c.c);
  const Tensor a = ta ? a_host.View({c.k, c.m}) : a_host.View({c.m, c.k});
  const Tensor b = tb ? b_host.View({c.n, c.k}) : b_host.View({c.k, c.n});
  const Tensor out = c_host.View({c.m, c.n});
  DeviceBuffer a_mem, b_mem, c_mem;
  const Tensor ga = ToDevice(a, a_mem), gb = ToDevice(b, b_mem), gc = ToDevice(out, c_mem);

  const GemmShape shape = {.m = c.m,
                           .n = c.n,
                           .k = c.k,
                           .trans_a = c.ta,
                           .trans_b = c.tb,
                           .accumulate = c.beta != 0.0f,
                           .a_dtype = c.a,
                           .b_dtype = c.b,
                           .c_dtype = c.c};
  const GemmArgs args = {.trans_a = c.ta, .trans_b = c.tb, .alpha = c.alpha, .beta = c.beta};
  const CpuOwned cpu(GemmWorkspaceBytes(CpuContext(2), shape).value());
  ASSERT_TRUE(Gemm(cpu.ctx(), a, b, out, args).ok());
  GpuStream stream;
  const GpuOwned gpu(stream, GemmWorkspaceBytes(gpu_test::CudaContext(stream), shape).value());
  const absl::Status s = Gemm(gpu.ctx(), ga, gb, gc, args);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  EXPECT_LT(NormalizedError(ToHostFloats(gc), HostFloats(out)), Bound(c.c));
}

std::vector<GemmCase> GemmCases() {
  constexpr DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16;
  const Transpose no = Transpose::kNo, yes = Transpose::kYes;
  std::vector<GemmCase> cases;
  for (Transpose ta : {no, yes}) {
    for (Transpose tb : {no, yes}) {
      for (auto [a, b, out] :
           {std::tuple{f32, f32, f32}, {bf16, bf16, bf16}, {f16, f16, f16}, {bf16, bf16, f32}}) {
        cases.push_back({37, 65, 129, ta, tb, a, b, out, 1.0f, 0.0f});
        cases.push_back({37, 65, 129, ta, tb, a, b, out, 0.5f, 1.0f});
      }
    }
  }
  // What cuBLASLt cannot take as it is: widened through the workspace.
  for (auto [a, b, out] : {std::tuple{bf16, f32, f32},
                           {f32, f16, f16},
                           {f16, bf16, bf16},
                           {f32, f32, bf16},
                           {bf16, bf16, f16}}) {
    cases.push_back({37, 65, 129, no, yes, a, b, out, 1.0f, 0.0f});
    cases.push_back({37, 65, 129, yes, no, a, b, out, 1.0f, 1.0f});
  }
  for (DType d : {f32, bf16, f16}) {
    cases.push_back({64, 2304, 768, no, yes, d, d, d, 1.0f, 0.0f});
    cases.push_back({1, 1, 1, no, no, d, d, d, 1.0f, 0.0f});
    cases.push_back({1, 1, 1, yes, yes, d, d, d, 2.0f, 1.0f});
    // k = 0: c = beta · c without cuBLASLt.
    cases.push_back({5, 7, 0, no, no, d, d, d, 1.0f, 0.5f});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, GemmGpuTest, ::testing::ValuesIn(GemmCases()),
                         [](const auto& info) { return GemmName(info.param); });

TEST(GemmGpuTest, RepeatedCallsAreBitwiseIdentical) {
  ZT_SKIP_WITHOUT_GPU();
  constexpr int64_t m = 256, n = 768, k = 3072;
  Stored a_host(RandomVector(m * k, 4), DType::kBF16);
  Stored b_host(RandomVector(n * k, 5), DType::kBF16);
  Stored c_host(m * n, DType::kBF16);
  DeviceBuffer a_mem, b_mem, c_mem;
  const Tensor ga = ToDevice(a_host.View({m, k}), a_mem);
  const Tensor gb = ToDevice(b_host.View({n, k}), b_mem);
  const Tensor gc = ToDevice(c_host.View({m, n}), c_mem);
  GpuStream stream;
  const GemmShape shape = {.m = m,
                           .n = n,
                           .k = k,
                           .trans_b = Transpose::kYes,
                           .a_dtype = DType::kBF16,
                           .b_dtype = DType::kBF16,
                           .c_dtype = DType::kBF16};
  const GpuOwned gpu(stream, GemmWorkspaceBytes(gpu_test::CudaContext(stream), shape).value());
  const GemmArgs args = {.trans_b = Transpose::kYes};
  ASSERT_TRUE(Gemm(gpu.ctx(), ga, gb, gc, args).ok());
  const std::vector<uint8_t> first = ToHostBytes(gc);
  ASSERT_TRUE(Gemm(gpu.ctx(), ga, gb, gc, args).ok());
  EXPECT_EQ(ToHostBytes(gc), first);
}

TEST(GemmGpuTest, AllowTf32StaysWithinTf32sError) {
  ZT_SKIP_WITHOUT_GPU();
  constexpr int64_t m = 64, n = 2304, k = 768;
  Stored a_host(RandomVector(m * k, 6), DType::kF32);
  Stored b_host(RandomVector(n * k, 7), DType::kF32);
  Stored c_host(m * n, DType::kF32);
  const Tensor a = a_host.View({m, k}), b = b_host.View({n, k}), out = c_host.View({m, n});
  DeviceBuffer a_mem, b_mem, c_mem;
  const Tensor ga = ToDevice(a, a_mem), gb = ToDevice(b, b_mem), gc = ToDevice(out, c_mem);
  const GemmShape shape = {.m = m, .n = n, .k = k, .trans_b = Transpose::kYes};
  const GemmArgs args = {.trans_b = Transpose::kYes};
  const CpuOwned cpu(GemmWorkspaceBytes(CpuContext(2), shape).value());
  ASSERT_TRUE(Gemm(cpu.ctx(), a, b, out, args).ok());
  GpuStream stream;
  GpuOwned gpu(stream, GemmWorkspaceBytes(gpu_test::CudaContext(stream), shape).value());
  DeviceContext ctx = gpu.ctx();
  ctx.allow_tf32 = true;
  ASSERT_TRUE(Gemm(ctx, ga, gb, gc, args).ok());
  ASSERT_EQ(stream.Sync(), cudaSuccess);
  // TF32 keeps 10 fraction bits: each input is off by up to 2⁻¹¹ (relative), so each product
  // by up to 2⁻¹⁰ ≈ 1e-3; errors of random sign partly cancel in the sums, so the normalized
  // error stays under ~1e-3 (typically a few 1e-4). Bound 3e-3; f32 proper is held to 1e-5.
  EXPECT_LT(NormalizedError(ToHostFloats(gc), HostFloats(out)), 3e-3);
}

// ---- LinearForward / LinearBackward -----------------------------------------------------------

struct LinearCase {
  int64_t m, k, n;
  LinearDTypes dtypes;
  DType bias;  // kI32: no bias
  Accumulate dinp_mode;
  bool with_dinp;
};

std::string LinearName(const LinearCase& c) {
  return std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n) + "_" +
         DTypeName(c.dtypes.inp) + "_w" + DTypeName(c.dtypes.weight) + "_dw" +
         DTypeName(c.dtypes.dweight) + "_bias" +
         (c.bias == DType::kI32 ? std::string("none") : DTypeName(c.bias)) +
         (c.with_dinp ? (c.dinp_mode == Accumulate::kAdd ? "_dinpadd" : "_dinp") : "_nodinp");
}

class LinearGpuTest : public ::testing::TestWithParam<LinearCase> {};

// `op` on the CPU with `cpu_args`, then on the GPU with `gpu_args`, each context with the
// workspace the memory plan would give this layer; waits for the GPU.
template <typename Args>
void RunOnBoth(const LinearCase& c, absl::Status (*op)(const DeviceContext&, const Args&),
               const Args& cpu_args, const Args& gpu_args) {
  const CpuOwned cpu(LinearWorkspaceBytes(CpuContext(2), c.m, c.k, c.n, c.dtypes).value());
  ASSERT_TRUE(op(cpu.ctx(), cpu_args).ok());
  GpuStream stream;
  const GpuOwned gpu(
      stream, LinearWorkspaceBytes(gpu_test::CudaContext(stream), c.m, c.k, c.n, c.dtypes).value());
  const absl::Status s = op(gpu.ctx(), gpu_args);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(stream.Sync(), cudaSuccess);
}

TEST_P(LinearGpuTest, ForwardMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const LinearCase c = GetParam();
  const bool has_bias = c.bias != DType::kI32;
  Stored inp(RandomVector(c.m * c.k, 6), c.dtypes.inp);
  Stored weight(RandomVector(c.n * c.k, 7), c.dtypes.weight);
  Stored bias(RandomVector(c.n, 8), has_bias ? c.bias : DType::kF32);
  Stored out(c.m * c.n, c.dtypes.out);
  LinearForwardArgs args{.inp = inp.View({c.m, c.k}),
                         .weight = weight.View({c.n, c.k}),
                         .bias = has_bias ? bias.View({c.n}) : Tensor(),
                         .out = out.View({c.m, c.n})};
  DeviceBuffer mem[4];
  LinearForwardArgs gargs{.inp = ToDevice(args.inp, mem[0]),
                          .weight = ToDevice(args.weight, mem[1]),
                          .bias = ToDevice(args.bias, mem[2]),
                          .out = ToDevice(args.out, mem[3])};
  RunOnBoth(c, LinearForward, args, gargs);
  if (HasFatalFailure()) return;
  EXPECT_LT(NormalizedError(ToHostFloats(gargs.out), HostFloats(args.out)), Bound(c.dtypes.out));
}

TEST_P(LinearGpuTest, BackwardMatchesTheCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const LinearCase c = GetParam();
  const bool has_bias = c.bias != DType::kI32;
  Stored dout(RandomVector(c.m * c.n, 9), c.dtypes.dout);
  Stored inp(RandomVector(c.m * c.k, 10), c.dtypes.inp);
  Stored weight(RandomVector(c.n * c.k, 11), c.dtypes.weight);
  // Non-zero starting values: dweight and dbias are +=, dinp += in kAdd mode.
  Stored dinp(RandomVector(c.m * c.k, 12), c.dtypes.dinp);
  Stored dweight(RandomVector(c.n * c.k, 13), c.dtypes.dweight);
  Stored dbias(RandomVector(c.n, 14), has_bias ? c.bias : DType::kF32);
  LinearBackwardArgs args{.dout = dout.View({c.m, c.n}),
                          .inp = inp.View({c.m, c.k}),
                          .weight = weight.View({c.n, c.k}),
                          .dinp = c.with_dinp ? dinp.View({c.m, c.k}) : Tensor(),
                          .dweight = dweight.View({c.n, c.k}),
                          .dbias = has_bias ? dbias.View({c.n}) : Tensor(),
                          .dinp_mode = c.dinp_mode};
  DeviceBuffer mem[6];
  LinearBackwardArgs gargs = args;
  gargs.dout = ToDevice(args.dout, mem[0]);
  gargs.inp = ToDevice(args.inp, mem[1]);
  gargs.weight = ToDevice(args.weight, mem[2]);
  gargs.dinp = ToDevice(args.dinp, mem[3]);
  gargs.dweight = ToDevice(args.dweight, mem[4]);
  gargs.dbias = ToDevice(args.dbias, mem[5]);
  RunOnBoth(c, LinearBackward, args, gargs);
  if (HasFatalFailure()) return;
  if (c.with_dinp) {
    EXPECT_LT(NormalizedError(ToHostFloats(gargs.dinp), HostFloats(args.dinp)),
              Bound(c.dtypes.dinp))
        << "dinp";
  }
  EXPECT_LT(NormalizedError(ToHostFloats(gargs.dweight), HostFloats(args.dweight)),
            Bound(c.dtypes.dweight))
      << "dweight";
  if (has_bias) {
    // Both sum the column in f64 and round once (to f32, then the += in f32): they differ
    // only where the f64 order flips an f32 rounding, ~2⁻²⁴ in rare elements; the 16-bit
    // bounds are those of the file comment.
    EXPECT_LT(NormalizedError(ToHostFloats(gargs.dbias), HostFloats(args.dbias)),
              c.bias == DType::kF32 ? 1e-6 : Bound(c.bias))
        << "dbias";
  }
}

std::vector<LinearCase> LinearCases() {
  constexpr DType f32 = DType::kF32, bf16 = DType::kBF16, f16 = DType::kF16, none = DType::kI32;
  const LinearDTypes all32 = {};
  const LinearDTypes mixed_bf16 = LinearDTypes::ForPrecision(bf16, bf16, f32);
  const LinearDTypes all_f16 = LinearDTypes::ForPrecision(f16, f16, f16);
  // bf16 activations against f32 weights: the widened path.
  const LinearDTypes bf16_f32_weights = LinearDTypes::ForPrecision(bf16, f32, f32);
  std::vector<LinearCase> cases;
  for (auto [m, k, n] :
       {std::tuple<int64_t, int64_t, int64_t>{64, 768, 2304}, {1, 1, 1}, {37, 129, 65}}) {
    cases.push_back({m, k, n, all32, f32, Accumulate::kOverwrite, true});
    cases.push_back({m, k, n, all32, none, Accumulate::kAdd, true});
    cases.push_back({m, k, n, mixed_bf16, bf16, Accumulate::kOverwrite, true});
    cases.push_back({m, k, n, mixed_bf16, f32, Accumulate::kAdd, true});  // bias seeded
    cases.push_back({m, k, n, all_f16, f16, Accumulate::kAdd, true});
    cases.push_back({m, k, n, bf16_f32_weights, bf16, Accumulate::kOverwrite, false});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, LinearGpuTest, ::testing::ValuesIn(LinearCases()),
                         [](const auto& info) { return LinearName(info.param); });

// ---- Without a GPU: workspace sizing and checks that come before any CUDA call ----------------

DeviceContext BareCudaContext() {
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  return ctx;
}

TEST(GemmGpuTest, WorkspaceIsCublasLtsPlusTheWidenedCopies) {
  const DeviceContext ctx = BareCudaContext();
  constexpr int64_t kLt = int64_t{32} << 20;
  const GemmShape direct = {.m = 64,
                            .n = 2304,
                            .k = 768,
                            .trans_b = Transpose::kYes,
                            .a_dtype = DType::kBF16,
                            .b_dtype = DType::kBF16,
                            .c_dtype = DType::kBF16};
  EXPECT_EQ(GemmWorkspaceBytes(ctx, direct).value(), kLt);
  GemmShape to_f32 = direct;
  to_f32.c_dtype = DType::kF32;
  EXPECT_EQ(GemmWorkspaceBytes(ctx, to_f32).value(), kLt);
  // bf16 · f32: a widened to f32 (64 · 768 · 4 bytes, a multiple of 256).
  GemmShape mixed = direct;
  mixed.b_dtype = DType::kF32;
  mixed.c_dtype = DType::kF32;
  EXPECT_EQ(GemmWorkspaceBytes(ctx, mixed).value(), kLt + 64 * 768 * 4);
  // f32 · f32 → bf16: the f32 result in scratch, rounded into c.
  GemmShape narrow = {.m = 3, .n = 5, .k = 7};
  narrow.c_dtype = DType::kBF16;
  EXPECT_EQ(GemmWorkspaceBytes(ctx, narrow).value(), kLt + 256);
  EXPECT_EQ(GemmWorkspaceBytes(ctx, {.m = 0, .n = 5, .k = 7}).value(), 0);
  EXPECT_EQ(LinearWorkspaceBytes(ctx, 16384, 768, 50304).value(), kLt);
}

TEST(GemmGpuTest, BiasGradientPartialsNeedTheirWorkspace) {
  // K = 0: no GEMM runs, but dbias still sums dout's columns, in f64 partials in the workspace.
  const DeviceContext ctx = BareCudaContext();
  EXPECT_EQ(LinearWorkspaceBytes(ctx, 4, 0, 3).value(), 3 * 8);
  EXPECT_EQ(LinearWorkspaceBytes(ctx, 16384, 0, 768).value(), 32 * 768 * 8);  // 512-row chunks
  std::vector<float> buf(64, 0.0f);
  const Device gpu = gpu_test::Gpu0();
  const absl::Status s =
      LinearBackward(ctx, {.dout = Tensor(buf.data(), DType::kF32, {4, 3}, gpu),
                           .inp = Tensor(buf.data(), DType::kF32, {4, 0}, gpu),
                           .weight = Tensor(buf.data(), DType::kF32, {3, 0}, gpu),
                           .dweight = Tensor(buf.data(), DType::kF32, {3, 0}, gpu),
                           .dbias = Tensor(buf.data(), DType::kF32, {3}, gpu)});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("needs 24 workspace bytes"), std::string_view::npos) << s;
}

TEST(GemmGpuTest, TooSmallWorkspaceIsFailedPreconditionNamingBothSizes) {
  std::vector<float> buf(64, 0.0f);
  const Tensor a(buf.data(), DType::kF32, {4, 4}, gpu_test::Gpu0());
  const absl::Status s = Gemm(BareCudaContext(), a, a, a, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(std::to_string(int64_t{32} << 20)), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("context has 0"), std::string_view::npos) << s;
}

TEST(GemmGpuTest, RefusesATensorOnAnotherDevice) {
  std::vector<float> buf(64, 0.0f);
  const Tensor host(buf.data(), DType::kF32, {4, 4});
  const Tensor gpu(buf.data(), DType::kF32, {4, 4}, gpu_test::Gpu0());
  const absl::Status s = Gemm(BareCudaContext(), gpu, host, gpu, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("b is on cpu:0"), std::string_view::npos) << s;
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
