// kernels/adafactor, sharded (ZeRO): G ranks each hold a contiguous range of a tensor's
// row-major flattening, cut anywhere (mid-row, within one row, empty ranges included), and
// step in lockstep: each rank's AdafactorUpdate runs in its own thread and sums its partial
// statistics through an in-test all-reduce. The reference is the unsharded kernel on the whole
// tensor (itself checked against float64 in adafactor_test.cc): the sharded result must match
// it to within the f32 rounding of the handed-over sums, exactly where those sums are exact,
// with replicated statistics identical on every rank and a stochastic copy drawn from
// whole-tensor indices, and the same bits for any thread count. Also: the fixed sequence of
// sums, callback errors, argument errors.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/adafactor.h"
#include "kernels/elementwise.h"
#include "tests/unit/kernels/mixed_check.h"
#include "tests/unit/kernels/op_check.h"

namespace zt {
namespace {

using testing::MaxErrorOverLargest;
using testing::MaxRelativeError;
using testing::RandomVector;
using testing::SameBits;
using testing::Stored;
using testing::ToDouble;

// A shard group in one process. Sum(rank, ...) blocks until every rank has handed over its
// buffer, then gives each the element-wise sum taken in rank order (so the result does not
// depend on thread timing). A rank that makes a call the others do not make gets
// DeadlineExceeded instead of hanging the test; calls of different sizes get InvalidArgument.
class LockstepGroup {
 public:
  explicit LockstepGroup(int size) : slots_(size), calls_(size) {}

  std::function<absl::Status(float*, int64_t)> SumFor(int rank) {
    return [this, rank](float* data, int64_t n) { return Sum(rank, data, n); };
  }
  // The n of each call of each rank, in order.
  const std::vector<std::vector<int64_t>>& calls() const { return calls_; }

 private:
  absl::Status Sum(int rank, float* data, int64_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    calls_[rank].push_back(n);
    slots_[rank].assign(data, data + n);
    const int64_t round = round_;
    if (++arrived_ == static_cast<int>(slots_.size())) {
      status_ = absl::OkStatus();
      sum_ = slots_[0];
      for (size_t r = 1; r < slots_.size(); ++r) {
        if (slots_[r].size() != sum_.size()) {
          status_ = absl::InvalidArgumentError("ranks summed buffers of different sizes");
          break;
        }
        for (size_t k = 0; k < sum_.size(); ++k) sum_[k] += slots_[r][k];
      }
      arrived_ = 0;
      ++round_;
      done_.notify_all();
    } else if (!done_.wait_for(lock, std::chrono::seconds(10), [&] { return round_ != round; })) {
      return absl::DeadlineExceededError("the other ranks never made this sum");
    }
    if (!status_.ok()) return status_;
    std::copy(sum_.begin(), sum_.end(), data);
    return absl::OkStatus();
  }

  std::mutex mu_;
  std::condition_variable done_;
  std::vector<std::vector<float>> slots_;
  std::vector<std::vector<int64_t>> calls_;
  std::vector<float> sum_;
  absl::Status status_;
  int arrived_ = 0;
  int64_t round_ = 0;
};

Tensor Flat(std::vector<float>& v) {
  return Tensor(v.data(), DType::kF32, {static_cast<int64_t>(v.size())});
}
Tensor FlatOrEmpty(std::vector<float>& v) { return v.empty() ? Tensor() : Flat(v); }

constexpr int kSteps = 3;

// One problem: the whole tensor (rows 0: a vector of cols), its hyperparameters and storage.
struct ShardProblem {
  int64_t rows = 0, cols = 0;
  AdafactorArgs args;  // hyperparameters and copy options; tensors are filled in per call
  bool first_moment = false;
  DType grad_dtype = DType::kF32;
  bool bf16_copy = true;  // a bf16 parameter copy (rounded as args.stochastic_rounding says)
  // The master split into the bf16 copy and i16 low halves (kernels/dtype.h SplitMaster).
  bool split_master = false;
  int threads = 1;        // of each rank's context
  // The whole tensor's gradient at a 1-based step.
  std::function<std::vector<float>(int)> grad;
  int64_t numel() const { return rows > 0 ? rows * cols : cols; }
};

// The whole tensor's buffers after the steps.
struct Outcome {
  std::vector<float> param, m, row, col, full;  // param: an f32 master only
  Stored copy{0, DType::kBF16};
  std::vector<int16_t> low;  // a split master's low halves
};

Outcome Fresh(const ShardProblem& s, int64_t begin, int64_t end, bool whole_statistics) {
  const int64_t n = end - begin;
  const std::vector<float> init = RandomVector(s.numel(), 7);
  Outcome o;
  o.param.assign(init.begin() + begin, init.begin() + end);
  o.m.assign(s.first_moment ? n : 0, 0.0f);
  o.row.assign(s.rows > 0 && whole_statistics ? s.rows : 0, 0.0f);
  o.col.assign(s.rows > 0 && whole_statistics ? s.cols : 0, 0.0f);
  o.full.assign(s.rows > 0 ? 0 : n, 0.0f);
  o.copy = Stored(s.bf16_copy ? n : 0, DType::kBF16);
  if (s.split_master) {
    for (int64_t k = 0; k < n; ++k) {
      const SplitMasterBits b = SplitMaster(o.param[k]);
      o.copy.Set(k, Bf16ToFloat(b.high));
      o.low.push_back(b.low);
    }
  }
  return o;
}

AdafactorArgs ArgsFor(const ShardProblem& s, int step, Outcome& o, Stored& grad) {
  AdafactorArgs a = s.args;
  a.step = step;
  a.param = FlatOrEmpty(o.param);
  if (s.split_master) {
    a.param = o.low.empty() ? Tensor()
                            : Tensor(o.low.data(), DType::kI16, {static_cast<int64_t>(o.low.size())});
  }
  a.grad = grad.size() == 0 ? Tensor() : grad.Flat();
  a.row_state = FlatOrEmpty(o.row);
  a.col_state = FlatOrEmpty(o.col);
  a.full_state = FlatOrEmpty(o.full);
  a.m = FlatOrEmpty(o.m);
  a.param_copy = o.copy.size() == 0 ? Tensor() : o.copy.Flat();
  return a;
}

Outcome RunWhole(const ShardProblem& s) {
  Outcome o = Fresh(s, 0, s.numel(), /*whole_statistics=*/true);
  for (int step = 1; step <= kSteps; ++step) {
    Stored grad(s.grad(step), s.grad_dtype);
    AdafactorArgs a = ArgsFor(s, step, o, grad);
    if (s.rows > 0) {
      a.param = a.param.Reshape({s.rows, s.cols});
      a.grad = a.grad.Reshape({s.rows, s.cols});
    }
    const absl::Status st = AdafactorUpdate(CpuContext(s.threads), a);
    EXPECT_TRUE(st.ok()) << st;
  }
  return o;
}

// The steps on ranks holding [cuts[r], cuts[r + 1]), each in its own thread. A rank with an
// empty range holds no statistics, as worker/plan lays them out. Returns the ranks' buffers
// joined into the whole tensor's, the statistics those of the first rank holding them after
// checking that every other rank's are the same bits; `calls` gets each rank's sums.
Outcome RunSharded(const ShardProblem& s, const std::vector<int64_t>& cuts,
                   std::vector<std::vector<int64_t>>* calls) {
  const int g = static_cast<int>(cuts.size()) - 1;
  LockstepGroup group(g);
  std::vector<Outcome> ranks;
  std::vector<std::vector<float>> scratch;
  for (int r = 0; r < g; ++r) {
    ranks.push_back(Fresh(s, cuts[r], cuts[r + 1], cuts[r] < cuts[r + 1]));
    scratch.emplace_back(s.rows > 0 ? s.rows + s.cols + 2 : 2, 0.0f);
  }
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<float> whole = s.grad(step);
    std::vector<Stored> grads;
    for (int r = 0; r < g; ++r) {
      grads.emplace_back(std::vector<float>(whole.begin() + cuts[r], whole.begin() + cuts[r + 1]),
                         s.grad_dtype);
    }
    std::vector<absl::Status> status(g);
    {
      std::vector<std::jthread> threads;
      for (int r = 0; r < g; ++r) {
        threads.emplace_back([&, r] {
          AdafactorArgs a = ArgsFor(s, step, ranks[r], grads[r]);
          a.shard = AdafactorArgs::Shard{.rows = s.rows,
                                         .cols = s.cols,
                                         .begin = cuts[r],
                                         .end = cuts[r + 1],
                                         .sum_across_shards = group.SumFor(r)};
          a.reduce_scratch = Flat(scratch[r]);
          status[r] = AdafactorUpdate(CpuContext(s.threads), a);
        });
      }
    }
    for (int r = 0; r < g; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
  *calls = group.calls();

  Outcome joined = Fresh(s, 0, 0, /*whole_statistics=*/false);
  joined.copy = Stored(s.bf16_copy ? s.numel() : 0, DType::kBF16);
  for (int r = 0; r < g; ++r) {
    const Outcome& o = ranks[r];
    joined.param.insert(joined.param.end(), o.param.begin(), o.param.end());
    joined.low.insert(joined.low.end(), o.low.begin(), o.low.end());
    joined.m.insert(joined.m.end(), o.m.begin(), o.m.end());
    joined.full.insert(joined.full.end(), o.full.begin(), o.full.end());
    for (size_t k = 0; k < o.copy.size(); ++k) joined.copy.Set(cuts[r] + k, o.copy.Get(k));
    if (o.row.empty()) continue;
    if (joined.row.empty()) {
      joined.row = o.row;
      joined.col = o.col;
    }
    EXPECT_TRUE(SameBits(o.row, joined.row)) << "rank " << r;
    EXPECT_TRUE(SameBits(o.col, joined.col)) << "rank " << r;
  }
  return joined;
}

// Cuts of n elements into 1 to 4 ranges. For the 37 × 29 matrix (1,073 elements): 537 and 100
// are mid-row, 13 lies within the first row; 3 and 4 ranks include an empty range (in the
// middle, at the end).
std::vector<std::vector<int64_t>> CutsOf(int64_t n) {
  return {{0, n}, {0, n / 2, n}, {0, n / 11, n / 11, n}, {0, 13, n * 5 / 9, n, n}};
}

// The sums each rank makes over the steps: [rows | cols | Σ param²] then Σ U², or two 1s.
std::vector<int64_t> ExpectedCalls(const ShardProblem& s) {
  std::vector<int64_t> calls;
  for (int step = 1; step <= kSteps; ++step) {
    calls.push_back(s.rows > 0 ? s.rows + s.cols + 1 : 1);
    calls.push_back(1);
  }
  return calls;
}

// The stochastic copy is the whole tensor's updated parameter rounded with whole-tensor
// element indices as counters: what CastStochastic gives for the joined parameter.
void ExpectCopyOfWholeIndices(const ShardProblem& s, Outcome& joined) {
  Stored want(joined.param.size(), DType::kBF16);
  ASSERT_TRUE(CastStochastic(CpuContext(1), Flat(joined.param), want.Flat(), s.args.seed).ok());
  EXPECT_TRUE(testing::SameWords(joined.copy, want));
}

// Gradients in [-2, 2] with a zero row and a zero column for a matrix (eps1 keeps them finite).
std::function<std::vector<float>(int)> RandomGrads(int64_t rows, int64_t cols) {
  return [rows, cols](int step) {
    std::vector<float> g = RandomVector(rows > 0 ? rows * cols : cols, 100 + step, -2.0f, 2.0f);
    if (rows > 0) {
      for (int64_t j = 0; j < cols; ++j) g[3 * cols + j] = 0.0f;
      for (int64_t i = 0; i < rows; ++i) g[i * cols + 5] = 0.0f;
    }
    return g;
  };
}

TEST(AdafactorShardTest, MatchesUnshardedUpdate) {
  for (int64_t rows : {int64_t{37}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 29 : 1001;
    for (bool first_moment : {false, true}) {
      for (bool relative : {true, false}) {
        for (float clip_threshold : {0.5f, 100.0f}) {
          ShardProblem s{.rows = rows, .cols = cols, .first_moment = first_moment};
          s.args.relative_step = relative;
          s.args.scale_parameter = relative;
          s.args.lr = relative ? 0.0f : 0.05f;
          s.args.beta1 = first_moment ? 0.9f : 0.0f;
          // RMS(U) ≈ 1 for fresh gradients (adafactor_test.cc): 0.5 clips, 100 never does.
          s.args.clip_threshold = clip_threshold;
          s.args.weight_decay = 0.1f;
          s.args.grad_scale = 0.5f;
          s.args.stochastic_rounding = true;
          s.args.seed = 42;
          s.grad = RandomGrads(rows, cols);
          Outcome whole = RunWhole(s);
          for (const std::vector<int64_t>& cuts : CutsOf(s.numel())) {
            SCOPED_TRACE(::testing::Message()
                         << "rows " << rows << " first_moment " << first_moment << " relative "
                         << relative << " clip " << clip_threshold << " ranks " << cuts.size() - 1);
            std::vector<std::vector<int64_t>> calls;
            Outcome sharded = RunSharded(s, cuts, &calls);
            for (const std::vector<int64_t>& c : calls) EXPECT_EQ(c, ExpectedCalls(s));
            // Each summed statistic is off by the f32 rounding of its partial sums and of the
            // G − 1 additions across ranks (≤ 4 · 2^-24 ≈ 2.4e-7 relative for 4 ranks, the
            // terms all ≥ 0); the states carry that (measured ≤ 1.0e-7), and U, a square root
            // of their ratios, about as much. The param tolerance has SeveralStepsMatchFloat64's
            // form, relative to |param| + 0.1, the size of a step (measured ≤ 1.9e-7).
            EXPECT_LE(MaxRelativeError(sharded.row, ToDouble(whole.row), 1e-37), 1e-6);
            EXPECT_LE(MaxRelativeError(sharded.col, ToDouble(whole.col), 1e-37), 1e-6);
            EXPECT_LE(MaxRelativeError(sharded.full, ToDouble(whole.full), 1e-37), 1e-6);
            EXPECT_LE(MaxRelativeError(sharded.param, ToDouble(whole.param), 0.1), 1e-6);
            // m sums steps of either sign, each off by about U's relative error, so relative
            // to the largest |m| (measured ≤ 1.5e-7).
            EXPECT_LE(MaxErrorOverLargest(sharded.m, ToDouble(whole.m)), 1e-6);
            ExpectCopyOfWholeIndices(s, sharded);
          }
        }
      }
    }
  }
}

// Shards large enough for the kernel's parallel passes (≥ 32,768 elements): the same bits for
// any thread count, since every partial sum has chunk boundaries fixed by the sizes alone.
TEST(AdafactorShardTest, LargeShardsSameBitsForAnyThreadCount) {
  for (int64_t rows : {int64_t{300}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 517 : 100003;
    ShardProblem s{.rows = rows, .cols = cols, .first_moment = true};
    s.args.beta1 = 0.9f;
    s.args.clip_threshold = 0.5f;
    s.args.stochastic_rounding = true;
    s.args.seed = 3;
    s.grad = RandomGrads(rows, cols);
    const int64_t n = s.numel();
    const std::vector<int64_t> cuts = {0, n / 3 + 7, n};  // mid-row for the matrix
    std::vector<std::vector<int64_t>> calls;
    Outcome one = RunSharded(s, cuts, &calls);
    s.threads = 3;
    Outcome three = RunSharded(s, cuts, &calls);
    SCOPED_TRACE(::testing::Message() << "rows " << rows);
    EXPECT_TRUE(SameBits(one.param, three.param));
    EXPECT_TRUE(SameBits(one.m, three.m));
    EXPECT_TRUE(SameBits(one.row, three.row));
    EXPECT_TRUE(SameBits(one.col, three.col));
    EXPECT_TRUE(SameBits(one.full, three.full));
    EXPECT_TRUE(testing::SameWords(one.copy, three.copy));
    // MatchesUnshardedUpdate's tolerances: with 2 ranks the hand-over rounds no more.
    const Outcome whole = RunWhole(s);
    EXPECT_LE(MaxRelativeError(three.row, ToDouble(whole.row), 1e-37), 1e-6);
    EXPECT_LE(MaxRelativeError(three.col, ToDouble(whole.col), 1e-37), 1e-6);
    EXPECT_LE(MaxRelativeError(three.full, ToDouble(whole.full), 1e-37), 1e-6);
    EXPECT_LE(MaxRelativeError(three.param, ToDouble(whole.param), 0.1), 1e-6);
    EXPECT_LE(MaxErrorOverLargest(three.m, ToDouble(whole.m)), 1e-6);
    ExpectCopyOfWholeIndices(s, three);
  }
}

// Gradients k/16, |k| ≤ 32, have squares with few bits, so every partial sum, its f32 hand-over
// and the sums across ranks are exact; without parameter scaling and with clipping inactive,
// nothing else is summed, so a sharded update is the unsharded one bit for bit — the bf16
// stochastic copy included, which needs each element's counter to be its whole-tensor index.
TEST(AdafactorShardTest, BitIdenticalToUnshardedWhenSumsAreExact) {
  for (int64_t rows : {int64_t{37}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 29 : 1001;
    for (DType grad_dtype : {DType::kF32, DType::kBF16}) {
      ShardProblem s{.rows = rows, .cols = cols, .first_moment = true, .grad_dtype = grad_dtype};
      s.args.relative_step = true;
      s.args.scale_parameter = false;
      s.args.beta1 = 0.9f;
      s.args.clip_threshold = 100.0f;
      s.args.stochastic_rounding = true;
      s.args.seed = 7;
      s.grad = [n = s.numel()](int step) {
        std::vector<float> g = RandomVector(n, 200 + step, -32.0f, 32.0f);
        for (float& x : g) x = std::round(x) / 16.0f;
        return g;
      };
      const Outcome whole = RunWhole(s);
      for (const std::vector<int64_t>& cuts : CutsOf(s.numel())) {
        SCOPED_TRACE(::testing::Message() << "rows " << rows << " grad " << DTypeName(grad_dtype)
                                          << " ranks " << cuts.size() - 1);
        std::vector<std::vector<int64_t>> calls;
        const Outcome sharded = RunSharded(s, cuts, &calls);
        EXPECT_TRUE(SameBits(sharded.param, whole.param));
        EXPECT_TRUE(SameBits(sharded.m, whole.m));
        EXPECT_TRUE(SameBits(sharded.row, whole.row));
        EXPECT_TRUE(SameBits(sharded.col, whole.col));
        EXPECT_TRUE(SameBits(sharded.full, whole.full));
        EXPECT_TRUE(testing::SameWords(sharded.copy, whole.copy));
      }
    }
  }
}

// A split master on shards (Σ param² of each shard read through the split) is the f32 master
// the same shards produce, bit for bit, with its high half the master's nearest bf16.
TEST(AdafactorShardTest, SplitMasterMatchesFloat32Master) {
  for (int64_t rows : {int64_t{37}, int64_t{0}}) {
    const int64_t cols = rows > 0 ? 29 : 1001;
    ShardProblem s{.rows = rows, .cols = cols, .first_moment = true, .grad_dtype = DType::kBF16};
    s.args.beta1 = 0.9f;
    s.args.weight_decay = 0.1f;
    s.grad = RandomGrads(rows, cols);
    for (const std::vector<int64_t>& cuts : CutsOf(s.numel())) {
      SCOPED_TRACE(::testing::Message() << "rows " << rows << " ranks " << cuts.size() - 1);
      std::vector<std::vector<int64_t>> calls;
      s.split_master = false;
      const Outcome f32 = RunSharded(s, cuts, &calls);
      s.split_master = true;
      const Outcome split = RunSharded(s, cuts, &calls);
      ASSERT_EQ(split.low.size(), f32.param.size());
      for (size_t k = 0; k < split.low.size(); ++k) {
        const uint16_t high = FloatToBf16(split.copy.Get(k));  // exact: a bf16 value
        ASSERT_EQ(FloatBits(JoinMaster(high, split.low[k])), FloatBits(f32.param[k])) << k;
        ASSERT_EQ(high, SplitMaster(f32.param[k]).high) << k;
      }
      EXPECT_TRUE(SameBits(split.m, f32.m));
      EXPECT_TRUE(SameBits(split.row, f32.row));
    }
  }
}

// An error of the callback comes back with its code, naming the callback and the phase.
TEST(AdafactorShardTest, ReturnsCallbackError) {
  for (int64_t rows : {int64_t{3}, int64_t{0}}) {
    const int64_t cols = 4, n = rows > 0 ? rows * cols : cols;
    std::vector<float> param(n, 0.5f), grad(n, 0.1f), full(rows > 0 ? 0 : n, 0.0f);
    std::vector<float> row(rows, 0.0f), col(rows > 0 ? cols : 0, 0.0f), scratch(rows + cols + 2);
    AdafactorArgs a;
    a.param = Flat(param);
    a.grad = Flat(grad);
    a.row_state = FlatOrEmpty(row);
    a.col_state = FlatOrEmpty(col);
    a.full_state = FlatOrEmpty(full);
    a.reduce_scratch = Flat(scratch);
    int calls = 0;
    a.shard = AdafactorArgs::Shard{.rows = rows,
                                   .cols = cols,
                                   .begin = 0,
                                   .end = n,
                                   .sum_across_shards = [&](float*, int64_t) {
                                     ++calls;
                                     return absl::UnavailableError("peer 2 is gone");
                                   }};
    const absl::Status st = AdafactorUpdate(CpuContext(1), a);
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(st.message().find("sum_across_shards"), std::string::npos) << st;
    EXPECT_NE(st.message().find("peer 2 is gone"), std::string::npos) << st;
    EXPECT_EQ(calls, 1) << "the update must stop at the first failed sum";
  }
}

// Each bad sharded argument is rejected with InvalidArgument naming it, before any sum.
TEST(AdafactorShardTest, RejectsBadShardArguments) {
  const int64_t rows = 6, cols = 4;
  std::vector<float> param(10, 0.5f), grad(10, 0.1f), m(10, 0.0f), row(rows, 0.0f), col(cols, 0.0f),
      scratch(rows + cols + 2, 0.0f), full(10, 0.0f), vscratch(2, 0.0f);
  int calls = 0;
  AdafactorArgs good;
  good.param = Flat(param);
  good.grad = Flat(grad);
  good.row_state = Flat(row);
  good.col_state = Flat(col);
  good.reduce_scratch = Flat(scratch);
  good.shard = AdafactorArgs::Shard{
      .rows = rows, .cols = cols, .begin = 7, .end = 17, .sum_across_shards = [&](float*, int64_t) {
        ++calls;
        return absl::OkStatus();
      }};
  ASSERT_TRUE(AdafactorUpdate(CpuContext(1), good).ok());
  ASSERT_EQ(calls, 2);
  calls = 0;
  const auto expect_error = [&](const AdafactorArgs& args, const std::string& name) {
    const absl::Status st = AdafactorUpdate(CpuContext(1), args);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(st.message().find(name), std::string::npos) << st;
  };

  AdafactorArgs a = good;
  a.shard->sum_across_shards = nullptr;
  expect_error(a, "shard.sum_across_shards is empty");
  a = good;
  a.shard->end = rows * cols + 1;
  a.shard->begin = a.shard->end - 10;
  expect_error(a, "shard range [15, 25) is outside the tensor of 24 elements");
  a = good;
  a.shard->begin = 18;
  expect_error(a, "shard range [18, 17)");
  a = good;
  a.shard->rows = -1;
  expect_error(a, "shard.rows -1");
  a = good;
  a.reduce_scratch = Tensor(scratch.data(), DType::kF32, {rows + cols + 1});
  expect_error(a, "reduce_scratch f32[11] is too small");
  a = good;
  a.reduce_scratch = Tensor();
  expect_error(a, "reduce_scratch");
  a = good;
  a.shard->end = 16;
  expect_error(a, "param");
  a = good;
  a.row_state = Tensor(row.data(), DType::kF32, {rows - 1});
  expect_error(a, "row_state");
  a = good;
  a.col_state = Tensor();
  expect_error(a, "col_state");
  a = good;
  a.full_state = Flat(full);
  expect_error(a, "full_state");
  a = good;
  a.beta1 = 0.9f;
  expect_error(a, "beta1");
  a = good;
  a.m = Tensor(m.data(), DType::kF32, {9});
  expect_error(a, "m ");
  // A rank with an empty range holds no elements of the tensor.
  a = good;
  a.shard->begin = a.shard->end = 24;
  expect_error(a, "param f32[10] has elements, but the shard's range is empty");
  // A sharded vector keeps its full state for the shard's elements, and no row statistics.
  AdafactorArgs v = good;
  v.shard->rows = 0;
  v.shard->cols = 30;
  v.row_state = Tensor();
  v.col_state = Tensor();
  v.full_state = Flat(full);
  v.reduce_scratch = Flat(vscratch);
  ASSERT_TRUE(AdafactorUpdate(CpuContext(1), v).ok());
  a = v;
  a.full_state = Tensor(full.data(), DType::kF32, {9});
  expect_error(a, "full_state");
  a = v;
  a.row_state = Flat(row);
  expect_error(a, "row_state");
  a = v;
  a.reduce_scratch = Tensor(vscratch.data(), DType::kF32, {1});
  expect_error(a, "reduce_scratch f32[1] is too small: a sharded vector needs 2");
  EXPECT_EQ(calls, 2) << "only the good vector update may sum";
}

// Tensor parallelism: a 37 × 29 matrix split by rows (a column-parallel weight's output rows)
// or by columns (a row-parallel weight) into two unequal parts, and a 1001-vector (a split
// bias) into two, each part stepped by its own rank through the shard path with the logical
// shape (Shard::logical_rows/logical_cols). The group sums only what the split cuts, routed as
// worker/optim/optimizer.cc routes them: with the rows split the column sums, Σ param², Σ U² and
// (sum_row_states) Σ R; with the columns split the row sums, Σ param² and Σ U². The joined
// parameters and states are the whole matrix's unsharded update within the f32 rounding of the
// handed-over sums (the bounds of MatchesUnshardedUpdate); without the group's sums the
// clipped, parameter-scaled step of each part would follow its own RMS and statistics.
TEST(AdafactorShardTest, TensorParallelPartsMatchTheLogicalTensor) {
  enum class Split { kRows, kCols, kVector };
  for (const Split split : {Split::kRows, Split::kCols, Split::kVector}) {
    const int64_t rows = split == Split::kVector ? 0 : 37,
                  cols = split == Split::kVector ? 1001 : 29;
    ShardProblem s{.rows = rows, .cols = cols, .first_moment = true, .bf16_copy = false};
    s.args.beta1 = 0.9f;
    s.args.clip_threshold = 0.5f;  // RMS(U) ≈ 1: the logical RMS decides the clip
    s.args.weight_decay = 0.1f;
    s.grad = RandomGrads(rows, cols);
    const Outcome whole = RunWhole(s);
    // Part r's rows × cols as [r0, r1) × [c0, c1) of the logical matrix (a vector: [c0, c1)).
    const int64_t cut = split == Split::kRows ? 16 : split == Split::kCols ? 12 : 400;
    struct Part {
      int64_t r0, r1, c0, c1;
    };
    std::vector<Part> parts;
    for (int r = 0; r < 2; ++r) {
      const int64_t lo = r == 0 ? 0 : cut;
      if (split == Split::kRows) parts.push_back({lo, r == 0 ? cut : rows, 0, cols});
      if (split != Split::kRows)
        parts.push_back({0, std::max<int64_t>(rows, 1), lo, r == 0 ? cut : cols});
    }
    auto take = [&](const std::vector<float>& full, const Part& p) {
      std::vector<float> out;
      for (int64_t i = p.r0; i < p.r1; ++i) {
        for (int64_t j = p.c0; j < p.c1; ++j) out.push_back(full[i * cols + j]);
      }
      return out;
    };
    LockstepGroup group(2);
    const std::vector<float> init = RandomVector(s.numel(), 7);  // Fresh's
    std::vector<std::vector<float>> param(2), m(2), row(2), col(2), full(2), scratch(2);
    for (int r = 0; r < 2; ++r) {
      const Part& p = parts[r];
      param[r] = take(init, p);
      m[r].assign(param[r].size(), 0.0f);
      if (rows > 0) {
        row[r].assign(p.r1 - p.r0, 0.0f);
        col[r].assign(p.c1 - p.c0, 0.0f);
      } else {
        full[r].assign(param[r].size(), 0.0f);
      }
      scratch[r].assign(rows + cols + 2, 0.0f);
    }
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<float> g = s.grad(step);
      std::vector<std::vector<float>> grads = {take(g, parts[0]), take(g, parts[1])};
      std::vector<absl::Status> status(2);
      {
        std::vector<std::jthread> threads;
        for (int r = 0; r < 2; ++r) {
          threads.emplace_back([&, r] {
            const Part& p = parts[r];
            const int64_t lr = rows > 0 ? p.r1 - p.r0 : 0, lc = p.c1 - p.c0;
            const auto sum = group.SumFor(r);
            AdafactorArgs a = s.args;
            a.step = step;
            a.param = Flat(param[r]);
            a.grad = Flat(grads[r]);
            a.m = Flat(m[r]);
            a.row_state = FlatOrEmpty(row[r]);
            a.col_state = FlatOrEmpty(col[r]);
            a.full_state = FlatOrEmpty(full[r]);
            a.reduce_scratch = Flat(scratch[r]);
            a.shard = AdafactorArgs::Shard{
                .rows = lr,
                .cols = lc,
                .begin = 0,
                .end = static_cast<int64_t>(param[r].size()),
                .sum_across_shards = [&, lr, lc, sum](float* data, int64_t n) -> absl::Status {
                  if (lr == 0 || n != lr + lc + 1) return sum(data, n);
                  if (split == Split::kRows) return sum(data + lr, lc + 1);
                  if (absl::Status st = sum(data, lr); !st.ok()) return st;
                  return sum(data + lr + lc, 1);
                },
                .logical_rows = split == Split::kRows ? rows : 0,
                .logical_cols = split == Split::kRows ? 0 : cols,
                .sum_row_states = sum};
            status[r] = AdafactorUpdate(CpuContext(1), a);
          });
        }
      }
      for (int r = 0; r < 2; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    }
    // Join the parts back into the logical tensor and its statistics.
    std::vector<float> joined(s.numel()), joined_m(s.numel()), joined_full;
    std::vector<float> joined_row, joined_col;
    for (int r = 0; r < 2; ++r) {
      const Part& p = parts[r];
      int64_t k = 0;
      for (int64_t i = p.r0; i < p.r1; ++i) {
        for (int64_t j = p.c0; j < p.c1; ++j, ++k) {
          joined[i * cols + j] = param[r][k];
          joined_m[i * cols + j] = m[r][k];
        }
      }
      joined_full.insert(joined_full.end(), full[r].begin(), full[r].end());
      if (split == Split::kRows) joined_row.insert(joined_row.end(), row[r].begin(), row[r].end());
      if (split == Split::kCols) joined_col.insert(joined_col.end(), col[r].begin(), col[r].end());
    }
    if (split == Split::kRows) joined_col = col[0];
    if (split == Split::kCols) joined_row = row[0];
    SCOPED_TRACE(::testing::Message() << "split " << static_cast<int>(split));
    if (split != Split::kVector) {
      // The statistics the group sums are the same bits on both parts.
      EXPECT_TRUE(SameBits(split == Split::kRows ? col[0] : row[0],
                           split == Split::kRows ? col[1] : row[1]));
    }
    EXPECT_LE(MaxRelativeError(joined_row, ToDouble(whole.row), 1e-37), 1e-6);
    EXPECT_LE(MaxRelativeError(joined_col, ToDouble(whole.col), 1e-37), 1e-6);
    EXPECT_LE(MaxRelativeError(joined_full, ToDouble(whole.full), 1e-37), 1e-6);
    EXPECT_LE(MaxRelativeError(joined, ToDouble(whole.param), 0.1), 1e-6);
    EXPECT_LE(MaxErrorOverLargest(joined_m, ToDouble(whole.m)), 1e-6);
  }
}

// Replicated rows (a KV head's K and V rows that several tensor-parallel ranks' query heads
// share): the 37 × 29 matrix's rows [30, 37) sit, identical, in both row-split parts (part 0:
// rows [0, 16) then [30, 37); part 1: rows [16, 30) then [30, 37)), and part 1 leaves its copy
// out of the group's sums (Shard::uncounted_rows). Each part's rows then end as the whole
// matrix's unsharded update, to TensorParallelPartsMatchTheLogicalTensor's bounds, and the two
// copies of the shared rows stay the same bits; counting the copy twice instead moves the
// column statistics by the shared rows' share of every column sum, far outside them.
TEST(AdafactorShardTest, ReplicatedRowsCountOnceInTheLogicalStatistics) {
  const int64_t rows = 37, cols = 29;
  ShardProblem s{.rows = rows, .cols = cols, .first_moment = true, .bf16_copy = false};
  s.args.beta1 = 0.9f;
  s.args.clip_threshold = 0.5f;
  s.args.weight_decay = 0.1f;
  s.grad = RandomGrads(rows, cols);
  const Outcome whole = RunWhole(s);
  // Each part's logical rows, in its local order.
  std::vector<std::vector<int64_t>> part_rows(2);
  for (int64_t i = 0; i < 16; ++i) part_rows[0].push_back(i);
  for (int64_t i = 16; i < 30; ++i) part_rows[1].push_back(i);
  for (int r = 0; r < 2; ++r) {
    for (int64_t i = 30; i < rows; ++i) part_rows[r].push_back(i);
  }
  const std::vector<std::pair<int64_t, int64_t>> uncounted[2] = {{}, {{14, 21}}};
  auto take = [&](const std::vector<float>& full, int r) {
    std::vector<float> out;
    for (int64_t i : part_rows[r]) out.insert(out.end(), &full[i * cols], &full[i * cols] + cols);
    return out;
  };
  for (const bool count_once : {true, false}) {
    SCOPED_TRACE(count_once ? "counted once" : "counted twice");
    LockstepGroup group(2);
    const std::vector<float> init = RandomVector(s.numel(), 7);  // Fresh's
    std::vector<std::vector<float>> param(2), m(2), row(2), col(2), scratch(2);
    for (int r = 0; r < 2; ++r) {
      const int64_t lr = static_cast<int64_t>(part_rows[r].size());
      param[r] = take(init, r);
      m[r].assign(param[r].size(), 0.0f);
      row[r].assign(lr, 0.0f);
      col[r].assign(cols, 0.0f);
      scratch[r].assign(lr + cols + 2, 0.0f);
    }
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<float> g = s.grad(step);
      std::vector<std::vector<float>> grads = {take(g, 0), take(g, 1)};
      std::vector<absl::Status> status(2);
      {
        std::vector<std::jthread> threads;
        for (int r = 0; r < 2; ++r) {
          threads.emplace_back([&, r] {
            const int64_t lr = static_cast<int64_t>(part_rows[r].size());
            const auto sum = group.SumFor(r);
            AdafactorArgs a = s.args;
            a.step = step;
            a.param = Flat(param[r]);
            a.grad = Flat(grads[r]);
            a.m = Flat(m[r]);
            a.row_state = Flat(row[r]);
            a.col_state = Flat(col[r]);
            a.reduce_scratch = Flat(scratch[r]);
            a.shard = AdafactorArgs::Shard{
                .rows = lr,
                .cols = cols,
                .begin = 0,
                .end = static_cast<int64_t>(param[r].size()),
                .sum_across_shards = [lr, sum, cols](float* data, int64_t n) -> absl::Status {
                  if (n != lr + cols + 1) return sum(data, n);
                  return sum(data + lr, cols + 1);  // rows split: column sums, Σ param²
                },
                .logical_rows = rows,
                .sum_row_states = sum,
                .uncounted_rows = count_once ? uncounted[r]
                                             : std::vector<std::pair<int64_t, int64_t>>{}};
            status[r] = AdafactorUpdate(CpuContext(1), a);
          });
        }
      }
      for (int r = 0; r < 2; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    }
    std::vector<float> joined(s.numel()), joined_m(s.numel()), joined_row(rows);
    for (int r = 1; r >= 0; --r) {  // part 0's copy of the shared rows written last
      for (size_t k = 0; k < part_rows[r].size(); ++k) {
        const int64_t i = part_rows[r][k];
        std::copy_n(&param[r][k * cols], cols, &joined[i * cols]);
        std::copy_n(&m[r][k * cols], cols, &joined_m[i * cols]);
        joined_row[i] = row[r][k];
      }
    }
    // The shared rows' two copies: the same bits (same gradients, same group statistics).
    EXPECT_TRUE(SameBits(std::vector<float>(param[0].begin() + 16 * cols, param[0].end()),
                         std::vector<float>(param[1].begin() + 14 * cols, param[1].end())));
    EXPECT_TRUE(SameBits(col[0], col[1]));
    if (count_once) {
      EXPECT_LE(MaxRelativeError(joined_row, ToDouble(whole.row), 1e-37), 1e-6);
      EXPECT_LE(MaxRelativeError(col[0], ToDouble(whole.col), 1e-37), 1e-6);
      EXPECT_LE(MaxRelativeError(joined, ToDouble(whole.param), 0.1), 1e-6);
      EXPECT_LE(MaxErrorOverLargest(joined_m, ToDouble(whole.m)), 1e-6);
    } else {
      EXPECT_GT(MaxRelativeError(col[0], ToDouble(whole.col), 1e-37), 1e-2);
    }
  }
}

// uncounted_rows: only a row-split matrix, in sorted disjoint ranges of its rows.
TEST(AdafactorShardTest, UncountedRowsAreCheckedAndNamed) {
  std::vector<float> param(6 * 4, 0.5f), grad(6 * 4, 0.1f), row(6), col(4), scratch(12);
  AdafactorArgs a;
  a.param = Flat(param);
  a.grad = Flat(grad);
  a.row_state = Flat(row);
  a.col_state = Flat(col);
  a.reduce_scratch = Flat(scratch);
  a.lr = 1e-3f;
  a.relative_step = false;
  const auto sum = [](float*, int64_t) { return absl::OkStatus(); };
  a.shard = AdafactorArgs::Shard{.rows = 6,
                                 .cols = 4,
                                 .begin = 0,
                                 .end = 24,
                                 .sum_across_shards = sum,
                                 .logical_rows = 8,
                                 .sum_row_states = sum,
                                 .uncounted_rows = {{4, 7}}};
  absl::Status st = AdafactorUpdate(CpuContext(1), a);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("shard.uncounted_rows range [4, 7) is not a sorted, disjoint, "
                              "non-empty range of the part's 6 rows"),
            std::string::npos)
      << st;
  a.shard->uncounted_rows = {{1, 2}};
  a.shard->logical_rows = 0;
  a.shard->logical_cols = 8;
  st = AdafactorUpdate(CpuContext(1), a);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("shard.uncounted_rows is set for a part not split by rows"),
            std::string::npos)
      << st;
}

}  // namespace
}  // namespace zt
