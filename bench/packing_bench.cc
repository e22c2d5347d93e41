// packing_bench: real (document) tokens per second of a packed run against a padded one, on
// an instruction-shaped jsonl with mixed lengths (issue 17, "Packed vs padded tokens/s").
//
// The jsonl is generated (seeded): 4,000 prompt/completion pairs, prompt 16–200 bytes and
// completion 8–300 bytes, skewed short (the square of a uniform draw), tokenized with the
// byte tokenizer by `zt prepare --format jsonl`'s code. Both runs train the `tiny-llama`
// configuration (bench/bench_configs.h) with data.seq_len 256 (longer pairs truncated) for the
// same number of steps;
// a real token is a position holding a document's token (padding holds id 0, which no byte
// of the generated text is). Prints one line per run and round; fails no test.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/bench_configs.h"
#include "kernels/status_macros.h"
#include "worker/data/prepare.h"
#include "worker/data/tokenizer.h"
#include "worker/job/job_loading.h"
#include "worker/train/micro_batches.h"
#include "worker/train/trainer.h"

namespace zt::bench {
namespace {

std::string Letters(std::mt19937& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(i % 6 == 5 ? ' ' : static_cast<char>('a' + rng() % 26));
  return s;
}

absl::Status WriteJsonl(const std::string& path) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::ofstream out(path);
  for (int i = 0; i < 4000; ++i) {
    const double a = u(rng), b = u(rng);
    const int prompt = 16 + static_cast<int>(184 * a * a);
    const int completion = 8 + static_cast<int>(292 * b * b);
    out << "{\"prompt\": \"" << Letters(rng, prompt) << "\", \"completion\": \""
        << Letters(rng, completion) << "\"}\n";
  }
  if (!out) return absl::InternalError(absl::StrCat("writing ", path));
  return absl::OkStatus();
}

struct Figures {
  double seconds = 0;
  int64_t real_tokens = 0;
  int64_t positions = 0;
};

absl::StatusOr<Figures> Run(const zerotrain::JobSpec& job, int warmup, int steps) {
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(job, {}));
  for (int s = 0; s < warmup; ++s) ZT_RETURN_IF_ERROR(t->Step().status());
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) ZT_RETURN_IF_ERROR(t->Step().status());
  Figures f;
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The same micro-batches again, from the same sampler, to count their real tokens.
  const int B = job.train().micro_batch_size(), T = job.data().seq_len();
  ZT_ASSIGN_OR_RETURN(
      std::unique_ptr<MicroBatches> batches,
      MicroBatches::Open({job.data().train(0)}, "data.train", job.data(),
                         {.B = B, .T = T, .shuffle = job.data().shuffle(),
                          .seed = job.data().seed(), .vocab_size = job.model().vocab_size()}));
  std::vector<int32_t> in(static_cast<size_t>(B) * T), tg(in.size());
  const int64_t accum = job.train().grad_accum_steps();
  for (int64_t k = warmup * accum; k < (warmup + steps) * accum; ++k) {
    ZT_RETURN_IF_ERROR(batches->Fill(k, in.data(), tg.data()).status());
    for (int32_t x : in) f.real_tokens += x != 0 ? 1 : 0;
    f.positions += static_cast<int64_t>(in.size());
  }
  return f;
}

absl::Status Main(int steps, int rounds) {
  const std::string dir = ScratchDir("zt-packing-bench-");
  std::filesystem::create_directories(dir);
  const std::string jsonl = dir + "/sft.jsonl", shard = dir + "/sft.bin";
  ZT_RETURN_IF_ERROR(WriteJsonl(jsonl));
  PrepareStats stats;
  ZT_RETURN_IF_ERROR(PrepareJsonlShard(ByteTokenizer(), {jsonl}, shard, &stats));
  std::printf("data: %lld documents, %lld tokens (mean %.1f a document)\n",
              static_cast<long long>(stats.documents), static_cast<long long>(stats.tokens),
              static_cast<double>(stats.tokens) / stats.documents);
  for (int r = 0; r < rounds; ++r) {
    for (const bool packing : {true, false}) {
      zerotrain::JobSpec spec = ConfigJob("tiny-llama", shard);
      spec.mutable_data()->set_packing(packing);
      spec.mutable_data()->set_shuffle(true);
      // The longest pairs (up to 500 bytes) exceed seq_len 256: both runs cut them the same.
      spec.mutable_data()->set_overlong(zerotrain::DataConfig::TRUNCATE);
      spec.mutable_resources()->set_cpu_threads(2);
      ZT_ASSIGN_OR_RETURN(const zerotrain::JobSpec job, ValidatedJob(spec));
      ZT_ASSIGN_OR_RETURN(const Figures f, Run(job, /*warmup=*/2, steps));
      std::printf("round %d %-6s: %d steps in %.2f s, %lld real tokens of %lld positions "
                  "(%.1f%%), %.0f real tokens/s, %.0f positions/s\n",
                  r + 1, packing ? "packed" : "padded", steps, f.seconds,
                  static_cast<long long>(f.real_tokens), static_cast<long long>(f.positions),
                  100.0 * f.real_tokens / f.positions, f.real_tokens / f.seconds,
                  f.positions / f.seconds);
    }
  }
  std::filesystem::remove_all(dir);
  return absl::OkStatus();
}

}  // namespace
}  // namespace zt::bench

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 10;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 2;
  const absl::Status s = zt::bench::Main(steps, rounds);
  if (!s.ok()) {
    std::fprintf(stderr, "packing_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
