// QLoRA from a Hugging Face model (issue 17's figure): writes a Llama-shaped model with random
// weights as Hugging Face safetensors in bf16 (once; reused when present), then trains rank-16
// adapters on all seven linear modules over its NF4 base (model.base_dtype NF4 with
// model.init_from, quantized while it streams in), batch 1 × seq_len, FULL activation
// checkpointing, and prints one JSON line per event as it happens (so a run stopped early
// still leaves what it finished):
//
//   {"event":"plan", ...}    the QLoRA job's memory plan (what `zt estimate` prints for the
//                            job file written beside the model) and full fine-tuning's plan
//   {"event":"loaded", ...}  seconds to create the trainer (stream + quantize the base),
//                            VmRSS / VmHWM after it
//   {"event":"step", ...}    each step: loss, seconds, VmHWM so far
//   {"event":"done", ...}    tokens/s over the steps, peak RSS (VmHWM), plan totals
//
//   qlora_bench [--shape 7b|small] [--model-dir DIR] [--kv-heads N] [--steps N]
//               [--seq-len N] [--rank N] [--threads N]
//
// 7b: 32 layers, d_model 4096, 32 heads (--kv-heads: 8 as Llama-3, or 32 as Llama-2-7B),
// d_ff 11008, vocab 32000, untied head. small: the same structure at 2 layers, d_model 256,
// for testing the benchmark itself. The weights are uniform with standard deviation 0.02
// (norms 1), from a counter hash: values do not matter to memory or speed, and a hash writes
// 6.7 G of them in seconds where a normal generator takes minutes.
//
// Peak RSS is the kernel's VmHWM for the whole process: the quantized base, the 16-bit
// embedding and head, the adapters with their AdamW states, activations and scratch, and
// everything set-up held at its highest point.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench/bench_configs.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "worker/checkpoint/hf_interop.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/job/job_loading.h"
#include "worker/model/param_layout.h"
#include "worker/plan/memory_plan.h"
#include "worker/train/trainer.h"

namespace {

using zerotrain::JobSpec;
using zerotrain::ModelConfig;

void Emit(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "qlora_bench: %s\n", s.ToString().c_str());
  return 1;
}

ModelConfig Shape(const std::string& shape, int kv_heads) {
  ModelConfig m;
  m.set_family(ModelConfig::LLAMA);
  const bool big = shape == "7b";
  m.set_n_layer(big ? 32 : 2);
  m.set_d_model(big ? 4096 : 256);
  m.set_n_head(big ? 32 : 4);
  m.set_n_kv_head(kv_heads > 0 ? kv_heads : big ? 8 : 2);
  m.set_d_ff(big ? 11008 : 688);
  m.set_vocab_size(big ? 32000 : 512);
  m.set_max_seq_len(big ? 4096 : 512);
  m.set_tie_embeddings(false);
  return m;
}

// splitmix64 of (tensor, element): uniform in [-1, 1).
float HashUniform(uint64_t tensor, uint64_t i) {
  uint64_t z = (tensor << 40) ^ i;
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1p-52 - 1.0);
}

// Writes config.json and model.safetensors (bf16) of `m` under `dir`, tensor by tensor.
absl::Status WriteModel(const ModelConfig& m, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const zt::ModelLayout layout = zt::BuildModelLayout(m);
  ZT_ASSIGN_OR_RETURN(const std::vector<zt::HfTensor> table, zt::HuggingFaceTensors(m, layout));
  ZT_ASSIGN_OR_RETURN(const nlohmann::json config, zt::HuggingFaceConfig(m, zt::DType::kBF16));
  std::ofstream(dir + "/" + zt::kHfConfigName) << config.dump(2) << "\n";
  std::vector<zt::SafetensorsTensorSpec> specs;
  for (const zt::HfTensor& t : table) specs.push_back({t.name, zt::StDType::kBF16, t.shape});
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<zt::SafetensorsWriter> writer,
                      zt::SafetensorsWriter::Create(dir + "/" + zt::kHfWeightsName,
                                                    std::move(specs), {{"format", "pt"}}));
  // Uniform in ±a has standard deviation a/sqrt(3).
  const float amplitude = 0.02f * std::sqrt(3.0f);
  std::vector<float> values;
  for (size_t k = 0; k < table.size(); ++k) {
    const zt::HfTensor& t = table[k];
    values.resize(t.numel());
    const bool norm = t.shape.size() == 1;
    for (int64_t i = 0; i < t.numel(); ++i) {
      values[i] = norm ? 1.0f : amplitude * HashUniform(k + 1, static_cast<uint64_t>(i));
    }
    ZT_RETURN_IF_ERROR(writer->WriteF32(t.name, values));
  }
  return writer->Finish();
}

std::string JsonOf(const JobSpec& job) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(job, &out, options);
  return out;
}

nlohmann::json PlanJson(const zt::MemoryPlan& plan) {
  nlohmann::json j;
  for (int c = 0; c < zt::kMemoryCategoryCount; ++c) {
    const auto category = static_cast<zt::MemoryCategory>(c);
    if (plan.CategoryBytes(category) > 0) {
      j[zt::MemoryCategoryName(category)] = plan.CategoryBytes(category);
    }
  }
  j["total"] = plan.TotalBytes();
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "small", model_dir;
  int kv_heads = 0, steps = 3, seq_len = 512, rank = 16, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--shape")
      shape = value;
    else if (flag == "--model-dir")
      model_dir = value;
    else if (flag == "--kv-heads")
      kv_heads = std::atoi(value.c_str());
    else if (flag == "--steps")
      steps = std::atoi(value.c_str());
    else if (flag == "--seq-len")
      seq_len = std::atoi(value.c_str());
    else if (flag == "--rank")
      rank = std::atoi(value.c_str());
    else if (flag == "--threads")
      threads = std::atoi(value.c_str());
    else {
      std::fprintf(stderr, "qlora_bench: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (shape != "7b" && shape != "small") {
    std::fprintf(stderr, "qlora_bench: --shape must be 7b or small\n");
    return 2;
  }
  const ModelConfig model = Shape(shape, kv_heads);
  if (model_dir.empty()) {
    model_dir =
        "/work/bench-data/llama-" + shape + "-kv" + std::to_string(model.n_kv_head()) + "-bf16";
  }
  // The writer renames model.safetensors into place only once complete: present means whole.
  const auto t_write = std::chrono::steady_clock::now();
  const bool reused = std::filesystem::exists(model_dir + "/" + zt::kHfWeightsName);
  if (!reused) {
    if (absl::Status s = WriteModel(model, model_dir); !s.ok()) return Fail(s);
  }
  const double write_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_write).count();
  const std::string data = model_dir + "/bench-tokens.bin";
  if (!std::filesystem::exists(data)) {
    if (absl::Status s = zt::bench::WriteRandomTokens(data, model.vocab_size()); !s.ok()) {
      return Fail(s);
    }
  }

  JobSpec job;
  job.set_name("qlora-bench-" + shape);
  *job.mutable_model() = model;
  job.mutable_model()->set_init_from(model_dir);
  job.mutable_model()->set_base_dtype(ModelConfig::NF4);
  auto* lora = job.mutable_model()->mutable_lora();
  lora->set_rank(rank);
  lora->set_alpha(2.0f * rank);
  for (const char* m :
       {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}) {
    lora->add_target_modules(m);
  }
  // 16-bit embedding, head and norms (the part of the base that is not NF4).
  job.mutable_precision()->set_param_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_precision()->set_compute_dtype(zerotrain::PrecisionConfig::BF16);
  job.mutable_memory()->set_activation_checkpointing(zerotrain::MemoryConfig::FULL);
  job.mutable_data()->add_train(data);
  job.mutable_data()->set_seq_len(seq_len);
  job.mutable_train()->set_micro_batch_size(1);
  job.mutable_train()->set_max_steps(steps);
  job.mutable_optimizer()->set_type(zerotrain::OptimizerConfig::ADAMW);
  job.mutable_optimizer()->set_lr(1e-4f);
  job.mutable_resources()->set_cpu_threads(threads);

  // Full fine-tuning of the same model: every weight trains, bf16 parameters with an fp32
  // master and fp32 AdamW states (the usual mixed-precision recipe), same batch and
  // checkpointing.
  JobSpec full = job;
  full.set_name("full-ft-bench-" + shape);
  full.mutable_model()->clear_lora();
  full.mutable_model()->clear_base_dtype();

  auto validated = zt::ValidatedJob(job);
  if (!validated.ok()) return Fail(validated.status());
  auto validated_full = zt::ValidatedJob(full);
  if (!validated_full.ok()) return Fail(validated_full.status());
  // The job files, for `zt estimate` (bench/run_qlora_bench.sh prints its tables).
  std::ofstream(model_dir + "/qlora_job.json") << JsonOf(job) << "\n";
  std::ofstream(model_dir + "/full_ft_job.json") << JsonOf(full) << "\n";
  const zt::MemoryPlan plan = zt::PlanMemory(*validated);
  const zt::MemoryPlan full_plan = zt::PlanMemory(*validated_full);
  Emit({{"event", "plan"},
        {"shape", shape},
        {"model_dir", model_dir},
        {"model_written", !reused},
        {"write_s", write_s},
        {"n_kv_head", model.n_kv_head()},
        {"qlora_plan", PlanJson(plan)},
        {"full_finetune_plan", PlanJson(full_plan)}});

  {
    zt::DeviceContext warm = zt::CpuContext(threads);
    if (absl::Status s = zt::bench::WarmUpGemm(warm); !s.ok()) return Fail(s);
  }
  const int64_t baseline = zt::bench::ProcStatusBytes("VmRSS:");
  const auto t_load = std::chrono::steady_clock::now();
  auto trainer = zt::Trainer::Create(*validated, {});
  if (!trainer.ok()) return Fail(trainer.status());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  Emit({{"event", "loaded"},
        {"load_s", load_s},
        {"baseline_rss_bytes", baseline},
        {"rss_bytes", zt::bench::ProcStatusBytes("VmRSS:")},
        {"peak_rss_bytes", zt::bench::ProcStatusBytes("VmHWM:")},
        {"gemm", zt::CpuGemmDescription((*trainer)->context().cpu_gemm)}});

  double total_s = 0, loss = 0;
  bool finite = true;
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = (*trainer)->Step();
    if (!r.ok()) return Fail(r.status());
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_s += sec;
    loss = r->loss;
    finite = finite && std::isfinite(loss);
    Emit({{"event", "step"},
          {"step", s + 1},
          {"loss", loss},
          {"seconds", sec},
          {"peak_rss_bytes", zt::bench::ProcStatusBytes("VmHWM:")}});
  }
  const int64_t tokens = int64_t{steps} * seq_len;
  Emit({{"event", "done"},
        {"shape", shape},
        {"steps", steps},
        {"seq_len", seq_len},
        {"threads", threads},
        {"loss_finite", finite},
        {"final_loss", loss},
        {"tokens_per_s", static_cast<double>(tokens) / total_s},
        {"load_s", load_s},
        {"peak_rss_bytes", zt::bench::ProcStatusBytes("VmHWM:")},
        {"qlora_plan_total_bytes", plan.TotalBytes()},
        {"full_finetune_plan_total_bytes", full_plan.TotalBytes()}});
  return 0;
}
