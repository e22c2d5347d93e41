// Throughput, memory and communication of one data-parallel job whose N ranks run as threads
// of this process (as `zt train` runs them), printed as one JSON line
// (bench/run_sharding_bench.sh puts the ZeRO stages side by side).
//
//   sharding_bench --config gpt2-small|tiny|tiny-llama --world-size N --stage S
//                  [--tensor-parallel t [--sequence-parallel 0|1]] [--prefetch K]
//                  [--reshard-after-forward 0|1] [--vocab-sharded-embedding -1|0|1]
//                  [--steps N] [--warmup N] [--threads-per-rank T] [--gemm onednn|openblas]
//                  [--precision fp32|bf16]
//                  [--pipeline-parallel p --micro-batches m [--schedule gpipe|1f1b|interleaved]
//                   [--virtual-stages v] [--n-layer L]]
//
// Every data-parallel rank trains the configuration's micro-batch (gpt2-small 4 × 256, as
// training_bench), so the job trains N / t times the tokens of one rank per step (the t ranks
// of a tensor-parallel group share one batch). With t > 1 the line also carries the
// tensor-parallel bytes each rank should send per step by Megatron's count
// (tp_comm_bytes_formula_per_step_per_rank, see TensorParallelBytes). --threads-per-rank 0
// (default) leaves resources.cpu_threads at 0: the machine's cores divided among the ranks.
//
// Timing: the ranks meet at a barrier after the warm-up steps and again after the last timed
// step; tokens_per_s is the job's tokens over the wall time between the two. step_ms is the
// median over timed steps of the slowest rank's step. Communication, per rank and per timed
// step: bytes sent (and received), seconds the communicator's worker spent in collectives
// (comm_s) and seconds the compute thread blocked on them (wait_s); hidden_fraction =
// 1 − Σwait / Σcomm over ranks, clamped to [0, 1], the share of communication that overlap
// hid behind compute (null when no rank sent a byte). Memory: the process's VmHWM and
// the baseline VmRSS read after every rank thread's OpenMP pool and GEMM kernels are up and
// before any trainer allocates, and VmRSS/VmHWM again once every rank is set up, before any
// step (set-up's transient peak); per rank the memory plan and the arenas' high-water marks,
// in total and by category.
// Pipeline parallelism (p > 1): m micro-batches per step (train.grad_accum_steps), the schedule
// and its chunks; the line carries pipeline_bubble, the median over timed steps of the
// trainer's measured bubble (StepRecord::pipeline_bubble), beside the unit-time formula
// (p − 1)/(v·m + p − 1) (worker/plan/pipeline_bubble.h). --n-layer overrides the
// configuration's block count (the interleaved schedule needs it divisible by p · v).
#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bench_configs.h"
#include "kernels/linear.h"
#include "nlohmann/json.hpp"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"
#include "worker/job/job_loading.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string config = "gpt2-small";
  int world_size = 2;
  int tensor_parallel = 1;
  int sequence_parallel = 0;
  int stage = 0;
  int prefetch = 1;
  int reshard_after_forward = 1;
  // parallel.vocab_sharded_embedding: -1 leaves it unset (the plan decides), 0 false, 1 true.
  int vocab_sharded_embedding = -1;
  int steps = 4;
  int warmup = 2;
  int threads_per_rank = 0;
  std::string gemm = "onednn";
  int pipeline_parallel = 1;
  int micro_batches = 1;
  int virtual_stages = 1;
  int n_layer = 0;  // 0: the configuration's
  std::string schedule = "1f1b";
  // bf16: parameters, compute and gradients in bf16 with f32 master weights (the plan's
  // layout tables' precision); fp32: the configuration's.
  std::string precision = "fp32";
};

// Parses "--flag value" pairs; errors name the flag and the rule it broke.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  struct IntFlag {
    const char* name;
    int* value;
    int min;
    int max;
  };
  const IntFlag ints[] = {{"--world-size", &f.world_size, 1, 1024},
                          {"--tensor-parallel", &f.tensor_parallel, 1, 1024},
                          {"--sequence-parallel", &f.sequence_parallel, 0, 1},
                          {"--stage", &f.stage, 0, 3},
                          {"--prefetch", &f.prefetch, 0, 1024},
                          {"--reshard-after-forward", &f.reshard_after_forward, 0, 1},
                          {"--vocab-sharded-embedding", &f.vocab_sharded_embedding, -1, 1},
                          {"--steps", &f.steps, 1, 1 << 20},
                          {"--warmup", &f.warmup, 0, 1 << 20},
                          {"--threads-per-rank", &f.threads_per_rank, 0, 4096},
                          {"--pipeline-parallel", &f.pipeline_parallel, 1, 1024},
                          {"--micro-batches", &f.micro_batches, 1, 1 << 20},
                          {"--virtual-stages", &f.virtual_stages, 1, 1024},
                          {"--n-layer", &f.n_layer, 0, 1 << 20}};
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[i + 1];
    if (flag == "--config") {
      if (!zt::bench::IsKnownConfig(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--config is '", value, "'; it must be gpt2-small, tiny or tiny-llama"));
      }
      f.config = value;
      continue;
    }
    if (flag == "--schedule") {
      if (value != "gpipe" && value != "1f1b" && value != "interleaved") {
        return absl::InvalidArgumentError(
            absl::StrCat("--schedule is '", value, "'; it must be gpipe, 1f1b or interleaved"));
      }
      f.schedule = value;
      continue;
    }
    if (flag == "--precision") {
      if (value != "fp32" && value != "bf16") {
        return absl::InvalidArgumentError(
            absl::StrCat("--precision is '", value, "'; it must be fp32 or bf16"));
      }
      f.precision = value;
      continue;
    }
    if (flag == "--gemm") {
      if (value != "onednn" && value != "openblas") {
        return absl::InvalidArgumentError(
            absl::StrCat("--gemm is '", value, "'; it must be onednn or openblas"));
      }
      f.gemm = value;
      continue;
    }
    const IntFlag* match = nullptr;
    for (const IntFlag& candidate : ints) {
      if (flag == candidate.name) match = &candidate;
    }
    if (match == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
    int parsed = 0;
    if (!absl::SimpleAtoi(value, &parsed) || parsed < match->min || parsed > match->max) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " is '", value, "'; it must be an integer in ", match->min, "..", match->max));
    }
    *match->value = parsed;
  }
  return f;
}

// What one rank measured.
struct RankResult {
  absl::Status status;
  std::vector<zt::StepRecord> timed;      // one per timed step
  zt::CommStats comm_before, comm_after;  // around the timed steps
  double wait_before = 0, wait_after = 0;
  nlohmann::json memory;  // plan and arena high-water, total and by category
  int threads = 0;
  std::string gemm;
};

nlohmann::json MemoryReport(const zt::Trainer& trainer) {
  nlohmann::json plan, high_water;
  for (int c = 0; c < zt::kMemoryCategoryCount; ++c) {
    const auto category = static_cast<zt::MemoryCategory>(c);
    plan[zt::MemoryCategoryName(category)] = trainer.plan().CategoryBytes(category);
    high_water[zt::MemoryCategoryName(category)] = trainer.arenas().BytesInUse(category);
  }
  return {{"plan_total_bytes", trainer.plan().TotalBytes()},
          {"arena_high_water_bytes", trainer.arenas().TotalBytesInUse()},
          {"plan_by_category", plan},
          {"arena_high_water_by_category", high_water}};
}

// Records the time each phase of the timing barrier completes.
struct MarkTime {
  std::array<Clock::time_point, 2>* marks;
  int* next;
  void operator()() noexcept { (*marks)[(*next)++] = Clock::now(); }
};

// The job's phases, in the order every rank thread goes through them. A rank that fails
// drops out of the timing barrier, so the others never wait on it there.
struct Rendezvous {
  explicit Rendezvous(int world)
      : warmed(world),
        created(world),
        timing(world, MarkTime{.marks = &marks, .next = &next_mark}) {}
  std::latch warmed;            // every rank's thread pool and GEMM kernels are up
  std::latch baseline_read{1};  // the main thread has read the memory baseline
  std::latch created;           // every rank's Trainer::Create returned (or its rank failed)
  std::latch setup_read{1};     // the main thread has read the memory after set-up
  // The timing barrier completes twice: after the warm-up steps (marks[0]) and after the
  // timed steps (marks[1]).
  std::array<Clock::time_point, 2> marks{};
  int next_mark = 0;
  std::barrier<MarkTime> timing;
};

void RunRank(const zerotrain::JobSpec& job, const Flags& flags, zt::Store* store, int rank,
             Rendezvous* rv, RankResult* out) {
  zt::DeviceContext warm = zt::JobDeviceContext(job);
  warm.cpu_gemm = flags.gemm == "openblas" ? zt::CpuGemm::kOpenBlas : zt::CpuGemm::kOneDnn;
  out->threads = warm.num_threads;
  out->status = zt::bench::WarmUpGemm(warm);
  rv->warmed.count_down();
  rv->baseline_read.wait();
  if (!out->status.ok()) {
    rv->created.count_down();
    rv->timing.arrive_and_drop();
    return;
  }
  absl::StatusOr<std::unique_ptr<zt::Trainer>> created =
      zt::Trainer::Create(job, {.rank = rank, .store = store});
  rv->created.count_down();
  rv->setup_read.wait();
  if (!created.ok()) {
    out->status = created.status();
    rv->timing.arrive_and_drop();
    return;
  }
  zt::Trainer& trainer = **created;
  trainer.set_cpu_gemm(warm.cpu_gemm);
  out->gemm = zt::CpuGemmDescription(trainer.context().cpu_gemm);
  for (int s = 0; s < flags.warmup + flags.steps; ++s) {
    if (s == flags.warmup) {
      rv->timing.arrive_and_wait();
      out->comm_before = trainer.comm_stats();
      out->wait_before = trainer.comm_wait_seconds();
    }
    absl::StatusOr<zt::StepRecord> r = trainer.Step();
    if (!r.ok()) {
      out->status =
          absl::Status(r.status().code(), absl::StrCat("step ", s + 1, ": ", r.status().message()));
      rv->timing.arrive_and_drop();
      return;
    }
    if (s >= flags.warmup) out->timed.push_back(*r);
  }
  out->comm_after = trainer.comm_stats();
  out->wait_after = trainer.comm_wait_seconds();
  rv->timing.arrive_and_wait();
  out->memory = MemoryReport(trainer);
}

// The first rank that failed on its own rather than one that timed out waiting for it.
absl::Status FirstFailure(const std::vector<RankResult>& results) {
  const absl::Status* failed = nullptr;
  int failed_rank = -1;
  for (int r = 0; r < static_cast<int>(results.size()); ++r) {
    const absl::Status& s = results[r].status;
    if (s.ok()) continue;
    if (failed == nullptr || (failed->code() == absl::StatusCode::kDeadlineExceeded &&
                              s.code() != absl::StatusCode::kDeadlineExceeded)) {
      failed = &s;
      failed_rank = r;
    }
  }
  if (failed == nullptr) return absl::OkStatus();
  return absl::Status(failed->code(), absl::StrCat("rank ", failed_rank, ": ", failed->message()));
}

// The process's resident memory (bytes) read by the main thread while every rank waits.
struct ProcessMemory {
  int64_t baseline = 0;          // VmRSS before any trainer allocates
  int64_t after_setup = 0;       // VmRSS once every Trainer::Create returned
  int64_t peak_after_setup = 0;  // VmHWM then: set-up's transient peak, before any step
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes one rank of a tensor-parallel group of t sends per step (no activation checkpointing,
// one micro-batch), as Gloo's ring all-reduce (2(t − 1)/t of the data) and all-gather ((t − 1)
// times the input) count them: per micro-batch B·T·C elements all-reduced by the embedding,
// by each block's attention and MLP in the forward (Megatron's g) and again in the backward
// (f), and by the head's input gradient: (2 + 4L)·B·T·C; the parallel cross-entropy's
// (Σexp, target logit) pairs, 2·B·T; its row maxima all-gathered, B·T; and the step's
// statistics, 6·N f32 of the data-parallel group all-gathered over the TP group.
double TensorParallelBytes(const zerotrain::JobSpec& job, int t, int data_parallel) {
  const double B = job.train().micro_batch_size(), T = job.data().seq_len();
  const double C = job.model().d_model(), L = job.model().n_layer();
  const double all_reduced = (2 + 4 * L) * B * T * C + 2 * B * T;
  const double gathered = B * T + 6.0 * data_parallel;
  double bytes = 2.0 * (t - 1) / t * 4 * all_reduced + (t - 1) * 4 * gathered;
  if (job.parallel().sequence_parallel()) {
    // Sequence parallelism: each all-reduce above becomes an all-gather + reduce-scatter of the
    // same ring bytes; on top, the backward gathers ln1's and ln2's token-row shards again
    // (2L all-gathers of B·T·C/t), and the norms' gradients (GPT-2: 4C a block + 2C; Llama 2C
    // a block + C) are all-reduced once a step.
    const bool gpt2 = job.model().family() == zerotrain::ModelConfig::GPT2;
    const double norms = gpt2 ? (4 * L + 2) * C : (2 * L + 1) * C;
    bytes += 2 * L * (t - 1) * (B * T / t) * C * 4 + 2.0 * (t - 1) / t * 4 * norms;
  }
  return bytes;
}

// The JSON line: job-wide figures first, then one object per rank.
nlohmann::json Report(const Flags& flags, const zerotrain::JobSpec& job,
                      const std::vector<RankResult>& results, double elapsed_s,
                      const ProcessMemory& memory) {
  const int world = flags.world_size;
  // One data-parallel replica's tokens per step: its micro-batches (m under pipelining).
  const int64_t tokens_per_rank_step = int64_t{job.train().micro_batch_size()} *
                                       job.data().seq_len() * job.train().grad_accum_steps();
  const int replicas = world / (flags.tensor_parallel * flags.pipeline_parallel);
  std::vector<double> bubbles;
  for (const zt::StepRecord& r : results[0].timed) {
    if (r.pipeline_bubble) bubbles.push_back(*r.pipeline_bubble);
  }
  const int v = flags.schedule == "interleaved" ? flags.virtual_stages : 1;
  const double p = flags.pipeline_parallel;
  std::vector<double> slowest_step_ms(flags.steps, 0.0);
  double comm_s_total = 0, wait_s_total = 0;
  int64_t sent_total = 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world; ++r) {
    const RankResult& rr = results[r];
    int64_t sent = 0, received = 0;
    double comm_s = 0, wait_s = rr.wait_after - rr.wait_before;
    nlohmann::json sent_by_kind = nlohmann::json::object();
    for (int k = 0; k < zt::kNumCommKinds; ++k) {
      const zt::CommStats::Entry& a = rr.comm_after.by_kind[k];
      const zt::CommStats::Entry& b = rr.comm_before.by_kind[k];
      sent += a.bytes_sent - b.bytes_sent;
      received += a.bytes_received - b.bytes_received;
      comm_s += a.seconds - b.seconds;
      if (a.calls != b.calls) {
        sent_by_kind[zt::CommKindName(static_cast<zt::CommKind>(k))] =
            static_cast<double>(a.bytes_sent - b.bytes_sent) / flags.steps;
      }
    }
    for (int s = 0; s < flags.steps; ++s) {
      slowest_step_ms[s] = std::max(slowest_step_ms[s], rr.timed[s].step_ms);
    }
    comm_s_total += comm_s;
    sent_total += sent;
    wait_s_total += wait_s;
    nlohmann::json rank = rr.memory;
    rank["rank"] = r;
    rank["comm_bytes_sent_per_step"] = static_cast<double>(sent) / flags.steps;
    rank["comm_bytes_received_per_step"] = static_cast<double>(received) / flags.steps;
    rank["comm_bytes_sent_per_step_by_kind"] = sent_by_kind;
    rank["comm_s_per_step"] = comm_s / flags.steps;
    rank["wait_s_per_step"] = wait_s / flags.steps;
    if (flags.pipeline_parallel > 1) {
      double busy = 0, span = 0;
      for (const zt::StepRecord& t : rr.timed) {
        busy += t.pipeline_busy_s;
        span += t.pipeline_span_s;
      }
      rank["pipeline_busy_s_per_step"] = busy / flags.steps;
      rank["pipeline_span_s_per_step"] = span / flags.steps;
    }
    ranks.push_back(rank);
  }
  const auto per_rank_mean = [&](const char* key) {
    double sum = 0;
    for (const nlohmann::json& r : ranks) sum += r[key].get<double>();
    return sum / world;
  };
  const auto per_rank_max = [&](const char* key) {
    int64_t most = 0;
    for (const nlohmann::json& r : ranks) most = std::max(most, r[key].get<int64_t>());
    return most;
  };
  // One rank alone still runs trivial collectives (the loss sum over one rank) whose
  // bookkeeping time is not communication worth hiding.
  nlohmann::json hidden = nullptr;
  if (sent_total > 0 && comm_s_total > 0) {
    hidden = std::clamp(1.0 - wait_s_total / comm_s_total, 0.0, 1.0);
  }
  return {
      {"impl", "zerotrain"},
      {"config", flags.config},
      {"world_size", world},
      {"tensor_parallel", flags.tensor_parallel},
      {"sequence_parallel", flags.sequence_parallel == 1},
      {"tp_comm_bytes_formula_per_step_per_rank",
       flags.tensor_parallel > 1 ? nlohmann::json(TensorParallelBytes(
                                       job, flags.tensor_parallel, world / flags.tensor_parallel))
                                 : nlohmann::json(nullptr)},
      {"stage", flags.stage},
      {"prefetch", flags.prefetch},
      {"reshard_after_forward", flags.reshard_after_forward == 1},
      {"vocab_sharded_embedding", zt::VocabularyShardedEmbedding(job)},
      {"threads_per_rank", results[0].threads},
      {"gemm", results[0].gemm},
      {"precision", flags.precision},
      {"micro_batch_per_rank", job.train().micro_batch_size()},
      {"seq_len", job.data().seq_len()},
      {"warmup_steps", flags.warmup},
      {"timed_steps", flags.steps},
      {"pipeline_parallel", flags.pipeline_parallel},
      {"schedule",
       flags.pipeline_parallel > 1 ? nlohmann::json(flags.schedule) : nlohmann::json(nullptr)},
      {"virtual_stages", v},
      {"micro_batches", job.train().grad_accum_steps()},
      {"n_layer", job.model().n_layer()},
      {"pipeline_bubble",
       bubbles.empty() ? nlohmann::json(nullptr) : nlohmann::json(Median(bubbles))},
      {"pipeline_bubble_formula",
       flags.pipeline_parallel > 1
           ? nlohmann::json((p - 1) / (v * job.train().grad_accum_steps() + p - 1))
           : nlohmann::json(nullptr)},
      {"tokens_per_s",
       static_cast<double>(replicas * tokens_per_rank_step * flags.steps) / elapsed_s},
      {"step_ms", Median(slowest_step_ms)},
      {"peak_rss_bytes", zt::bench::ProcStatusBytes("VmHWM:")},
      {"baseline_rss_bytes", memory.baseline},
      {"rss_after_setup_bytes", memory.after_setup},
      {"peak_rss_after_setup_bytes", memory.peak_after_setup},
      {"plan_total_bytes_max_rank", per_rank_max("plan_total_bytes")},
      {"arena_high_water_bytes_max_rank", per_rank_max("arena_high_water_bytes")},
      {"comm_bytes_per_step_per_rank", per_rank_mean("comm_bytes_sent_per_step")},
      {"comm_s_per_step", per_rank_mean("comm_s_per_step")},
      {"wait_s_per_step", per_rank_mean("wait_s_per_step")},
      {"hidden_fraction", hidden},
      {"final_loss", results[0].timed.back().loss},
      {"ranks", ranks}};
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "sharding_bench: %s\n", std::string(flags.status().message()).c_str());
    return 2;
  }
  const std::string dir = zt::bench::ScratchDir("zt-sharding-bench-");
  std::filesystem::create_directories(dir);
  const std::string data = dir + "/train.bin";
  zerotrain::JobSpec job = zt::bench::ConfigJob(flags->config, data);
  if (absl::Status s = zt::bench::WriteRandomTokens(data, job.model().vocab_size()); !s.ok()) {
    std::fprintf(stderr, "sharding_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  zerotrain::ParallelConfig* parallel = job.mutable_parallel();
  parallel->set_world_size(flags->world_size);
  parallel->set_tensor_parallel(flags->tensor_parallel);
  parallel->set_sequence_parallel(flags->sequence_parallel == 1);
  if (flags->n_layer > 0) job.mutable_model()->set_n_layer(flags->n_layer);
  if (flags->pipeline_parallel > 1) {
    parallel->set_pipeline_parallel(flags->pipeline_parallel);
    parallel->set_micro_batches(flags->micro_batches);
    parallel->set_pipeline_schedule(flags->schedule == "gpipe" ? zerotrain::ParallelConfig::GPIPE
                                    : flags->schedule == "interleaved"
                                        ? zerotrain::ParallelConfig::INTERLEAVED
                                        : zerotrain::ParallelConfig::ONE_F_ONE_B);
    if (flags->schedule == "interleaved") parallel->set_virtual_stages(flags->virtual_stages);
  }
  if (flags->micro_batches > 1) job.mutable_train()->set_grad_accum_steps(flags->micro_batches);
  if (flags->precision == "bf16") {
    zerotrain::PrecisionConfig* precision = job.mutable_precision();
    precision->set_param_dtype(zerotrain::PrecisionConfig::BF16);
    precision->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
    precision->set_grad_dtype(zerotrain::PrecisionConfig::BF16);
  }
  parallel->set_zero_stage(flags->stage);
  parallel->set_prefetch_units(flags->prefetch);
  parallel->set_reshard_after_forward(flags->reshard_after_forward == 1);
  if (flags->vocab_sharded_embedding >= 0) {
    parallel->set_vocab_sharded_embedding(flags->vocab_sharded_embedding == 1);
  }
  // A failed rank leaves its peers waiting in a collective; two minutes is many steps of the
  // largest configuration here, and ends such a run well before the default five.
  parallel->set_comm_timeout_s(120);
  job.mutable_resources()->set_cpu_threads(flags->threads_per_rank);
  absl::StatusOr<zerotrain::JobSpec> validated = zt::ValidatedJob(job);
  if (!validated.ok()) {
    std::fprintf(stderr, "sharding_bench: %s\n", validated.status().ToString().c_str());
    return 1;
  }

  const int world = flags->world_size;
  zt::InProcessStore store;
  Rendezvous rv(world);
  std::vector<RankResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back(RunRank, std::cref(*validated), std::cref(*flags), &store, r, &rv,
                         &results[r]);
  }
  rv.warmed.wait();
  const int64_t baseline = zt::bench::ProcStatusBytes("VmRSS:");
  rv.baseline_read.count_down();
  rv.created.wait();
  const int64_t after_setup = zt::bench::ProcStatusBytes("VmRSS:");
  const int64_t peak_after_setup = zt::bench::ProcStatusBytes("VmHWM:");
  rv.setup_read.count_down();
  for (std::thread& t : threads) t.join();
  std::filesystem::remove_all(dir);
  if (absl::Status s = FirstFailure(results); !s.ok()) {
    std::fprintf(stderr, "sharding_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const double elapsed = std::chrono::duration<double>(rv.marks[1] - rv.marks[0]).count();
  std::printf("%s\n", Report(*flags, *validated, results, elapsed,
                             {.baseline = baseline,
                              .after_setup = after_setup,
                              .peak_after_setup = peak_after_setup})
                          .dump()
                          .c_str());
  return 0;
}
