// The lines of CheckEngineSupport for tensor and pipeline parallelism composed with the other
// techniques (optimizer offload, LoRA, Adafactor): what trains is accepted, what does not yet is
// named with its field.
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"
#include "worker/job/job_validation.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using zerotrain::JobSpec;
using zerotrain::OffloadConfig;

// Llama-like with grouped KV heads: 8 query heads, 2 KV heads, 8 blocks.
constexpr char kLlamaYaml[] = R"(
name: composed
model: {family: LLAMA, n_layer: 8, n_head: 8, n_kv_head: 2, d_model: 256, d_ff: 768,
        vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 32}
train: {micro_batch_size: 2, max_steps: 5}
optimizer: {lr: 1.0e-3}
)";

JobSpec With(const std::string& extra) {
  const std::string yaml = std::string(kLlamaYaml) + extra;
  return testing::JobWithDefaults(yaml.c_str());
}

TEST(ComposedParallelSupportTest, PipelinesTrainWithOptimizerAndParameterOffloadCpuAndNvme) {
  for (const char* layout : {"world_size: 4, pipeline_parallel: 2, zero_stage: 1",
                             "world_size: 4, tensor_parallel: 2, pipeline_parallel: 2, "
                             "zero_stage: 2, micro_batches: 4"}) {
    for (const char* offload : {"optimizer: CPU", "optimizer: NVME, nvme_path: /tmp"}) {
      const JobSpec job = With(
          absl::StrCat("parallel: {", layout, "}\noffload: {", offload, ", buffer_count: 4}\n"));
      EXPECT_TRUE(CheckEngineSupport(job).ok())
          << layout << ", " << offload << ": " << CheckEngineSupport(job);
    }
  }
  // Parameter offload (stage-3 shards in the pinned host pool or the swap store) on stages
  // that keep their units gathered for the step or gather them per use.
  for (const char* reshard : {"true", "false"}) {
    for (const char* offload :
         {"optimizer: CPU, params: CPU", "optimizer: NVME, params: NVME, nvme_path: /tmp"}) {
      const JobSpec params = With(absl::StrCat(
          "parallel: {world_size: 4, pipeline_parallel: 2, zero_stage: 3, micro_batches: 4, "
          "reshard_after_forward: ",
          reshard, "}\noffload: {", offload, ", buffer_count: 4}\n"));
      EXPECT_TRUE(CheckEngineSupport(params).ok())
          << reshard << ", " << offload << ": " << CheckEngineSupport(params);
    }
  }
}

}  // namespace
}  // namespace zt
