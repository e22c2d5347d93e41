// Training throughput and memory of the engine on a fixed configuration, printed as one JSON
// line (bench/run_training_bench.sh puts it beside PyTorch's).
//
//   training_bench --config tiny|gpt2-small|gpt2-medium|tiny-llama|llama-1b|llama-3b
//                  [--steps N] [--warmup N]
//                  [--threads N] [--gemm onednn|openblas]
//                  [--precision fp32|bf16|fp16] [--checkpointing none|full|selective|every2]
//                  [--optimizer adamw|adamw8bit|adafactor] [--grad-dtype fp32|bf16]
//                  [--master fp32|split] [--offload none|cpu|nvme] [--nvme-path DIR]
//                  [--buffer-count N] [--buffer-size BYTES] [--offload-params cpu|nvme]
//                  [--n-layer N] [--lr LR] [--zero-stage 1|2|3] [--delayed-update N]
// The memory techniques (bench/RESULTS.md's second table) are the last five flags:
// --precision bf16 means bf16 parameters and activations with fp32 master weights and fp32
// gradient accumulation; --grad-dtype bf16 accumulates gradients in bf16 instead, and
// --master split keeps the fp32 master as the bf16 parameters plus 16 low bits
// (precision.split_master_weights).
// --offload puts the optimizer's states on the host (cpu, ZeRO-Offload) or in a swap store
// under --nvme-path (nvme); with it, every mode (none too) runs at ZeRO stage 1, which offload
// needs (one rank: the same arithmetic as stage 0), and the line adds the optimizer's median
// seconds and the swap's bytes and seconds of the last step. --offload-params (with --offload)
// moves the parameter shards too (offload.params) and runs at ZeRO stage 3 instead. --n-layer
// overrides the configuration's depth (to size a model to the machine); --zero-stage the stage
// (--offload's 1 or --offload-params' 3: at 2–3 the gradients' copies to the host are queued
// during the backward, gradient_copies_queued_in_backward); --lr its learning rate
// (a few steps of a large model from its random init fall at a smaller one than 6e-4).
// --delayed-update N (with --offload cpu) turns on ZeRO-Offload's one-step delayed parameter
// update after N steps (offload.delayed_update): the host step of a step then runs beside the
// next step's forward and backward; the line adds delayed_update_after_steps.
//
// The data are random tokens (throughput does not depend on them). Peak RSS is the kernel's
// VmHWM; the baseline is VmRSS after the libraries and the OpenMP pool are up, before the
// trainer allocates, so (peak − baseline) is what the engine itself added and is compared
// with the memory plan's total.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "bench/bench_configs.h"
#include "kernels/linear.h"
#include "nlohmann/json.hpp"
#include "worker/job/job_loading.h"
#include "worker/train/trainer.h"

int main(int argc, char** argv) {
  std::string config = "tiny", gemm = "onednn";
  std::string precision = "fp32", checkpointing = "none", optimizer = "adamw";
  std::string grad_dtype = "fp32", master = "fp32", offload, nvme_path, offload_params;
  int steps = 10, warmup = 2, threads = 2, buffer_count = 4, n_layer = 0, zero_stage = 0;
  int delayed_after = -1;   // --delayed-update N: offload.delayed_update after N steps
  int64_t buffer_size = 0;  // 0: the job's default
  double lr = 0;            // 0: the configuration's (nanoGPT's 6e-4)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--config")
      config = value;
    else if (flag == "--steps")
      steps = std::atoi(value.c_str());
    else if (flag == "--warmup")
      warmup = std::atoi(value.c_str());
    else if (flag == "--threads")
      threads = std::atoi(value.c_str());
    else if (flag == "--gemm")
      gemm = value;
    else if (flag == "--precision")
      precision = value;
    else if (flag == "--checkpointing")
      checkpointing = value;
    else if (flag == "--optimizer")
      optimizer = value;
    else if (flag == "--grad-dtype")
      grad_dtype = value;
    else if (flag == "--offload")
      offload = value;
    else if (flag == "--nvme-path")
      nvme_path = value;
    else if (flag == "--buffer-count")
      buffer_count = std::atoi(value.c_str());
    else if (flag == "--buffer-size")
      buffer_size = std::atoll(value.c_str());
    else if (flag == "--master")
      master = value;
    else if (flag == "--offload-params")
      offload_params = value;
    else if (flag == "--n-layer")
      n_layer = std::atoi(value.c_str());
    else if (flag == "--lr")
      lr = std::atof(value.c_str());
    else if (flag == "--zero-stage")
      zero_stage = std::atoi(value.c_str());
    else if (flag == "--delayed-update")
      delayed_after = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "training_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (!zt::bench::IsKnownConfig(config)) {
    std::fprintf(stderr,
                 "training_bench: --config must be tiny, tiny-llama, gpt2-small, gpt2-medium, "
                 "llama-1b or llama-3b\n");
    return 2;
  }

  const std::string dir = zt::bench::ScratchDir("zt-bench-");
  std::filesystem::create_directories(dir);
  const std::string data = dir + "/train.bin";
  zerotrain::JobSpec job = zt::bench::ConfigJob(config, data);
  if (n_layer > 0) job.mutable_model()->set_n_layer(n_layer);
  if (lr > 0) job.mutable_optimizer()->set_lr(static_cast<float>(lr));
  {
    using P = zerotrain::PrecisionConfig;
    using M = zerotrain::MemoryConfig;
    using O = zerotrain::OptimizerConfig;
    const P::DType dtype = precision == "bf16" ? P::BF16 : precision == "fp16" ? P::FP16 : P::FP32;
    job.mutable_precision()->set_param_dtype(dtype);
    job.mutable_precision()->set_compute_dtype(dtype);
    if (grad_dtype == "bf16") job.mutable_precision()->set_grad_dtype(P::BF16);
    if (master == "split") job.mutable_precision()->set_split_master_weights(true);
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
  if (!offload.empty()) {
    using Off = zerotrain::OffloadConfig;
    if (offload != "none" && offload != "cpu" && offload != "nvme") {
      std::fprintf(stderr, "training_bench: --offload must be none, cpu or nvme\n");
      return 2;
    }
    job.mutable_parallel()->set_zero_stage(1);
    if (buffer_size > 0) job.mutable_offload()->set_buffer_size(buffer_size);
    job.mutable_offload()->set_optimizer(offload == "cpu"    ? Off::CPU
                                         : offload == "nvme" ? Off::NVME
                                                             : Off::NONE);
    if (offload == "nvme") {
      if (nvme_path.empty()) {
        std::fprintf(stderr, "training_bench: --offload nvme needs --nvme-path DIR\n");
        return 2;
      }
      job.mutable_offload()->set_nvme_path(nvme_path);
      job.mutable_offload()->set_buffer_count(buffer_count);
    }
    if (!offload_params.empty() && offload_params != "none") {
      if (offload_params != "cpu" && offload_params != "nvme") {
        std::fprintf(stderr, "training_bench: --offload-params must be none, cpu or nvme\n");
        return 2;
      }
      job.mutable_parallel()->set_zero_stage(3);
      job.mutable_offload()->set_params(offload_params == "cpu" ? Off::CPU : Off::NVME);
    }
  } else if (!offload_params.empty()) {
    std::fprintf(stderr, "training_bench: --offload-params needs --offload\n");
    return 2;
  }
  if (delayed_after >= 0) {
    // ZeRO-Offload's delayed update (validation refuses it without a host step).
    job.mutable_offload()->mutable_delayed_update()->set_enabled(true);
    job.mutable_offload()->mutable_delayed_update()->set_after_steps(delayed_after);
  }
  // After the offload's own stage: the job's validation refuses what the offload forbids.
  if (zero_stage > 0) job.mutable_parallel()->set_zero_stage(zero_stage);
  if (auto s = zt::bench::WriteRandomTokens(data, job.model().vocab_size()); !s.ok()) {
    std::fprintf(stderr, "training_bench: %s\n", s.ToString().c_str());
    return 1;
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
    zt::DeviceContext warm = zt::CpuContext(threads);
    warm.cpu_gemm = gemm == "openblas" ? zt::CpuGemm::kOpenBlas : zt::CpuGemm::kOneDnn;
    if (auto s = zt::bench::WarmUpGemm(warm); !s.ok()) {
      std::fprintf(stderr, "training_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const int64_t baseline = zt::bench::ProcStatusBytes("VmRSS:");

  auto trainer = zt::Trainer::Create(*validated, {});
  if (!trainer.ok()) {
    std::fprintf(stderr, "training_bench: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  const int64_t after_create = zt::bench::ProcStatusBytes("VmRSS:");
  (*trainer)->set_cpu_gemm(gemm == "openblas" ? zt::CpuGemm::kOpenBlas : zt::CpuGemm::kOneDnn);
  std::vector<double> step_ms, optimizer_ms;
  zt::StepRecord last;
  double loss = 0, first_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point timed_start = start;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) timed_start = std::chrono::steady_clock::now();
    auto r = (*trainer)->Step();
    if (!r.ok()) {
      std::fprintf(stderr, "training_bench: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (s >= warmup) {
      step_ms.push_back(r->step_ms);
      optimizer_ms.push_back(r->optimizer_s * 1e3);
    }
    loss = r->loss;
    if (s == 0) first_loss = loss;
    last = *r;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - timed_start).count();
  std::sort(step_ms.begin(), step_ms.end());
  std::sort(optimizer_ms.begin(), optimizer_ms.end());
  const int64_t tokens_per_step =
      int64_t{validated->train().micro_batch_size()} * validated->data().seq_len();
  nlohmann::json out = {{"impl", "zerotrain"},
                        {"config", config},
                        {"threads", threads},
                        {"params", (*trainer)->model().layout().total_numel},
                        {"tokens_per_s", static_cast<double>(tokens_per_step * steps) / elapsed},
                        {"step_ms", step_ms[step_ms.size() / 2]},
                        {"peak_rss_bytes", zt::bench::ProcStatusBytes("VmHWM:")},
                        {"baseline_rss_bytes", baseline},
                        {"rss_after_setup_bytes", after_create},
                        {"plan_total_bytes", (*trainer)->plan().TotalBytes()},
                        {"gemm", zt::CpuGemmDescription((*trainer)->context().cpu_gemm)},
                        {"precision", precision},
                        {"checkpointing", checkpointing},
                        {"optimizer", optimizer},
                        {"grad_dtype", grad_dtype},
                        {"master", master},
                        {"first_loss", first_loss},
                        {"final_loss", loss}};
  if (!offload.empty()) {
    const zt::MemoryPlan& plan = (*trainer)->plan();
    out["offload"] = offload;
    out["offload_params"] = offload_params.empty() ? "none" : offload_params;
    if (delayed_after >= 0) out["delayed_update_after_steps"] = delayed_after;
    out["optimizer_ms"] = optimizer_ms[optimizer_ms.size() / 2];
    out["host_optimizer_ms_last"] = last.host_optimizer_s * 1e3;
    // ZeRO-Offload's overlap: the gradients' copies run beside the backward; what the host
    // step still waited for them is what the overlap did not hide (the whole run).
    out["gradient_copy_ms_last"] = last.offload_to_host_s * 1e3;
    if (const zt::GradientDownloads* d = (*trainer)->gradient_downloads()) {
      const zt::GradientDownloads::Stats s = d->stats();
      out["gradient_copies"] = s.copies;
      out["gradient_copies_queued_in_backward"] = s.enqueued_during_backward;
      out["gradient_copies_done_in_backward"] = s.finished_during_backward;
      out["gradient_wait_ms_total"] = s.wait_seconds * 1e3;
    }
    out["swap_bytes_in_last"] = last.swap_bytes_in;
    out["swap_bytes_out_last"] = last.swap_bytes_out;
    out["swap_in_ms_last"] = last.swap_in_s * 1e3;
    out["swap_out_ms_last"] = last.swap_out_s * 1e3;
    out["plan_device_bytes"] = plan.DeviceBytes();
    out["plan_pinned_host_bytes"] = plan.CategoryBytes(zt::MemoryCategory::kPinnedHost);
    out["plan_nvme_bytes"] = plan.CategoryBytes(zt::MemoryCategory::kNvme);
  }
  std::printf("%s\n", out.dump().c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
