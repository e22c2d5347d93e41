// Adafactor on the GPU against the CPU op (kernels/adafactor.h) on the same inputs, several
// steps in a row: factored (matrix) and full (vector) second moments, relative step with
// parameter scaling and an explicit lr without, a first moment and weight decay, gradients in
// f32/bf16/f16 and every master storage; a sharded update by two ranks against the unsharded
// CPU update; two tensor-parallel parts (split by rows with a replicated block of rows that one
// part leaves uncounted, or by columns) against the CPU op's same two parts; the workspace
// check.
#if ZT_HAVE_CUDA

#include "kernels/adafactor.h"

#include <algorithm>
#include <barrier>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/status_macros.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kernels/master_twin.h"
#include "tests/gpu/kernels/twin.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::GpuStream;
using gpu_test::MasterMode;
using gpu_test::MasterTwin;
using gpu_test::NormalizedError;
using gpu_test::Twin;
using testing::RandomVector;

// The sums (Σ param², row and column sums of g², Σ U², Σ R) are double on both sides and
// differ only in order, ~1e-16 relative, which reaches the f32 statistics and the update's
// scale only as a rare last-bit flip of an f32 rounding; every per-element expression is the
// CPU's f32 one, up to where the compilers fuse a multiply-add. So the f32 states, m and the
// master differ by a few f32 ulps after kSteps steps: 1e-6 in norm. 16-bit copies:
// gpu_test::CopyBound.
constexpr double kF32Bound = 1e-6;
constexpr int kSteps = 5;

struct Case {
  int64_t rows, cols;  // rows 0: a vector of cols elements
  bool relative;       // relative_step + scale_parameter, else lr with neither
  DType grad;
  MasterMode master;
};

std::string Name(const Case& c) {
  return (c.rows > 0 ? "matrix" + std::to_string(c.rows) + "x" + std::to_string(c.cols)
                     : "vector" + std::to_string(c.cols)) +
         (c.relative ? "_relative_" : "_lr_") + DTypeName(c.grad) + "_" +
         gpu_test::MasterModeName(c.master);
}

class AdafactorGpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(AdafactorGpuTest, MatchesTheCpuOpOverSteps) {
  ZT_SKIP_WITHOUT_GPU();
  const Case k = GetParam();
  const bool factored = k.rows > 0;
  const int64_t n = factored ? k.rows * k.cols : k.cols;
  MasterTwin p(k.master, RandomVector(n, 1));
  Twin row = factored ? Twin::Floats(std::vector<float>(k.rows), DType::kF32, {k.rows}) : Twin();
  Twin col = factored ? Twin::Floats(std::vector<float>(k.cols), DType::kF32, {k.cols}) : Twin();
  Twin full = factored ? Twin() : Twin::Floats(std::vector<float>(n), DType::kF32, {n});
  // A first moment with the explicit lr, none with the relative step (Hugging Face's two
  // usual configurations).
  Twin m = k.relative ? Twin() : Twin::Floats(std::vector<float>(n), DType::kF32, {n});
  GpuStream stream;
  DeviceBuffer workspace(AdafactorWorkspaceBytes(DeviceKind::kCuda, k.rows));
  for (int step = 1; step <= kSteps; ++step) {
    // A matrix's param and grad are (rows, cols): reshape the flat twins' views.
    Twin grad = Twin::Floats(RandomVector(n, 400 + step, -2.0f, 2.0f), k.grad, {n});
    AdafactorArgs args{.lr = k.relative ? 0.0f : 1e-2f,
                       .beta1 = k.relative ? 0.0f : 0.9f,
                       .relative_step = k.relative,
                       .scale_parameter = k.relative,
                       .weight_decay = 0.1f,
                       .step = step,
                       .grad_scale = 0.5f,
                       .stochastic_rounding = p.stochastic(),
                       .seed = 66u + step};
    for (bool gpu : {false, true}) {
      auto shaped = [&](const Tensor& x) {
        return factored && !x.empty() ? x.Reshape({k.rows, k.cols}) : x;
      };
      args.param = shaped(p.param.on(gpu));
      args.param_copy = shaped(p.copy.on(gpu));
      args.grad = shaped(grad.on(gpu));
      args.row_state = row.on(gpu);
      args.col_state = col.on(gpu);
      args.full_state = full.on(gpu);
      args.m = m.on(gpu);
      const DeviceContext ctx =
          gpu ? gpu_test::CudaContext(stream, workspace.AsWorkspace()) : CpuContext(1);
      const absl::Status s = AdafactorUpdate(ctx, args);
      ASSERT_TRUE(s.ok()) << s;
    }
    ASSERT_EQ(stream.Sync(), cudaSuccess);
  }
  gpu_test::ExpectSameMaster(p, kF32Bound);
  if (factored) {
    EXPECT_LT(NormalizedError(row.GpuFloats(), row.CpuFloats()), kF32Bound);
    EXPECT_LT(NormalizedError(col.GpuFloats(), col.CpuFloats()), kF32Bound);
  } else {
    EXPECT_LT(NormalizedError(full.GpuFloats(), full.CpuFloats()), kF32Bound);
  }
  if (!k.relative) EXPECT_LT(NormalizedError(m.GpuFloats(), m.CpuFloats()), kF32Bound);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  // 37 × 300 and 300 × 37: rows and columns each fewer and more than a block's threads;
  // 257 × 1000 (> 256 sum blocks' worth of rows); a vector with a partial last block.
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 300}, {300, 37}, {257, 1000}, {0, 100003}}) {
    for (bool relative : {true, false})
      cases.push_back({rows, cols, relative, DType::kF32, MasterMode::kF32});
  }
  for (DType g : {DType::kBF16, DType::kF16}) {
    for (MasterMode m : gpu_test::AllMasterModes()) {
      cases.push_back({64, 768, false, g, m});
      cases.push_back({0, 5000, true, g, m});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(All, AdafactorGpuTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

// The tensors of an unsharded matrix update of 4 × 8 over host memory tagged as the GPU's.
struct HostArgs {
  std::vector<float> p = std::vector<float>(32), r = std::vector<float>(4),
                     c = std::vector<float>(8);
  AdafactorArgs args;
  explicit HostArgs(Device d) {
    args.param = Tensor(p.data(), DType::kF32, {4, 8}, d);
    args.grad = Tensor(p.data(), DType::kF32, {4, 8}, d);
    args.row_state = Tensor(r.data(), DType::kF32, {4}, d);
    args.col_state = Tensor(c.data(), DType::kF32, {8}, d);
  }
};

TEST(AdafactorGpuTest, RefusesASmallWorkspace) {
  // Runs without a GPU: the workspace is checked before any CUDA call.
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  HostArgs h(ctx.device);
  const absl::Status s = AdafactorUpdate(ctx, h.args);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("AdafactorWorkspaceBytes"), std::string_view::npos) << s;
  EXPECT_EQ(AdafactorWorkspaceBytes(DeviceKind::kCpu, 4), 0);
}

TEST(AdafactorGpuTest, ShardedRefusesASmallWorkspace) {
  // Runs without a GPU: the workspace is checked before any CUDA call or callback.
  DeviceContext ctx;
  ctx.device = gpu_test::Gpu0();
  HostArgs h(ctx.device);
  std::vector<float> scratch(16);
  h.args.param = Tensor(h.p.data(), DType::kF32, {32}, ctx.device);
  h.args.grad = h.args.param;
  h.args.reduce_scratch = Tensor(scratch.data(), DType::kF32, {16}, ctx.device);
  bool called = false;
  h.args.shard = AdafactorArgs::Shard{
      .rows = 4, .cols = 8, .begin = 0, .end = 32, .sum_across_shards = [&](float*, int64_t) {
        called = true;
        return absl::OkStatus();
      }};
  const absl::Status s = AdafactorUpdate(ctx, h.args);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(called);
}

// A shard group of two ranks on one GPU, one thread and stream each: the callback waits for
// its rank's stream, and the two ranks add their device sums on the host in rank order.
class TwoRankGroup {
 public:
  absl::Status Sum(int rank, const GpuStream& stream, float* data, int64_t n) {
    if (stream.Sync() != cudaSuccess) return absl::InternalError("stream failed");
    host_[rank].resize(static_cast<size_t>(n));
    cudaMemcpy(host_[rank].data(), data, n * sizeof(float), cudaMemcpyDeviceToHost);
    sync_.arrive_and_wait();
    std::vector<float> total(static_cast<size_t>(n));
    for (size_t i = 0; i < total.size(); ++i) total[i] = host_[0][i] + host_[1][i];
    sync_.arrive_and_wait();  // both have read before either rank's next call overwrites
    // On the rank's stream, waited for: the op's next kernels read it in stream order, and
    // `total` dies here.
    cudaMemcpyAsync(data, total.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream.get());
    if (stream.Sync() != cudaSuccess) return absl::InternalError("copy back failed");
    return absl::OkStatus();
  }

 private:
  std::barrier<> sync_{2};
  std::vector<float> host_[2];
};

struct ShardCase {
  int64_t rows, cols;  // rows 0: a vector of cols elements
  MasterMode master;
};

class AdafactorShardGpuTest : public ::testing::TestWithParam<ShardCase> {};

// Two ranks splitting the tensor mid-row against the CPU's unsharded update of the whole
// tensor: the sharded path adds its partial sums as f32, so its statistics and scales are the
// unsharded ones to within one f32 rounding of each sum (kernels/adafactor.h), a few ulps of
// the states and the master after kSteps steps: kF32Bound, and CopyBound for the copies (the
// stochastic one's counters are whole-tensor indices on both sides).
TEST_P(AdafactorShardGpuTest, TwoRanksMatchTheUnshardedCpuOp) {
  ZT_SKIP_WITHOUT_GPU();
  const ShardCase k = GetParam();
  const bool factored = k.rows > 0;
  const int64_t n = factored ? k.rows * k.cols : k.cols;
  const int64_t cut[3] = {0, n * 2 / 5, n};
  MasterTwin p(k.master, RandomVector(n, 7));
  Twin m = Twin::Floats(std::vector<float>(n), DType::kF32, {n});
  Twin full = factored ? Twin() : Twin::Floats(std::vector<float>(n), DType::kF32, {n});
  Twin cpu_row =
      factored ? Twin::Floats(std::vector<float>(k.rows), DType::kF32, {k.rows}) : Twin();
  Twin cpu_col =
      factored ? Twin::Floats(std::vector<float>(k.cols), DType::kF32, {k.cols}) : Twin();
  std::vector<Twin> row, col;  // each rank's replica
  for (int r = 0; r < 2; ++r) {
    row.push_back(factored ? Twin::Floats(std::vector<float>(k.rows), DType::kF32, {k.rows})
                           : Twin());
    col.push_back(factored ? Twin::Floats(std::vector<float>(k.cols), DType::kF32, {k.cols})
                           : Twin());
  }
  std::vector<Twin> grads;
  for (int step = 1; step <= kSteps; ++step) {
    grads.push_back(Twin::Floats(RandomVector(n, 500 + step, -2.0f, 2.0f), DType::kF32, {n}));
  }
  const auto base_args = [&](int step) {
    return AdafactorArgs{.lr = 1e-2f,
                         .beta1 = 0.9f,
                         .relative_step = false,
                         .scale_parameter = true,
                         .weight_decay = 0.1f,
                         .step = step,
                         .grad_scale = 0.5f,
                         .stochastic_rounding = p.stochastic(),
                         .seed = 88u + step};
  };
  // The CPU's unsharded run.
  const auto shaped = [&](const Tensor& x) {
    return factored && !x.empty() ? x.Reshape({k.rows, k.cols}) : x;
  };
  for (int step = 1; step <= kSteps; ++step) {
    AdafactorArgs a = base_args(step);
    a.param = shaped(p.param.cpu());
    a.param_copy = shaped(p.copy.cpu());
    a.grad = shaped(grads[step - 1].cpu());
    a.row_state = cpu_row.cpu();
    a.col_state = cpu_col.cpu();
    a.full_state = full.cpu();
    a.m = m.cpu();
    const absl::Status s = AdafactorUpdate(CpuContext(1), a);
    ASSERT_TRUE(s.ok()) << s;
  }
  // The GPU's two ranks.
  TwoRankGroup group;
  std::vector<absl::Status> results(2);
  const auto rank = [&](int r) {
    GpuStream stream;
    DeviceBuffer workspace(AdafactorWorkspaceBytes(DeviceKind::kCuda, k.rows));
    DeviceBuffer scratch((k.rows + k.cols + 2) * static_cast<int64_t>(sizeof(float)));
    const int64_t b = cut[r], e = cut[r + 1];
    for (int step = 1; step <= kSteps && results[r].ok(); ++step) {
      AdafactorArgs a = base_args(step);
      a.param = p.param.gpu().Slice(b, e);
      a.param_copy = p.copy.gpu().empty() ? Tensor() : p.copy.gpu().Slice(b, e);
      a.grad = grads[step - 1].gpu().Slice(b, e);
      a.row_state = row[r].gpu();
      a.col_state = col[r].gpu();
      a.full_state = factored ? Tensor() : full.gpu().Slice(b, e);
      a.m = m.gpu().Slice(b, e);
      a.reduce_scratch =
          Tensor(scratch.data(), DType::kF32, {k.rows + k.cols + 2}, gpu_test::Gpu0());
      a.shard = AdafactorArgs::Shard{.rows = k.rows,
                                     .cols = k.cols,
                                     .begin = b,
                                     .end = e,
                                     .sum_across_shards = [&, r](float* data, int64_t count) {
                                       return group.Sum(r, stream, data, count);
                                     }};
      results[r] = AdafactorUpdate(gpu_test::CudaContext(stream, workspace.AsWorkspace()), a);
    }
    if (results[r].ok() && stream.Sync() != cudaSuccess) results[r] = absl::InternalError("sync");
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  gpu_test::ExpectSameMaster(p, kF32Bound);
  EXPECT_LT(NormalizedError(m.GpuFloats(), m.CpuFloats()), kF32Bound);
  if (factored) {
    for (int r = 0; r < 2; ++r) {
      EXPECT_LT(NormalizedError(row[r].GpuFloats(), cpu_row.CpuFloats()), kF32Bound) << r;
      EXPECT_LT(NormalizedError(col[r].GpuFloats(), cpu_col.CpuFloats()), kF32Bound) << r;
    }
  } else {
    EXPECT_LT(NormalizedError(full.GpuFloats(), full.CpuFloats()), kF32Bound);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AdafactorShardGpuTest,
                         ::testing::Values(ShardCase{37, 300, MasterMode::kF32},
                                           ShardCase{257, 1000, MasterMode::kBf16Stochastic},
                                           ShardCase{0, 100003, MasterMode::kF32},
                                           ShardCase{0, 5000, MasterMode::kSplit}),
                         [](const auto& info) {
                           return (info.param.rows > 0 ? "matrix" : "vector") +
                                  std::to_string(info.param.rows > 0 ? info.param.rows
                                                                     : info.param.cols) +
                                  "_" + gpu_test::MasterModeName(info.param.master);
                         });

// The CPU twin of TwoRankGroup: two threads add their host sums in rank order.
class HostTwoRankGroup {
 public:
  absl::Status Sum(int rank, float* data, int64_t n) {
    host_[rank].assign(data, data + n);
    sync_.arrive_and_wait();
    for (int64_t i = 0; i < n; ++i) data[i] = host_[0][i] + host_[1][i];
    sync_.arrive_and_wait();  // both have read before either rank's next call overwrites
    return absl::OkStatus();
  }

 private:
  std::barrier<> sync_{2};
  std::vector<float> host_[2];
};

enum class PartSplit { kRows, kCols };

// Two tensor-parallel parts of a logical 2a + k by kCols matrix, as a column-parallel weight
// with a replicated KV head splits it (kRows: each part holds its a rows and the same k
// shared rows after them, which part 1 leaves uncounted) or a row-parallel one (kCols: 300
// and kCols − 300 columns). Each part steps as its rank does (AdafactorArgs::Shard's
// logical_rows / logical_cols), the group's sums routed as worker/optim/optimizer.cc routes
// them: the CUDA op against the CPU op on the same parts, state by state.
class AdafactorTensorParallelGpuTest : public ::testing::TestWithParam<PartSplit> {};

TEST_P(AdafactorTensorParallelGpuTest, TwoPartsMatchTheCpuOpsTwoParts) {
  ZT_SKIP_WITHOUT_GPU();
  const bool by_rows = GetParam() == PartSplit::kRows;
  constexpr int64_t a = 29, k = 6, kCols = 517;
  const int64_t logical_rows = 2 * a + k;
  struct Part {
    int64_t rows, cols;
    Twin param, m, row, col;
    std::vector<Twin> grads;
  };
  std::vector<Part> parts;
  for (int r = 0; r < 2; ++r) {
    const int64_t rows = by_rows ? a + k : logical_rows;
    const int64_t cols = by_rows ? kCols : (r == 0 ? 300 : kCols - 300);
    const int64_t n = rows * cols;
    // The shared rows (kRows) start equal and see equal gradients on both parts.
    auto values = [&](uint64_t seed, float lo, float hi) {
      std::vector<float> v = RandomVector(n, seed + 10 * r, lo, hi);
      if (by_rows) {
        const std::vector<float> shared = RandomVector(k * cols, seed + 1000, lo, hi);
        std::copy(shared.begin(), shared.end(), v.begin() + a * cols);
      }
      return v;
    };
    Part p{.rows = rows,
           .cols = cols,
           .param = Twin::Floats(values(7, -1.0f, 1.0f), DType::kF32, {n}),
           .m = Twin::Floats(std::vector<float>(n), DType::kF32, {n}),
           .row = Twin::Floats(std::vector<float>(rows), DType::kF32, {rows}),
           .col = Twin::Floats(std::vector<float>(cols), DType::kF32, {cols})};
    for (int step = 1; step <= kSteps; ++step) {
      p.grads.push_back(Twin::Floats(values(500 + step, -2.0f, 2.0f), DType::kF32, {n}));
    }
    parts.push_back(std::move(p));
  }
  const auto args_of = [&](int r, int step, bool gpu, float* scratch,
                           std::function<absl::Status(float*, int64_t)> sum) {
    Part& p = parts[r];
    const int64_t rows = p.rows, cols = p.cols;
    AdafactorArgs args{.param = gpu ? p.param.gpu() : p.param.cpu(),
                       .grad = gpu ? p.grads[step - 1].gpu() : p.grads[step - 1].cpu(),
                       .row_state = gpu ? p.row.gpu() : p.row.cpu(),
                       .col_state = gpu ? p.col.gpu() : p.col.cpu(),
                       .m = gpu ? p.m.gpu() : p.m.cpu(),
                       .lr = 1e-2f,
                       .beta1 = 0.9f,
                       .relative_step = false,
                       .scale_parameter = true,
                       .weight_decay = 0.1f,
                       .step = step,
                       .grad_scale = 0.5f};
    args.reduce_scratch =
        Tensor(scratch, DType::kF32, {rows + cols + 2}, gpu ? gpu_test::Gpu0() : Device{});
    args.shard =
        AdafactorArgs::Shard{.rows = rows,
                             .cols = cols,
                             .begin = 0,
                             .end = rows * cols,
                             .sum_across_shards = [=](float* data, int64_t n) -> absl::Status {
                               if (n != rows + cols + 1) return sum(data, n);
                               if (by_rows)
                                 return sum(data + rows, cols + 1);  // column sums, Σ param²
                               ZT_RETURN_IF_ERROR(sum(data, rows));  // row sums
                               return sum(data + rows + cols, 1);    // Σ param²
                             },
                             .logical_rows = by_rows ? logical_rows : 0,
                             .logical_cols = by_rows ? 0 : kCols,
                             .sum_row_states = sum};
    if (by_rows && r == 1) args.shard->uncounted_rows = {{a, a + k}};
    return args;
  };
  // The CPU's two parts.
  {
    HostTwoRankGroup group;
    std::vector<absl::Status> results(2);
    const auto rank = [&](int r) {
      std::vector<float> scratch(parts[r].rows + parts[r].cols + 2);
      for (int step = 1; step <= kSteps && results[r].ok(); ++step) {
        results[r] = AdafactorUpdate(CpuContext(1), args_of(r, step, /*gpu=*/false, scratch.data(),
                                                            [&, r](float* data, int64_t n) {
                                                              return group.Sum(r, data, n);
                                                            }));
      }
    };
    std::thread other(rank, 1);
    rank(0);
    other.join();
    ASSERT_TRUE(results[0].ok()) << results[0];
    ASSERT_TRUE(results[1].ok()) << results[1];
  }
  // The GPU's.
  TwoRankGroup group;
  std::vector<absl::Status> results(2);
  const auto rank = [&](int r) {
    GpuStream stream;
    DeviceBuffer workspace(AdafactorWorkspaceBytes(DeviceKind::kCuda, parts[r].rows));
    DeviceBuffer scratch((parts[r].rows + parts[r].cols + 2) * static_cast<int64_t>(sizeof(float)));
    for (int step = 1; step <= kSteps && results[r].ok(); ++step) {
      results[r] = AdafactorUpdate(
          gpu_test::CudaContext(stream, workspace.AsWorkspace()),
          args_of(r, step, /*gpu=*/true, static_cast<float*>(scratch.data()),
                  [&, r](float* data, int64_t n) { return group.Sum(r, stream, data, n); }));
    }
    if (results[r].ok() && stream.Sync() != cudaSuccess) results[r] = absl::InternalError("sync");
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  ASSERT_TRUE(results[0].ok()) << results[0];
  ASSERT_TRUE(results[1].ok()) << results[1];
  // kF32Bound: the same sums in another order, as the sharded case above.
  for (int r = 0; r < 2; ++r) {
    Part& p = parts[r];
    EXPECT_LT(NormalizedError(p.param.GpuFloats(), p.param.CpuFloats()), kF32Bound) << r;
    EXPECT_LT(NormalizedError(p.m.GpuFloats(), p.m.CpuFloats()), kF32Bound) << r;
    EXPECT_LT(NormalizedError(p.row.GpuFloats(), p.row.CpuFloats()), kF32Bound) << r;
    EXPECT_LT(NormalizedError(p.col.GpuFloats(), p.col.CpuFloats()), kF32Bound) << r;
  }
  if (by_rows) {
    // The shared rows were stepped identically on both parts.
    const std::vector<float> p0 = parts[0].param.GpuFloats(), p1 = parts[1].param.GpuFloats();
    EXPECT_TRUE(std::equal(p0.begin() + a * kCols, p0.end(), p1.begin() + a * kCols));
  }
}

INSTANTIATE_TEST_SUITE_P(All, AdafactorTensorParallelGpuTest,
                         ::testing::Values(PartSplit::kRows, PartSplit::kCols),
                         [](const auto& info) {
                           return std::string(info.param == PartSplit::kRows ? "rows" : "cols");
                         });

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
