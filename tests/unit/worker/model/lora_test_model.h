// A tiny LoRA model bound to its planned buffers, shared by the LoRA tests of the model and
// of the optimizer.
#pragma once

#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "kernels/device.h"
#include "proto/job.pb.h"
#include "worker/model/transformer.h"
#include "worker/plan/arena.h"
#include "worker/plan/memory_plan.h"

namespace zt::testing {

using zerotrain::ModelConfig;

inline zerotrain::JobSpec TinyLoraJob(ModelConfig::Family family, float dropout = 0.0f) {
  zerotrain::JobSpec job;
  auto* m = job.mutable_model();
  m->set_family(family);
  const bool gpt2 = family == ModelConfig::GPT2;
  m->set_n_layer(2);
  m->set_n_head(4);
  m->set_n_kv_head(gpt2 ? 4 : 2);
  m->set_d_model(16);
  m->set_d_ff(gpt2 ? 64 : 24);
  m->set_vocab_size(11);
  m->set_max_seq_len(8);
  m->set_tie_embeddings(gpt2);
  m->set_norm_eps(1e-5f);
  m->set_rope_theta(10000.0f);
  m->set_init_std(0.3f);  // large weights: every path carries gradient worth measuring
  m->set_base_dtype(ModelConfig::FP32);
  auto* lora = m->mutable_lora();
  lora->set_rank(2);
  lora->set_alpha(3.0f);  // scale 1.5: a scale of 1 would hide a missing factor
  lora->set_dropout(dropout);
  const std::vector<const char*> modules =
      gpt2 ? std::vector<const char*>{"c_attn", "c_proj", "c_fc"}
           : std::vector<const char*>{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  for (const char* name : modules) lora->add_target_modules(name);
  job.mutable_data()->set_seq_len(7);
  job.mutable_train()->set_micro_batch_size(2);
  job.mutable_train()->set_grad_accum_steps(1);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_resources()->set_cpu_threads(1);
  return job;
}

struct Bound {
  std::unique_ptr<Arenas> arenas;
  std::optional<Transformer> model;
  DeviceContext ctx;
};

inline Bound BindJob(const zerotrain::JobSpec& job) {
  Bound b;
  b.arenas = std::move(Arenas::Create(PlanMemory(job))).value();
  b.model.emplace(Transformer::Bind(job.model(), *b.arenas, *b.arenas,
                                    job.train().micro_batch_size(), job.data().seq_len())
                      .value());
  b.ctx = JobDeviceContext(job);
  const Tensor workspace = b.arenas->Get("gemm_workspace").value();
  b.ctx.workspace = {.data = workspace.raw(), .bytes = workspace.size_bytes()};
  return b;
}

inline void FillTokens(Transformer& m, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < m.batch() * m.seq_len(); ++i) {
    m.tokens().data<int32_t>()[i] = static_cast<int32_t>(rng() % 11);
    m.targets().data<int32_t>()[i] = static_cast<int32_t>(rng() % 11);
  }
}

}  // namespace zt::testing
