// The ranks of a GPU step-loop test job as threads of the test process (sharing the GPU; their
// collectives staged through the host), and the comparisons of two runs' weights: shared by
// the GPU step-loop tests.
#pragma once

#if ZT_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "offload/swap_store.h"
#include "proto/job.pb.h"
#include "worker/comm/store.h"
#include "worker/train/trainer.h"

namespace zt::gpu_test {

struct RunResult {
  std::vector<double> losses, grad_norms, loss_scales;
  std::vector<int64_t> skipped;
  std::vector<std::vector<float>> weights;  // rank 0's FullWeights (a LoRA job's FullAdapters)
  std::vector<std::vector<std::vector<float>>> all_weights;  // every rank's
  std::vector<int64_t> offload_bytes;  // per rank, the last step's bytes to the host and back
};

inline double RelativeL2(const std::vector<std::vector<float>>& got,
                         const std::vector<std::vector<float>>& want) {
  double diff = 0, norm = 0;
  EXPECT_EQ(got.size(), want.size());
  for (size_t u = 0; u < std::min(got.size(), want.size()); ++u) {
    EXPECT_EQ(got[u].size(), want[u].size());
    for (size_t i = 0; i < std::min(got[u].size(), want[u].size()); ++i) {
      const double d = static_cast<double>(got[u][i]) - want[u][i];
      diff += d * d;
      norm += static_cast<double>(want[u][i]) * want[u][i];
    }
  }
  return std::sqrt(diff / norm);
}

inline double MaxAbsDiff(const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t u = 0; u < std::min(a.size(), b.size()); ++u) {
    for (size_t i = 0; i < std::min(a[u].size(), b[u].size()); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[u][i]) - b[u][i]));
    }
  }
  return worst;
}

// The GPU step-loop tests' job: a GPT-2 style model with head size 64 (the CUDA attention
// kernels take D = 64 and 128) — 2 layers, d_model 128, 2 heads, vocabulary 32, T 32 — on
// the token file `train_path`, AdamW at lr 3e-3 clipped at 1, one rank, two CPU threads. Each
// test sets its batch, steps and layout on top.
inline zerotrain::JobSpec GpuTestJob(const std::string& name, const std::string& train_path) {
  zerotrain::JobSpec job;
  job.set_name(name);
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(2);
  m->set_n_head(2);
  m->set_d_model(128);
  m->set_vocab_size(32);
  m->set_max_seq_len(32);
  job.mutable_data()->add_train(train_path);
  job.mutable_data()->set_seq_len(32);
  job.mutable_optimizer()->set_lr(3e-3f);
  job.mutable_optimizer()->set_grad_clip(1.0f);
  job.mutable_resources()->set_cpu_threads(2);
  job.mutable_parallel()->set_world_size(1);
  job.mutable_parallel()->set_comm_timeout_s(120);
  return job;
}

// Every rank of `job` (threads) to `stop_after`, resuming from `resume` when set; `swap`: the
// process's swap store the ranks share (offload to NVMe), as `zt train` shares one.
inline RunResult TrainRanks(const zerotrain::JobSpec& job, int64_t stop_after,
                            const std::string& resume = "", offload::SwapStore* swap = nullptr) {
  const int n = job.parallel().world_size();
  InProcessStore store;
  RunResult run;
  run.all_weights.resize(n);
  run.offload_bytes.resize(n);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      status[r] = [&]() -> absl::Status {
        TrainOptions options;
        options.rank = r;
        options.store = &store;
        options.stop_after_step = stop_after;
        options.resume_dir = resume;
        options.swap_store = swap;
        absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(job, options);
        if (!t.ok()) return t.status();
        absl::Status ran = (*t)->Run([&](const StepRecord& rec) {
          run.offload_bytes[r] = rec.offload_bytes_to_host + rec.offload_bytes_to_device;
          if (r != 0) return;
          run.losses.push_back(rec.loss);
          run.grad_norms.push_back(rec.grad_norm);
          run.loss_scales.push_back(rec.loss_scale);
          run.skipped.push_back(rec.skipped);
        });
        if (!ran.ok()) return ran;
        // A LoRA job's trained weights are its adapters (its base is frozen).
        absl::StatusOr<std::vector<std::vector<float>>> w =
            job.model().has_lora() ? (*t)->FullAdapters() : (*t)->FullWeights();
        if (!w.ok()) return w.status();
        run.all_weights[r] = std::move(*w);
        return absl::OkStatus();
      }();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  run.weights = run.all_weights[0];
  return run;
}

}  // namespace zt::gpu_test

#endif  // ZT_HAVE_CUDA
