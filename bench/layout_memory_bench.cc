// Per-rank memory of the plan (worker/plan/memory_plan.h, parallel_plan.h) for GPT-2 1.5B and a
// Llama-7B shape under the main tensor × pipeline × ZeRO layouts of 8 ranks, beside the
// activation memory Korthikanti et al. 2022 give for the same layout (their Table 2 and
// section 4.2.3: per layer, 16-bit activations and 1-byte dropout masks,
//   no parallelism      s·b·h·(34 + 5·a·s/h)
//   tensor parallel t   s·b·h·(10 + 24/t + 5·a·s/(h·t))
//   t + sequence par.   s·b·h/t·(34 + 5·a·s/h)
// and on a 1F1B pipeline's first stage p micro-batches of L/p layers, so L layers' worth; the
// interleaved schedule multiplies by 1 + (p − 1)/(p·v)). The plan's activations are this
// engine's: no dropout, attention saves its log-sum-exp instead of the s × s scores (flash
// attention), plus the residual stream between blocks and the head's tensors.
//
// Prints one table per model; no argument. Figures are bytes from the plan, not measured.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/job.pb.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_validation.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/plan/parallel_plan.h"

namespace zt {
namespace {

struct Model {
  const char* name;
  zerotrain::ModelConfig::Family family;
  int layers, heads, d_model, d_ff, vocab, seq;
};

struct Layout {
  int tp, pp, zero;
  bool sequence;
};

zerotrain::JobSpec JobOf(const Model& m, const Layout& l) {
  zerotrain::JobSpec job;
  job.set_name("layout-bench");
  auto* c = job.mutable_model();
  c->set_family(m.family);
  c->set_n_layer(m.layers);
  c->set_n_head(m.heads);
  c->set_d_model(m.d_model);
  if (m.d_ff > 0) c->set_d_ff(m.d_ff);
  c->set_vocab_size(m.vocab);
  c->set_max_seq_len(m.seq);
  job.mutable_data()->add_train("train.bin");
  job.mutable_data()->set_seq_len(m.seq);
  job.mutable_train()->set_micro_batch_size(1);
  job.mutable_train()->set_grad_accum_steps(8);
  job.mutable_train()->set_max_steps(1);
  job.mutable_optimizer()->set_lr(1e-4f);
  // Mixed precision as Megatron trains: bf16 weights and activations, fp32 master and Adam.
  job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_precision()->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  // A CPU device of one thread: OpenBLAS needs no GEMM scratch, so the workspace column is
  // the model's own buffers (a CUDA plan adds cuBLASLt's, which needs a GPU to size).
  job.mutable_resources()->set_device(zerotrain::ResourceConfig::CPU);
  job.mutable_resources()->set_cpu_threads(1);
  auto* p = job.mutable_parallel();
  p->set_world_size(8);
  p->set_tensor_parallel(l.tp);
  p->set_pipeline_parallel(l.pp);
  p->set_zero_stage(l.zero);
  p->set_sequence_parallel(l.sequence);
  ApplyJobDefaults(&job);
  return job;
}

// Korthikanti et al.'s activation bytes on the first stage (see the file comment).
double KorthikantiBytes(const Model& m, const Layout& l) {
  const double s = m.seq, b = 1, h = m.d_model, a = m.heads, t = l.tp, L = m.layers;
  const double attention = 5.0 * a * s / h;
  double per_layer = 0;
  if (l.sequence) {
    per_layer = s * b * h / t * (34.0 + attention);
  } else if (l.tp > 1) {
    per_layer = s * b * h * (10.0 + 24.0 / t + attention / t);
  } else {
    per_layer = s * b * h * (34.0 + attention);
  }
  // p micro-batches in flight × L/p layers on the first 1F1B stage.
  return per_layer * L;
}

double Gib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

void Table(const Model& m, const std::vector<Layout>& layouts) {
  std::printf("\n%s (L %d, a %d, h %d, V %d, s %d, b 1, 8 micro-batches), 8 ranks, GiB per rank\n",
              m.name, m.layers, m.heads, m.d_model, m.vocab, m.seq);
  std::printf(
      "| layout | params | grads | optimizer | activations | Korthikanti act. | workspace "
      "| comm | total |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Layout& l : layouts) {
    const zerotrain::JobSpec job = JobOf(m, l);
    const std::string name = absl::StrCat("TP", l.tp, " PP", l.pp, " DP", 8 / (l.tp * l.pp),
                                          " ZeRO-", l.zero, l.sequence ? " +SP" : "");
    const absl::Status valid = ValidateJobSpec(job);
    if (!valid.ok()) {
      std::string why(valid.message());
      std::replace(why.begin(), why.end(), '\n', ';');
      std::printf("| %s | refused: %s | | | | | | | |\n", name.c_str(), why.c_str());
      continue;
    }
    // The largest stage: every pipeline rank's first tensor and data rank.
    MemoryPlan largest;
    const ParallelLayout first = ParallelLayout::ForJob(job, 0);
    for (int p = 0; p < l.pp; ++p) {
      const MemoryPlan plan = PlanMemory(
          job, ParallelLayout::ForJob(job, first.RankAt({.tensor = 0, .data = 0, .pipeline = p})));
      if (plan.DeviceBytes() > largest.DeviceBytes()) largest = plan;
    }
    std::printf(
        "| %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", name.c_str(),
        Gib(largest.CategoryBytes(MemoryCategory::kParameters)),
        Gib(largest.CategoryBytes(MemoryCategory::kGradients)),
        Gib(largest.CategoryBytes(MemoryCategory::kOptimizerState)),
        Gib(largest.CategoryBytes(MemoryCategory::kActivations)),
        KorthikantiBytes(m, l) / (1 << 30), Gib(largest.CategoryBytes(MemoryCategory::kWorkspace)),
        Gib(largest.CategoryBytes(MemoryCategory::kCommunication)), Gib(largest.DeviceBytes()));
  }
}

}  // namespace
}  // namespace zt

int main() {
  using zt::Layout;
  const zt::Model gpt2_xl{"GPT-2 1.5B", zerotrain::ModelConfig::GPT2, 48, 25, 1600, 0, 50257, 1024};
  const zt::Model llama7b{
      "Llama-7B shape", zerotrain::ModelConfig::LLAMA, 32, 32, 4096, 11008, 32000, 2048};
  zt::Table(gpt2_xl, {{1, 1, 1, false},
                      {1, 1, 3, false},
                      {1, 2, 1, false},
                      {1, 4, 1, false},
                      {1, 8, 0, false},
                      {2, 1, 1, false}});
  zt::Table(llama7b, {{1, 1, 3, false},
                      {8, 1, 0, false},
                      {8, 1, 0, true},
                      {4, 2, 0, true},
                      {2, 4, 0, false},
                      {2, 2, 1, false},
                      {2, 2, 1, true}});
  return 0;
}
