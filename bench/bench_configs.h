// What the benchmarks share: the named configurations, their random training data, the
// process-memory probes and the warm-up that comes before a memory baseline is read.
//
// training_bench (one rank) and sharding_bench (N ranks as threads) run the same models with
// the same per-rank micro-batch, so their figures can sit side by side; the single-rank row
// of sharding_bench is then comparable with training_bench's.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/linear.h"
#include "kernels/status_macros.h"
#include "kernels/tensor.h"
#include "proto/job.pb.h"
#include "worker/data/token_shard.h"

namespace zt::bench {

// A byte count from /proc/self/status ("VmRSS:", "VmHWM:"), or -1 when the key is absent.
inline int64_t ProcStatusBytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key)) * 1024;
  }
  return -1;
}

inline bool IsKnownConfig(const std::string& config) {
  return config == "tiny" || config == "gpt2-small" || config == "gpt2-medium" ||
         config == "tiny-llama" || config == "llama-1b" || config == "llama-3b";
}

// The job of a named configuration (bench/README.md, "Configurations"), training on the
// token shard `data`: fp32, AdamW as nanoGPT's (β2 0.95, weight decay 0.1), one rank.
// `config` must satisfy IsKnownConfig.
inline zerotrain::JobSpec ConfigJob(const std::string& config, const std::string& data) {
  zerotrain::JobSpec job;
  job.set_name("bench-" + config);
  auto* m = job.mutable_model();
  auto* t = job.mutable_train();
  if (config == "gpt2-small" || config == "gpt2-medium") {
    const bool medium = config == "gpt2-medium";
    m->set_family(zerotrain::ModelConfig::GPT2);
    m->set_n_layer(medium ? 24 : 12);
    m->set_n_head(medium ? 16 : 12);
    m->set_d_model(medium ? 1024 : 768);
    m->set_vocab_size(50257);
    m->set_max_seq_len(1024);
    t->set_micro_batch_size(medium ? 1 : 4);
  } else if (config == "llama-1b" || config == "llama-3b") {
    // Llama-style at about 1 B parameters (0.97 B: d 2048, 18 layers, GQA 16/8, SwiGLU,
    // vocab 32,000, untied): the parameter-offload figures' model (bench/RESULTS.md); and at
    // about 3 B (3.02 B: Llama-3.2-3B's body, d 3072, 28 layers, GQA 24/8, F 8192, with
    // Llama-2's vocabulary of 32,000, untied): the "3 B under 12 GiB" model.
    const bool three = config == "llama-3b";
    m->set_family(zerotrain::ModelConfig::LLAMA);
    m->set_n_layer(three ? 28 : 18);
    m->set_n_head(three ? 24 : 16);
    m->set_n_kv_head(8);
    m->set_d_model(three ? 3072 : 2048);
    m->set_vocab_size(32000);
    m->set_max_seq_len(256);
    t->set_micro_batch_size(1);
  } else {
    const bool llama = config == "tiny-llama";
    m->set_family(llama ? zerotrain::ModelConfig::LLAMA : zerotrain::ModelConfig::GPT2);
    m->set_n_layer(4);
    m->set_n_head(4);
    if (llama) m->set_n_kv_head(2);
    m->set_d_model(256);
    m->set_vocab_size(256);
    m->set_max_seq_len(256);
    t->set_micro_batch_size(8);
  }
  job.mutable_data()->add_train(data);
  job.mutable_data()->set_seq_len(256);
  t->set_max_steps(1000);
  auto* o = job.mutable_optimizer();
  o->set_type(zerotrain::OptimizerConfig::ADAMW);
  o->set_lr(6e-4f);
  o->set_beta2(0.95f);
  o->set_weight_decay(0.1f);
  return job;
}

// Writes 2^20 uniform random token ids below `vocab_size` (seeded, so every run reads the same
// data) as a token shard at `path`. Throughput does not depend on the tokens.
inline absl::Status WriteRandomTokens(const std::string& path, int64_t vocab_size) {
  std::mt19937 rng(1);
  std::vector<int32_t> tokens(1 << 20);
  for (int32_t& x : tokens) x = static_cast<int32_t>(rng() % vocab_size);
  return WriteTokenShard(path, tokens, vocab_size);
}

// Runs one small GEMM on `ctx` (its cpu_gemm and threads; its workspace is replaced), so that
// the OpenMP pool of the calling thread and the GEMM library's JIT-generated kernels exist
// before a memory baseline is read: the process's fixed cost is then not counted as the
// engine's.
inline absl::Status WarmUpGemm(DeviceContext ctx) {
  constexpr int64_t kN = 64;
  std::vector<float> a(kN * kN, 1.0f), c(kN * kN);
  ZT_ASSIGN_OR_RETURN(const int64_t scratch_bytes,
                      GemmWorkspaceBytes(ctx, {.m = kN, .n = kN, .k = kN}));
  std::vector<uint8_t> scratch(static_cast<size_t>(scratch_bytes));
  ctx.workspace = {.data = scratch.data(), .bytes = scratch_bytes};
  const Tensor ta(a.data(), DType::kF32, {kN, kN});
  const Tensor tc(c.data(), DType::kF32, {kN, kN});
  return Gemm(ctx, ta, ta, tc, {});
}

// A scratch directory for one benchmark process's data, unique by process id.
inline std::string ScratchDir(const std::string& prefix) {
  return (std::filesystem::temp_directory_path() / (prefix + std::to_string(getpid()))).string();
}

}  // namespace zt::bench
