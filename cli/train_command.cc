// `zt train JOBFILE`: load and validate the job, train it in this process — every rank of
// the job as a thread of its own, or the ranks given by --ranks, meeting the other processes'
// ranks through a file-backed rendezvous store — then optionally export the weights and print
// a sample of generated text.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/peft_adapter.h"
#include "worker/comm/store.h"
#include "worker/data/tokenizer.h"
#include "worker/job/failure_kind.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/model/text_generation.h"
#include "worker/job/offload_validation.h"
#include "worker/offload/node_swap_store.h"
#include "worker/train/trainer.h"

namespace zt::cli {
namespace {

absl::StatusOr<DType> ParseExportDType(const std::string& s) {
  if (s == "fp32") return DType::kF32;
  if (s == "bf16") return DType::kBF16;
  if (s == "fp16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--export-dtype: '", s, "' is not one of fp32, bf16, fp16"));
}

absl::Status PrintSample(const Trainer& trainer, const TrainFlags& flags) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(flags.tokenizer);
  if (!tokenizer.ok()) return tokenizer.status();
  std::vector<int32_t> prompt = (*tokenizer)->Encode(flags.prompt);
  if (prompt.empty()) prompt.push_back(0);
  absl::StatusOr<std::vector<int32_t>> tokens =
      GenerateTokens(trainer.context(), trainer.job(), trainer.arenas(), prompt,
                     {.new_tokens = flags.sample_tokens, .seed = trainer.job().train().seed()});
  if (!tokens.ok()) return tokens.status();
  std::cout << "--- sample (" << tokens->size() << " tokens) ---\n"
            << flags.prompt << (*tokenizer)->Decode(*tokens) << "\n---\n";
  return absl::OkStatus();
}

struct RankRange {
  int first = 0;
  int last = 0;
};

absl::StatusOr<RankRange> ParseRanks(const std::string& text, int world_size) {
  if (text.empty()) return RankRange{0, world_size - 1};
  std::vector<std::string> parts = absl::StrSplit(text, '-');
  RankRange r;
  if (parts.size() > 2 || !absl::SimpleAtoi(parts[0], &r.first) ||
      !absl::SimpleAtoi(parts.back(), &r.last)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks: '", text, "' is not A or A-B (rank numbers)"));
  }
  if (r.first < 0 || r.last < r.first || r.last >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks: ", text, " must lie in 0..",
                                                   world_size - 1, " (parallel.world_size ",
                                                   world_size, ")"));
  }
  return r;
}

// What one rank thread does: train, then take part in the export's gather.
absl::Status RunRank(const zerotrain::JobSpec& job, const TrainFlags& flags, TrainOptions options,
                     DType export_dtype, std::unique_ptr<Trainer>* kept) {
  absl::StatusOr<std::unique_ptr<Trainer>> created = Trainer::Create(job, options);
  if (!created.ok()) return created.status();
  Trainer* trainer = created->get();
  if (!flags.quiet && options.rank == 0) {
    std::fprintf(stderr,
                 "zt: %s, %lld parameters, %d rank(s), ZeRO stage %d, plan %.1f MiB "
                 "per rank, metrics in %s\n",
                 job.name().empty() ? "job" : job.name().c_str(),
                 static_cast<long long>(BuildModelLayout(job.model()).total_numel),
                 job.parallel().world_size(), job.parallel().zero_stage(),
                 static_cast<double>(trainer->plan().TotalBytes()) / (1 << 20),
                 options.run_dir.c_str());
  }
  if (absl::Status s = trainer->Run(); !s.ok()) return s;
  if (!flags.export_path.empty() && job.model().has_lora()) {
    // A LoRA job exports what it trained: its adapters, as a PEFT directory. Every rank takes
    // part (a pipeline's stages each hold their blocks' adapters); rank 0 writes.
    absl::StatusOr<std::vector<std::vector<float>>> adapters = trainer->FullAdapters();
    if (!adapters.ok()) return adapters.status();
    if (options.rank == 0) {
      std::vector<Tensor> units;
      for (std::vector<float>& a : *adapters) {
        units.push_back(
            a.empty() ? Tensor() : Tensor(a.data(), DType::kF32, {static_cast<int64_t>(a.size())}));
      }
      if (absl::Status s =
              WritePeftAdapter(job.model(), BuildModelLayout(job.model()), units, flags.export_path,
                               {.base_model_name_or_path = job.model().init_from()});
          !s.ok()) {
        return s;
      }
      if (!flags.quiet) std::fprintf(stderr, "zt: exported %s\n", flags.export_path.c_str());
    }
  } else if (!flags.export_path.empty()) {
    // Every rank takes part in gathering the shards; rank 0 writes.
    absl::StatusOr<std::vector<std::vector<float>>> weights = trainer->FullWeights();
    if (!weights.ok()) return weights.status();
    if (options.rank == 0) {
      std::vector<const float*> units;
      for (const std::vector<float>& w : *weights) units.push_back(w.data());
      // FullWeights' units are the whole model's (a tensor-parallel rank's own are shares).
      if (absl::Status s = ExportHuggingFace(flags.export_path, job.model(),
                                             BuildModelLayout(job.model()), units, export_dtype);
          !s.ok()) {
        return s;
      }
      if (!flags.quiet) std::fprintf(stderr, "zt: exported %s\n", flags.export_path.c_str());
    }
  }
  *kept = std::move(*created);
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTrain(const TrainFlags& flags) {
  absl::StatusOr<zerotrain::JobSpec> loaded =
      LoadValidatedJob(flags.job_file, {.deepspeed_config = flags.deepspeed});
  if (!loaded.ok()) return loaded.status();
  const zerotrain::JobSpec& job = *loaded;
  absl::StatusOr<DType> export_dtype = ParseExportDType(flags.export_dtype);
  if (!export_dtype.ok()) return export_dtype.status();
  const int world = job.parallel().world_size();
  absl::StatusOr<RankRange> ranks = ParseRanks(flags.ranks, world);
  if (!ranks.ok()) return ranks.status();
  const bool all_ranks = ranks->first == 0 && ranks->last == world - 1;
  if (!all_ranks && flags.rendezvous.empty()) {
    return absl::InvalidArgumentError(
        "--ranks: running part of a job's ranks needs --rendezvous DIR, a directory every "
        "process of the job shares");
  }
  if (flags.sample_tokens > 0 && job.parallel().zero_stage() == 3) {
    return absl::InvalidArgumentError(
        "--sample: sampling reads whole parameters, which zero_stage 3 shards; export the "
        "model (--export) and sample from it, or train with zero_stage ≤ 2");
  }
  // Refused before training, not after it: each pipeline stage holds its own units, and the
  // sampler reads the whole model (--export joins the stages: Trainer::FullWeights).
  if (job.parallel().pipeline_parallel() > 1 && flags.sample_tokens > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--sample: parallel.pipeline_parallel ", job.parallel().pipeline_parallel(),
        " leaves each stage's units on its own ranks, and the sampler does not join them; "
        "export the model (--export) and sample from it, or train with pipeline_parallel 1 "
        "to sample"));
  }
  std::unique_ptr<Store> store;
  if (flags.rendezvous.empty()) {
    store = std::make_unique<InProcessStore>();
  } else {
    absl::StatusOr<std::unique_ptr<FileStore>> file_store = FileStore::Create(flags.rendezvous);
    if (!file_store.ok()) return file_store.status();
    store = std::move(*file_store);
  }
  TrainOptions options;
  options.run_dir =
      flags.run_dir.empty()
          ? (std::filesystem::path("runs") / (job.name().empty() ? "job" : job.name())).string()
          : flags.run_dir;
  if (flags.stop_after_step >= 0) options.stop_after_step = flags.stop_after_step;
  options.progress = !flags.quiet;
  options.store = store.get();
  if (flags.resume) {
    options.resume_dir = flags.resume_dir.empty() ? job.checkpoint().dir() : flags.resume_dir;
    if (options.resume_dir.empty()) {
      return absl::InvalidArgumentError(
          "--resume: give the checkpoint directory, or set checkpoint.dir in the job");
    }
    options.resume_fallback = flags.fallback;
    // --resume is the explicit request to continue whatever checkpoints the directory holds.
    options.take_over_checkpoints = true;
  } else if (flags.fallback) {
    return absl::InvalidArgumentError("--fallback: only with --resume");
  }

  const int local = ranks->last - ranks->first + 1;
  // offload.optimizer or offload.params NVME: one swap store for the process, shared by its
  // ranks (RocksDB admits one process per index).
  std::shared_ptr<offload::SwapStore> swap_store;
  if (UsesNvme(job.offload())) {
    std::vector<int> local_ranks;
    for (int r = ranks->first; r <= ranks->last; ++r) local_ranks.push_back(r);
    // A process running part of the ranks (--ranks) may share the node with the job's other
    // processes: each keeps a store of its own beside the node's.
    const std::string directory = all_ranks ? ""
                                            : absl::StrCat(SwapStoreDirectory(job), ".ranks-",
                                                           ranks->first, "-", ranks->last);
    absl::StatusOr<std::shared_ptr<offload::SwapStore>> opened =
        OpenSwapStore(job, local_ranks, nullptr, directory);
    if (!opened.ok()) return opened.status();
    swap_store = std::move(*opened);
    options.swap_store = swap_store.get();
  }
  std::vector<absl::Status> results(local);
  std::vector<std::unique_ptr<Trainer>> trainers(local);
  std::vector<std::thread> threads;
  for (int i = 0; i < local; ++i) {
    threads.emplace_back([&, i] {
      TrainOptions rank_options = options;
      rank_options.rank = ranks->first + i;
      results[i] = RunRank(job, flags, rank_options, *export_dtype, &trainers[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  // The first rank that failed on its own, rather than one that timed out waiting for it or
  // whose communicator was aborted under it: a permanent error (exit 2, the classification the
  // daemon fails a job by) first, then any but a timeout.
  auto weight = [](const absl::Status& s) {
    if (IsPermanentFailure(s)) return 2;
    return s.code() == absl::StatusCode::kDeadlineExceeded ? 0 : 1;
  };
  const absl::Status* failed = nullptr;
  for (const absl::Status& s : results) {
    if (s.ok()) continue;
    if (failed == nullptr || weight(s) > weight(*failed)) failed = &s;
  }
  if (failed != nullptr) {
    const int index = static_cast<int>(failed - results.data());
    return absl::Status(failed->code(), local > 1 ? absl::StrCat("rank ", ranks->first + index,
                                                                 ": ", failed->message())
                                                  : std::string(failed->message()));
  }
  if (flags.sample_tokens > 0 && ranks->first == 0) return PrintSample(*trainers[0], flags);
  return absl::OkStatus();
}

}  // namespace zt::cli
