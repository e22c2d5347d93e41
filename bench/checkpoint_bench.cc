// Checkpoint figures (issue 5) for one rank, printed as one JSON line per run:
// bench/run_checkpoint_bench.sh runs each mode in its own process and puts them in a table.
//
//   checkpoint_bench --mode none|sync|async|load|export --dir DIR [--out OUT]
//                    [--config gpt2-small|gpt2-medium|tiny] [--steps N] [--warmup N] [--interval K]
//                    [--threads N]
//
// none|sync|async: trains warmup + steps steps (fp32 AdamW, the configuration's batch) through
// Trainer::Run, saving every K steps into DIR (none: no checkpoint.dir). Each iteration of the
// loop is timed from one on_step callback to the next, so a step's time includes the save
// that followed it (synchronous: the whole write; asynchronous: the copy into the staging
// buffer, the write then competing with the next steps for the cores). Reported: the mean
// iteration time of steps with a save and of steps without, the total time of the timed
// steps (an async save's cost shows as the slower steps after it), the bytes the last
// checkpoint holds, and the extra peak memory of an iteration with a save: VmHWM is reset
// (/proc/self/clear_refs, 5) before the step and read after the save, minus VmRSS at the
// reset — beside the same figure for an iteration without a save.
// load: Trainer::Create resuming from DIR (what `zt train --resume` does before its first
// step), timed, with VmHWM − baseline.
// export: ExportCheckpoint(DIR, OUT) — what `zt export DIR --out OUT` runs — in a child
// forked before this process does anything else; its peak RSS is the child's ru_maxrss from
// wait4, beside the model's fp32 bytes and its largest tensor's (the streaming target).
//
// The baseline is VmRSS after the OpenMP pool and the GEMM library are up, before the
// trainer allocates (as training_bench). `timed_s` runs from the end of the warm-up to the
// return of Run(), an asynchronous save's last write included.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "bench/bench_configs.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/checkpoint_export.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Resets the process's VmHWM to its current VmRSS; false where the kernel refuses.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

int64_t DirectoryBytes(const std::filesystem::path& dir) {
  int64_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
  }
  return total;
}

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", what.c_str());
  return 1;
}

// Exports `dir` into `out` in a forked child and reports the child's peak RSS and time.
int MeasureExport(const std::string& config, const std::string& dir, const std::string& out) {
  const auto start = Clock::now();
  const pid_t pid = fork();
  if (pid < 0) return Fail("fork failed");
  if (pid == 0) {
    auto result = zt::ExportCheckpoint(dir, out, {});
    if (!result.ok())
      std::fprintf(stderr, "checkpoint_bench: %s\n", result.status().ToString().c_str());
    _exit(result.ok() ? 0 : 1);
  }
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) return Fail("wait4 failed");
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return Fail("the export failed");
  // Validation wants the job's data to exist; the model's sizes are all this needs of it.
  const std::string scratch = zt::bench::ScratchDir("zt-ckpt-bench-");
  std::filesystem::create_directories(scratch);
  zerotrain::JobSpec job = zt::bench::ConfigJob(config, scratch + "/train.bin");
  if (auto s = zt::bench::WriteRandomTokens(scratch + "/train.bin", job.model().vocab_size());
      !s.ok()) {
    return Fail(s.ToString());
  }
  auto validated = zt::ValidatedJob(job);
  std::filesystem::remove_all(scratch);
  if (!validated.ok()) return Fail(validated.status().ToString());
  const zt::ModelLayout layout = zt::BuildModelLayout(validated->model());
  int64_t largest = 0;
  for (const zt::UnitLayout& u : layout.units) {
    for (const zt::ParamSpec& p : u.params) largest = std::max(largest, p.numel);
  }
  const nlohmann::json line = {{"config", config},
                               {"mode", "export"},
                               {"peak_rss_bytes", int64_t{usage.ru_maxrss} * 1024},
                               {"export_s", seconds},
                               {"export_bytes", DirectoryBytes(out)},
                               {"model_fp32_bytes", layout.total_numel * 4},
                               {"largest_tensor_fp32_bytes", largest * 4}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string config = "gpt2-small", mode, dir, out_dir;
  int steps = 6, warmup = 1, interval = 3, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--config")
      config = value;
    else if (flag == "--mode")
      mode = value;
    else if (flag == "--dir")
      dir = value;
    else if (flag == "--out")
      out_dir = value;
    else if (flag == "--steps")
      steps = std::atoi(value.c_str());
    else if (flag == "--warmup")
      warmup = std::atoi(value.c_str());
    else if (flag == "--interval")
      interval = std::atoi(value.c_str());
    else if (flag == "--threads")
      threads = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "checkpoint_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (!zt::bench::IsKnownConfig(config)) {
    std::fprintf(
        stderr, "checkpoint_bench: --config must be tiny, tiny-llama, gpt2-small or gpt2-medium\n");
    return 2;
  }
  if (mode != "none" && mode != "sync" && mode != "async" && mode != "load" && mode != "export") {
    std::fprintf(stderr, "checkpoint_bench: --mode must be none, sync, async, load or export\n");
    return 2;
  }
  if (mode == "export") {
    if (dir.empty() || out_dir.empty()) {
      std::fprintf(stderr, "checkpoint_bench: --mode export needs --dir and --out\n");
      return 2;
    }
    return MeasureExport(config, dir, out_dir);
  }
  if ((mode != "none" && dir.empty()) || steps < 1 || warmup < 0 || interval < 1 ||
      (warmup + steps) / interval < 1) {
    std::fprintf(stderr,
                 "checkpoint_bench: --dir is required for sync, async and load; --steps >= 1, "
                 "--interval >= 1, and at least one save within warmup + steps\n");
    return 2;
  }

  const std::string scratch = zt::bench::ScratchDir("zt-ckpt-bench-");
  std::filesystem::create_directories(scratch);
  const std::string data = scratch + "/train.bin";
  zerotrain::JobSpec job = zt::bench::ConfigJob(config, data);
  job.mutable_resources()->set_cpu_threads(threads);
  if (mode != "none") {
    auto* c = job.mutable_checkpoint();
    c->set_dir(dir);
    c->set_interval_steps(interval);
    c->set_keep_last(1);
    c->set_async(mode == "async");
  }
  if (auto s = zt::bench::WriteRandomTokens(data, job.model().vocab_size()); !s.ok()) {
    return Fail(s.ToString());
  }
  auto validated = zt::ValidatedJob(job);
  if (!validated.ok()) return Fail(validated.status().ToString());
  if (auto s = zt::bench::WarmUpGemm(zt::CpuContext(threads)); !s.ok()) return Fail(s.ToString());
  const int64_t baseline = zt::bench::ProcStatusBytes("VmRSS:");

  zt::TrainOptions options;
  const int64_t total_steps = warmup + steps;
  if (mode == "load") {
    options.resume_dir = dir;
    options.stop_after_step = 0;
  } else {
    options.stop_after_step = total_steps;
  }
  const auto create_start = Clock::now();
  auto trainer = zt::Trainer::Create(*validated, options);
  if (!trainer.ok()) return Fail(trainer.status().ToString());
  const double create_s = std::chrono::duration<double>(Clock::now() - create_start).count();
  const int64_t params = (*trainer)->model().layout().total_numel;
  nlohmann::json out = {{"config", config},
                        {"mode", mode},
                        {"threads", threads},
                        {"params", params},
                        {"model_fp32_bytes", params * 4},
                        {"plan_total_bytes", (*trainer)->plan().TotalBytes()},
                        {"create_s", create_s},
                        {"baseline_rss_bytes", baseline},
                        {"rss_after_create_bytes", zt::bench::ProcStatusBytes("VmRSS:")},
                        // Before any step (the peak resets below start from here).
                        {"peak_rss_bytes", zt::bench::ProcStatusBytes("VmHWM:")}};
  if (mode == "load") {
    out["resumed_step"] = (*trainer)->step();
    out["checkpoint_bytes"] = DirectoryBytes(dir);
    std::printf("%s\n", out.dump().c_str());
    std::filesystem::remove_all(scratch);
    return 0;
  }

  // Iteration times: from the previous callback (or the start) to this step's callback.
  std::vector<double> with_save, without_save;
  double timed_s = 0;
  int64_t save_peak_extra = -1, plain_peak_extra = -1, reset_rss = 0;
  bool reset_ok = true;
  auto last = Clock::now();
  auto on_step = [&](const zt::StepRecord& r) {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - last).count();
    const bool saved = mode != "none" && r.step % interval == 0;
    if (r.step > warmup) {
      (saved ? with_save : without_save).push_back(s * 1e3);
      timed_s += s;
    }
    // The peaks of the last save and of the last plain step after the warm-up, each from a
    // reset just before its step.
    const int64_t next = r.step + 1;
    if (r.step > warmup && reset_rss > 0) {
      const int64_t extra = zt::bench::ProcStatusBytes("VmHWM:") - reset_rss;
      (saved ? save_peak_extra : plain_peak_extra) = extra;
      reset_rss = 0;
    }
    if (next > warmup && next <= total_steps) {
      reset_ok = reset_ok && ResetPeakRss();
      reset_rss = zt::bench::ProcStatusBytes("VmRSS:");
    }
    last = Clock::now();
  };
  if (auto s = (*trainer)->Run(on_step); !s.ok()) return Fail(s.ToString());
  // An asynchronous save still in flight after the last step is waited for inside Run().
  const double tail_s = std::chrono::duration<double>(Clock::now() - last).count();
  out["steps"] = steps;
  out["warmup"] = warmup;
  out["interval"] = interval;
  out["timed_s"] = timed_s + tail_s;
  out["tail_s"] = tail_s;
  out["step_ms_without_save"] = Mean(without_save);
  out["step_ms_with_save"] =
      with_save.empty() ? nlohmann::json(nullptr) : nlohmann::json(Mean(with_save));
  out["steps_with_save"] = with_save.size();
  out["steps_without_save"] = without_save.size();
  out["peak_extra_rss_save_step_bytes"] =
      save_peak_extra < 0 || !reset_ok ? nlohmann::json(nullptr) : nlohmann::json(save_peak_extra);
  out["peak_extra_rss_plain_step_bytes"] = plain_peak_extra < 0 || !reset_ok
                                               ? nlohmann::json(nullptr)
                                               : nlohmann::json(plain_peak_extra);
  if (mode != "none") {
    out["checkpoint_bytes"] = DirectoryBytes(std::filesystem::path(dir));
    int64_t staging = 0;
    for (const zt::BufferSpec& b : (*trainer)->plan().buffers) {
      if (b.name == "checkpoint.staging") staging = b.bytes();
    }
    out["staging_bytes"] = staging;
  }
  std::printf("%s\n", out.dump().c_str());
  std::filesystem::remove_all(scratch);
  return 0;
}
