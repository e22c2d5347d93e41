// Training throughput and memory of the engine on a fixed configuration, printed as one JSON
// line (bench/run_training_bench.sh puts it beside PyTorch's).
//
//   training_bench --config tiny|gpt2-small|tiny-llama [--steps N] [--warmup N]
//                  [--threads N] [--gemm onednn|openblas]
//                  [--precision fp32|bf16|fp16] [--checkpointing none|full|selective|every2]
//                  [--optimizer adamw|adamw8bit|adafactor]
// The memory techniques (bench/RESULTS.md's second table) are the last three flags:
// --precision bf16 means bf16 parameters and activations with fp32 master weights and fp32
// gradient accumulation.
//
// The data are random tokens (throughput does not depend on them). Peak RSS is the kernel's
// VmHWM; the baseline is VmRSS after the libraries and the OpenMP pool are up, before the
// trainer allocates, so (peak − baseline) is what the engine itself added and is compared
// with the memory plan's total.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "nlohmann/json.hpp"
#include "worker/data/token_shard.h"
#include "worker/job/job_loading.h"
#include "worker/trainer.h"

namespace {

int64_t ProcStatusBytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) return std::atoll(line.c_str() + std::strlen(key)) * 1024;
  }
  return -1;
}

zerotrain::JobSpec ConfigJob(const std::string& config, const std::string& data) {
  zerotrain::JobSpec job;
  job.set_name("bench-" + config);
  auto* m = job.mutable_model();
  auto* t = job.mutable_train();
  if (config == "gpt2-small") {
    m->set_family(zerotrain::ModelConfig::GPT2);
    m->set_n_layer(12);
    m->set_n_head(12);
    m->set_d_model(768);
    m->set_vocab_size(50257);
    m->set_max_seq_len(1024);
    t->set_micro_batch_size(4);
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

}  // namespace

int main(int argc, char** argv) {
  std::string config = "tiny", gemm = "onednn";
  std::string precision = "fp32", checkpointing = "none", optimizer = "adamw";
  int steps = 10, warmup = 2, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--config") config = value;
    else if (flag == "--steps") steps = std::atoi(value.c_str());
    else if (flag == "--warmup") warmup = std::atoi(value.c_str());
    else if (flag == "--threads") threads = std::atoi(value.c_str());
    else if (flag == "--gemm") gemm = value;
    else if (flag == "--precision") precision = value;
    else if (flag == "--checkpointing") checkpointing = value;
    else if (flag == "--optimizer") optimizer = value;
    else {
      std::fprintf(stderr, "training_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (config != "tiny" && config != "gpt2-small" && config != "tiny-llama") {
    std::fprintf(stderr, "training_bench: --config must be tiny, tiny-llama or gpt2-small\n");
    return 2;
  }

  const std::string dir =
      (std::filesystem::temp_directory_path() / ("zt-bench-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string data = dir + "/train.bin";
  zerotrain::JobSpec job = ConfigJob(config, data);
  {
    using P = zerotrain::PrecisionConfig;
    using M = zerotrain::MemoryConfig;
    using O = zerotrain::OptimizerConfig;
    const P::DType dtype = precision == "bf16" ? P::BF16 : precision == "fp16" ? P::FP16 : P::FP32;
    job.mutable_precision()->set_param_dtype(dtype);
    job.mutable_precision()->set_compute_dtype(dtype);
    M* memory = job.mutable_memory();
    if (checkpointing == "full") memory->set_activation_checkpointing(M::FULL);
    if (checkpointing == "selective") memory->set_activation_checkpointing(M::SELECTIVE);
    if (checkpointing == "every2") {
      memory->set_activation_checkpointing(M::EVERY_K);
      memory->set_checkpoint_every_k(2);
    }
    if (optimizer == "adamw8bit") job.mutable_optimizer()->set_type(O::ADAMW_8BIT);
    if (optimizer == "adafactor") {
      job.mutable_optimizer()->set_type(O::ADAFACTOR);
      job.mutable_optimizer()->mutable_adafactor()->set_scale_parameter(false);
    }
  }
  {
    std::mt19937 rng(1);
    std::vector<int32_t> tokens(1 << 20);
    for (int32_t& x : tokens) x = static_cast<int32_t>(rng() % job.model().vocab_size());
    if (auto s = zt::WriteTokenShard(data, tokens, job.model().vocab_size()); !s.ok()) {
      std::fprintf(stderr, "training_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  job.mutable_resources()->set_cpu_threads(threads);
  auto validated = zt::ValidatedJob(job);
  if (!validated.ok()) {
    std::fprintf(stderr, "training_bench: %s\n", validated.status().ToString().c_str());
    return 1;
  }
  // Bring the OpenMP pool and the GEMM library (its JIT-generated kernels) up before the
  // baseline, so that the process's fixed cost is not counted as the engine's.
  {
    std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
    zt::DeviceContext warm = zt::CpuContext(threads);
    warm.cpu_gemm = gemm == "openblas" ? zt::CpuGemm::kOpenBlas : zt::CpuGemm::kOneDnn;
    auto scratch_bytes = zt::GemmWorkspaceBytes(warm, {.m = 64, .n = 64, .k = 64});
    if (!scratch_bytes.ok()) {
      std::fprintf(stderr, "training_bench: %s\n", scratch_bytes.status().ToString().c_str());
      return 1;
    }
    std::vector<uint8_t> scratch(static_cast<size_t>(*scratch_bytes));
    warm.workspace = {.data = scratch.data(), .bytes = *scratch_bytes};
    const zt::Tensor ta(a.data(), zt::DType::kF32, {64, 64});
    const zt::Tensor tc(c.data(), zt::DType::kF32, {64, 64});
    if (auto s = zt::Gemm(warm, ta, ta, tc, {}); !s.ok()) {
      std::fprintf(stderr, "training_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const int64_t baseline = ProcStatusBytes("VmRSS:");

  auto trainer = zt::Trainer::Create(*validated, {});
  if (!trainer.ok()) {
    std::fprintf(stderr, "training_bench: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  const int64_t after_create = ProcStatusBytes("VmRSS:");
  (*trainer)->set_cpu_gemm(gemm == "openblas" ? zt::CpuGemm::kOpenBlas : zt::CpuGemm::kOneDnn);
  std::vector<double> step_ms;
  double loss = 0;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point timed_start = start;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) timed_start = std::chrono::steady_clock::now();
    auto r = (*trainer)->Step();
    if (!r.ok()) {
      std::fprintf(stderr, "training_bench: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (s >= warmup) step_ms.push_back(r->step_ms);
    loss = r->loss;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - timed_start).count();
  std::sort(step_ms.begin(), step_ms.end());
  const int64_t tokens_per_step =
      int64_t{validated->train().micro_batch_size()} * validated->data().seq_len();
  nlohmann::json out = {
      {"impl", "zerotrain"},
      {"config", config},
      {"threads", threads},
      {"params", (*trainer)->model().layout().total_numel},
      {"tokens_per_s", static_cast<double>(tokens_per_step * steps) / elapsed},
      {"step_ms", step_ms[step_ms.size() / 2]},
      {"peak_rss_bytes", ProcStatusBytes("VmHWM:")},
      {"baseline_rss_bytes", baseline},
      {"rss_after_setup_bytes", after_create},
      {"plan_total_bytes", (*trainer)->plan().TotalBytes()},
      {"gemm", zt::CpuGemmDescription((*trainer)->context().cpu_gemm)},
      {"precision", precision},
      {"checkpointing", checkpointing},
      {"optimizer", optimizer},
      {"final_loss", loss}};
  std::printf("%s\n", out.dump().c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
