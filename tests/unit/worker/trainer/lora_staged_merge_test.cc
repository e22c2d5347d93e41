// `zt export --merge-adapters` of a QLoRA checkpoint saved on tensor-parallel ranks or pipeline
// stages (worker/checkpoint/lora_export.cc): the quantized base is joined from the saved ranks'
// shares, each dequantized with its own layout (a TP rank's NF4 share: one-rank codes, absmax
// codes and the group scales they index; INT8: one-rank codes and whole-row scales) and placed
// where one rank holds it. Checked against one rank's dequantized base merged with the same
// adapters, bit for bit.
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/trainer/lora_parallel_runs.h"

namespace zt {
namespace {

// The runs, checks and fixture, with JobSpec, ModelConfig and ParallelConfig.
using namespace lora_parallel_testing;  // NOLINT: lora_parallel_runs.h's names

// The merged model one rank would export with `adapters` (the whole model's, per unit) over
// one rank's quantized base `one_rank_base` (a one-rank run's base buffers of the same job):
// every quantized weight dequantized (DequantizedBase, the kernels' own dequantization), the
// unquantized rest as saved, merged by ExportMergedHuggingFace into `path` in f32.
absl::Status ExportOneRankMerge(const ModelConfig& model, const Bytes& one_rank_base,
                                const std::vector<std::vector<float>>& adapters,
                                const std::string& path) {
  const ModelLayout quantized = BuildModelLayout(model);
  ModelConfig plain = model;
  plain.clear_base_dtype();
  plain.clear_int8_threshold();
  const ModelLayout layout = BuildModelLayout(plain);
  std::vector<std::vector<float>> base(layout.units.size());
  std::vector<const float*> pointers;
  std::vector<std::vector<float>> lora = adapters;
  std::vector<Tensor> unit_lora(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& q = quantized.units[u];
    base[u].assign(static_cast<size_t>(layout.units[u].numel), 0.0f);
    const auto it = one_rank_base.find(q.name + ".params");
    if (it == one_rank_base.end() ||
        it->second.size() < static_cast<size_t>(q.numel) * sizeof(float)) {
      return absl::InternalError(absl::StrCat("no f32 ", q.name, ".params in the one-rank base"));
    }
    const auto* rest = reinterpret_cast<const float*>(it->second.data());
    for (const ParamSpec& p : q.params) {
      const ParamSpec* to = layout.units[u].Find(p.name);
      if (to == nullptr)
        return absl::InternalError(absl::StrCat(p.name, " not in the plain layout"));
      if (!p.quantized) {
        std::memcpy(base[u].data() + to->offset, rest + p.offset, p.numel * sizeof(float));
        continue;
      }
      ZT_ASSIGN_OR_RETURN(const std::vector<float> w,
                          DequantizedBase(one_rank_base, quantized, q, p));
      std::memcpy(base[u].data() + to->offset, w.data(), p.numel * sizeof(float));
    }
    pointers.push_back(base[u].data());
    if (!lora[u].empty()) {
      unit_lora[u] = Tensor(lora[u].data(), DType::kF32, {static_cast<int64_t>(lora[u].size())});
    }
  }
  return ExportMergedHuggingFace(path, plain, layout, pointers, unit_lora, DType::kF32);
}

// Seeded NF4 and INT8 bases saved at TP2, PP2, TP2 × PP2 and TP2 × DP2 (ZeRO-1), and an NF4
// base streamed from model.init_from on TP2 × PP2, after 3 steps: the merged export is one
// rank's dequantized base plus scale·B·A of the checkpoint's adapters (the run's FullAdapters),
// bit for bit: every saved share dequantizes to the one-rank dequantized weight's slice bit for
// bit (QloraBaseOnTensorParallelRanksIsOneRanksSlice), the join places each exactly, and the
// merge runs on the same f32 inputs. (Against a one-rank run's own merged export the adapters
// would differ by reduction noise: the base is what this checks.) Saved at ZeRO-3 (NF4 on
// PP2 × DP2 and TP2 × PP2 × DP2, INT8 on TP2 × DP2), each share's bytes are first joined from
// its data-parallel group's "<unit>.qbase" byte shards.
TEST_F(LoraParallelTrainingTest, MergedExportOfAQuantizedBaseOnStagesAndTensorRanksIsOneRanks) {
  struct Case {
    bool llama;
    ModelConfig::BaseDType dtype;
    int tp, pp, dp;
    bool streamed = false;
    int zero = -1;  // -1: ZeRO-1 with data parallelism, else 0
  };
  const std::string hf = WideHfBase(true, "merge-base.safetensors");
  for (const Case& c :
       {Case{false, ModelConfig::NF4, 2, 1, 1}, Case{true, ModelConfig::INT8, 2, 1, 1},
        Case{true, ModelConfig::NF4, 1, 2, 1}, Case{false, ModelConfig::INT8, 1, 2, 1},
        Case{true, ModelConfig::NF4, 2, 2, 1}, Case{false, ModelConfig::INT8, 2, 1, 2},
        Case{true, ModelConfig::NF4, 2, 2, 1, true},
        Case{true, ModelConfig::NF4, 1, 2, 2, false, 3},
        Case{false, ModelConfig::INT8, 2, 1, 2, false, 3},
        Case{false, ModelConfig::NF4, 2, 2, 2, false, 3}}) {
    const int zero = c.zero >= 0 ? c.zero : (c.dp > 1 ? 1 : 0);
    const std::string what =
        absl::StrCat(c.llama ? "llama" : "gpt2", c.dtype == ModelConfig::NF4 ? " nf4" : " int8",
                     c.streamed ? " init_from" : " seeded", " tp", c.tp, " pp", c.pp, " dp", c.dp,
                     " zero", zero);
    JobSpec one = Wide(Job(c.llama, 1, 1, 0, c.dp, ParallelConfig::ONE_F_ONE_B, c.dtype));
    if (c.streamed) one.mutable_model()->set_init_from(hf);
    JobSpec job = Job(c.llama, c.pp, c.dp, zero, 1, ParallelConfig::ONE_F_ONE_B, c.dtype);
    job.mutable_model()->CopyFrom(one.model());
    job.mutable_parallel()->set_world_size(c.tp * c.pp * c.dp);
    job.mutable_parallel()->set_tensor_parallel(c.tp);
    const std::string tag =
        absl::StrCat(c.llama, static_cast<int>(c.dtype), c.tp, c.pp, c.dp, c.streamed, zero);
    job.mutable_checkpoint()->set_dir((dir_ / ("qmerge-ckpt-" + tag)).string());
    job.mutable_checkpoint()->set_interval_steps(3);
    const Outcome staged = RunAll(job, 3);
    ASSERT_TRUE(staged.status.ok()) << what << ": " << staged.status;
    const Outcome one_rank = RunAll(one, 1);  // its base: one rank's quantization of the same base
    ASSERT_TRUE(one_rank.status.ok()) << what << ": " << one_rank.status;

    const std::string merged = (dir_ / ("qmerge-" + tag)).string();
    const absl::StatusOr<LoraExportResult> exported =
        ExportLoraCheckpoint(job.checkpoint().dir(), merged, {.merge_adapters = true});
    ASSERT_TRUE(exported.ok()) << what << ": " << exported.status();
    const std::string want_path = (dir_ / ("qmerge-want-" + tag + ".safetensors")).string();
    const absl::Status want_written = ExportOneRankMerge(
        staged.job.model(), one_rank.ranks[0].base_before, staged.ranks[0].adapters, want_path);
    ASSERT_TRUE(want_written.ok()) << what << ": " << want_written;
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> got =
        SafetensorsFile::Open((std::filesystem::path(merged) / "model.safetensors").string());
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> want = SafetensorsFile::Open(want_path);
    ASSERT_TRUE(got.ok() && want.ok()) << what;
    ASSERT_EQ((*got)->tensors().size(), (*want)->tensors().size()) << what;
    for (const SafetensorsTensorInfo& w : (*want)->tensors()) {
      const SafetensorsTensorInfo* g = (*got)->Find(w.name);
      ASSERT_NE(g, nullptr) << what << " " << w.name;
      EXPECT_EQ(g->dtype, StDType::kF32) << what << " " << w.name;
      std::vector<float> a(static_cast<size_t>(w.numel())), b(a.size());
      ASSERT_TRUE((*want)->ReadAsF32(w, absl::MakeSpan(a)).ok());
      ASSERT_TRUE((*got)->ReadAsF32(*g, absl::MakeSpan(b)).ok());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << what << " " << w.name << ": not one rank's merged weight";
    }
  }
}

}  // namespace
}  // namespace zt
