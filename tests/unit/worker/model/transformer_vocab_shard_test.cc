// The tied embedding split by vocabulary rows over a ZeRO-3 shard group
// (worker/model/transformer_vocab_shard.cc) in bf16, at the head: two ranks (threads, their
// collectives in process, 16-bit sums widened to f32 and rounded once as Gloo does) against one
// model over both ranks' rows. The head's input gradient dL/d(final norm output) is the sum of
// the ranks' partials over their vocabulary columns; one rank's head computes it in one GEMM,
// summed in f32 and rounded once to bf16. The split sums its f32 partials in f32 and rounds
// once too, so the two differ only where the f32 sums' order (one GEMM over V columns against
// two sums over V/2 added) puts a value on the other side of a bf16 rounding boundary.
#include <barrier>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "worker/job/job_defaults.h"
#include "worker/model/param_layout.h"
#include "worker/model/transformer.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

using zerotrain::JobSpec;
using zerotrain::PrecisionConfig;

constexpr int kRanks = 2;
constexpr int64_t kB = 2, kT = 16, kV = 512, kC = 64;

// GPT-2, one block, a vocabulary of 512 (the head's input gradient sums 512 products a value,
// 256 a rank), bf16 parameters, activations and gradients.
JobSpec Job(int world) {
  JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(1);
  m->set_n_head(4);
  m->set_d_model(kC);
  m->set_vocab_size(kV);
  m->set_max_seq_len(kT);
  m->set_n_kv_head(4);
  m->set_d_ff(4 * kC);
  m->set_tie_embeddings(true);
  m->set_norm_eps(1e-5f);
  job.mutable_data()->add_train("unused.bin");
  job.mutable_data()->set_seq_len(kT);
  job.mutable_train()->set_micro_batch_size(world == 1 ? kRanks * kB : kB);
  job.mutable_train()->set_max_steps(1);
  job.mutable_optimizer()->set_lr(1e-3f);
  job.mutable_resources()->set_cpu_threads(1);
  job.mutable_precision()->set_param_dtype(PrecisionConfig::BF16);
  job.mutable_precision()->set_compute_dtype(PrecisionConfig::BF16);
  job.mutable_precision()->set_grad_dtype(PrecisionConfig::BF16);
  job.mutable_parallel()->set_world_size(world);
  job.mutable_parallel()->set_zero_stage(world == 1 ? 0 : 3);
  if (world > 1) job.mutable_parallel()->set_vocab_sharded_embedding(true);
  ApplyJobDefaults(&job);
  return job;
}

// The shard group's collectives between two threads: each rank posts its buffer, both read
// both, and neither goes on until both have read.
class Group {
 public:
  VocabShardGroup For(int rank, const JobSpec& job, const ModelLayout& layout) {
    const ShardGeometry g = ParallelLayout::ForJob(job, rank).shard();
    const UnitShard shard = ShardOfUnit(layout.embedding(), g);
    VocabShardGroup group{.size = kRanks,
                          .rank = rank,
                          .row_begin = shard.owned.begin / kC,
                          .row_end = shard.owned.end / kC,
                          .rows_per_rank = shard.shard_numel / kC};
    group.all_gather = [this, rank](const Tensor& in, const Tensor& out, const std::string&) {
      Post(rank, in);
      for (int r = 0; r < kRanks; ++r) {
        std::memcpy(static_cast<char*>(out.raw()) + r * in.size_bytes(), posted_[r].raw(),
                    in.size_bytes());
      }
      sync_.arrive_and_wait();
      return absl::OkStatus();
    };
    group.reduce_scatter = [this, rank](const Tensor& in, const Tensor& out, const std::string&) {
      Post(rank, in);
      const int64_t n = out.numel();
      for (int64_t i = 0; i < n; ++i) {
        float sum = 0;
        for (int r = 0; r < kRanks; ++r) sum += Load(posted_[r], rank * n + i);
        Store(out, i, sum);
      }
      sync_.arrive_and_wait();
      return absl::OkStatus();
    };
    group.all_reduce = [this, rank](const Tensor& data, const std::string&) {
      std::vector<float> mine(static_cast<size_t>(data.numel()));
      for (int64_t i = 0; i < data.numel(); ++i) mine[i] = Load(data, i);
      Post(rank, Tensor(mine.data(), DType::kF32, {data.numel()}));
      for (int64_t i = 0; i < data.numel(); ++i) {
        float sum = 0;
        for (int r = 0; r < kRanks; ++r) sum += posted_[r].data<float>()[i];
        Store(data, i, sum);
      }
      sync_.arrive_and_wait();
      return absl::OkStatus();
    };
    return group;
  }

 private:
  void Post(int rank, const Tensor& t) {
    posted_[rank] = t;
    sync_.arrive_and_wait();
  }
  static float Load(const Tensor& t, int64_t i) {
    return t.dtype() == DType::kBF16 ? Bf16ToFloat(t.data<uint16_t>()[i]) : t.data<float>()[i];
  }
  static void Store(const Tensor& t, int64_t i, float v) {
    if (t.dtype() == DType::kBF16) {
      t.data<uint16_t>()[i] = FloatToBf16(v);
    } else {
      t.data<float>()[i] = v;
    }
  }

  std::barrier<> sync_{kRanks};
  Tensor posted_[kRanks];
};

struct Bound {
  std::unique_ptr<Arenas> arenas;
  std::optional<Transformer> model;
  DeviceContext ctx;
};

Bound BindJob(const JobSpec& job, int rank) {
  Bound b;
  b.arenas = std::move(Arenas::Create(PlanMemory(job, rank))).value();
  b.model.emplace(Transformer::Bind(job.model(), *b.arenas, *b.arenas,
                                    job.train().micro_batch_size(), job.data().seq_len())
                      .value());
  b.ctx = JobDeviceContext(job);
  const Tensor workspace = b.arenas->Get("gemm_workspace").value();
  b.ctx.workspace = {.data = workspace.raw(), .bytes = workspace.size_bytes()};
  return b;
}

TEST(TransformerVocabShardTest, Bf16HeadInputGradientIsRoundedOnceAsOneRanks) {
  const JobSpec one_job = Job(1), split_job = Job(kRanks);
  Bound one = BindJob(one_job, 0);
  // Every parameter uniform in [-0.3, 0.3], as bf16 (the trainer's initialisation writes the
  // f32 masters; here the bf16 parameters are all there is): logits of O(1), so dL/dlogits is
  // spread over the vocabulary.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-0.3f, 0.3f);
  for (const Tensor& p : one.model->unit_params()) {
    for (int64_t i = 0; i < p.numel(); ++i) p.data<uint16_t>()[i] = FloatToBf16(uniform(rng));
  }
  for (int64_t i = 0; i < kRanks * kB * kT; ++i) {
    one.model->tokens().data<int32_t>()[i] = static_cast<int32_t>((i * 37 + 5) % kV);
    one.model->targets().data<int32_t>()[i] = static_cast<int32_t>((i * 53 + 1) % kV);
  }
  const std::vector<Tensor> params = one.model->unit_params();
  const Transformer::LossOptions options{.write_grad = true,
                                         .grad_scale = 1.0f / (kRanks * kB * kT)};
  // One model over both ranks' rows: embedding, block, final norm, head, the norm's backward.
  Transformer& m = *one.model;
  const std::vector<Tensor> grads = m.unit_grads();
  ASSERT_TRUE(m.EmbeddingForward(one.ctx, params[0]).ok());
  ASSERT_TRUE(m.BlockForward(one.ctx, 0, params[1]).ok());
  ASSERT_TRUE(m.HeadForward(one.ctx, params[2]).ok());
  ASSERT_TRUE(m.HeadLoss(one.ctx, params[2], grads[2], params[0], grads[0], options).ok());
  ASSERT_TRUE(m.HeadBackward(one.ctx, params[2], grads[2]).ok());
  const Tensor want = m.residual_grad();
  ASSERT_EQ(want.dtype(), DType::kBF16);

  // Two ranks, each its own rows of [wte; wpe] and its micro-batch.
  const ModelLayout layout = BuildModelLayout(split_job.model());
  Group group;
  std::vector<std::vector<uint16_t>> got(kRanks);
  std::vector<absl::Status> status(kRanks);
  auto rank = [&](int r) {
    status[r] = [&]() -> absl::Status {
      Bound b = BindJob(split_job, r);
      Transformer& s = *b.model;
      const UnitShard shard =
          ShardOfUnit(layout.embedding(), ParallelLayout::ForJob(split_job, r).shard());
      std::vector<uint16_t> rows(shard.shard_numel, 0), row_grads(shard.shard_numel, 0);
      std::memcpy(rows.data(), params[0].data<uint16_t>() + shard.owned.begin,
                  (shard.owned.end - shard.owned.begin) * sizeof(uint16_t));
      const Tensor emb(rows.data(), DType::kBF16, {shard.shard_numel});
      const Tensor emb_grad(row_grads.data(), DType::kBF16, {shard.shard_numel});
      std::vector<uint16_t> head_grad(grads[2].numel(), 0);
      const Tensor head_grads(head_grad.data(), DType::kBF16, {grads[2].numel()});
      if (absl::Status st = s.BindVocabShardGroup(group.For(r, split_job, layout), *b.arenas);
          !st.ok()) {
        return st;
      }
      const int64_t n = kB * kT;
      std::memcpy(s.tokens().raw(), m.tokens().data<int32_t>() + r * n, n * sizeof(int32_t));
      std::memcpy(s.targets().raw(), m.targets().data<int32_t>() + r * n, n * sizeof(int32_t));
      for (absl::Status st : {s.EmbeddingForward(b.ctx, emb), s.BlockForward(b.ctx, 0, params[1]),
                              s.HeadForward(b.ctx, params[2])}) {
        if (!st.ok()) return st;
      }
      if (absl::Status st = s.HeadLoss(b.ctx, params[2], head_grads, emb, emb_grad, options);
          !st.ok()) {
        return st;
      }
      if (absl::Status st = s.HeadBackward(b.ctx, params[2], head_grads); !st.ok()) return st;
      const Tensor dx = s.residual_grad();
      got[r].assign(dx.data<uint16_t>(), dx.data<uint16_t>() + dx.numel());
      return absl::OkStatus();
    }();
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];

  // dL/d(final residual), the norm's backward of dL/d(norm output): elements whose bf16 bits
  // differ from one rank's, over both ranks' rows.
  int64_t differing = 0, total = 0;
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(static_cast<int64_t>(got[r].size()), kB * kT * kC);
    for (int64_t i = 0; i < kB * kT * kC; ++i) {
      differing += got[r][i] != want.data<uint16_t>()[r * kB * kT * kC + i];
      ++total;
    }
  }
  // Seen: 0 of 4096 (the f32 sums' different order moved no value across a bf16 boundary
  // here); rounding each rank's partial to bf16 before the sum, the double rounding this
  // replaced, gave 1540 of 4096 (38 %). The order may flip a rare value on another BLAS:
  // 1 % bounds that and catches the double rounding by a factor of 38.
  EXPECT_LE(differing, total / 100) << differing << " of " << total;
}

}  // namespace
}  // namespace zt
