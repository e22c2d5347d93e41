// The `zt` binary as a user runs it: bad input gets a clear error naming the field or file
// and the rule, with exit code 2 and no crash; export → import round-trips bit for bit.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/scratch_dir_test.h"
#include "tests/integration/zt_process.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using testing::RunResult;

RunResult RunZt(const std::string& args) { return testing::RunZtCommand(args); }

std::string ReadBytes(const std::string& path) { return testing::ReadText(path); }

class ZtCliTest : public testing::ScratchDirTest {
 protected:
  ZtCliTest() : ScratchDirTest("zt-cli-test") {}

  // A valid tiny job; `extra` lines are appended (YAML), `model_extra` into the model map.
  std::string WriteJob(const std::string& name, const std::string& model_extra = "",
                       const std::string& data_file = "", const std::string& extra = "") {
    std::ofstream f(Path(name));
    f << "name: cli-test\n"
         "model:\n"
         "  family: GPT2\n"
         "  n_layer: 1\n"
         "  n_head: 2\n"
         "  d_model: 16\n"
         "  vocab_size: 64\n"
         "  max_seq_len: 16\n"
      << model_extra << "data:\n  train: [" << (data_file.empty() ? Path("train.bin") : data_file)
      << "]\n  seq_len: 16\n"
         "train:\n  micro_batch_size: 2\n  max_steps: 3\n"
         "optimizer:\n  lr: 0.001\n"
      << extra;
    return Path(name);
  }

  // Replaces the first `from` in file `path` by `to`.
  static void Edit(const std::string& path, const std::string& from, const std::string& to) {
    std::string text = ReadBytes(path);
    ASSERT_NE(text.find(from), std::string::npos) << from;
    text.replace(text.find(from), from.size(), to);
    std::ofstream(path) << text;
  }
};

// offload.optimizer CPU and NVME train through `zt train` (the host optimizer's figures, and
// the swap's, in every metrics line), and offload.params NVME beside optimizer NVME; what the
// engine does not train yet is refused, naming the field.
TEST_F(ZtCliTest, TrainsWithOptimizerOffloadAndNamesWhatItDoesNotTrainYet) {
  const std::string offload =
      "parallel:\n  zero_stage: 2\n"
      "offload:\n  optimizer: CPU\n  buffer_count: 2\n  buffer_size: 65536\n";
  const RunResult r = RunZt("train " + WriteJob("offload.yaml", "", "", offload) +
                            " --quiet --run-dir " + Path("run"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream metrics(Path("run/metrics.jsonl"));
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) {
    ++lines;
    EXPECT_THAT(line,
                AllOf(HasSubstr("\"host_optimizer_s\""), HasSubstr("\"offload_bytes_to_host\"")));
  }
  EXPECT_EQ(lines, 3);
  // offload.optimizer NVME trains too: its states go through the swap store under nvme_path.
  const RunResult nvme = RunZt(
      "train " +
      WriteJob("nvme.yaml", "", "",
               "parallel:\n  zero_stage: 2\noffload:\n  optimizer: NVME\n  nvme_path: " + Path("") +
                   "\n  buffer_count: 6\n  buffer_size: 65536\n") +
      " --quiet --run-dir " + Path("nvme-run"));
  EXPECT_EQ(nvme.exit_code, 0) << nvme.output;
  std::ifstream nvme_metrics(Path("nvme-run/metrics.jsonl"));
  lines = 0;
  while (std::getline(nvme_metrics, line)) {
    ++lines;
    EXPECT_THAT(line, AllOf(HasSubstr("\"swap_bytes_in\""), HasSubstr("\"swap_bytes_out\"")));
  }
  EXPECT_EQ(lines, 3);
  // The swap store is scratch: deleted when the run ends, leaving nvme_path as it was.
  EXPECT_FALSE(std::filesystem::exists(Path("zerotrain-swap")));
  // Swapped parameters without swapped states do not train: refused, naming the field.
  const RunResult params = RunZt(
      "train " + WriteJob("params.yaml", "", "",
                          "parallel:\n  zero_stage: 3\noffload:\n  params: NVME\n  nvme_path: " +
                              Path("") + "\n  buffer_size: 65536\n"));
  EXPECT_NE(params.exit_code, 0) << params.output;
  EXPECT_THAT(params.output, HasSubstr("offload.params: NVME trains with offload.optimizer NVME"));
  // ... and beside them they do (ZeRO-Infinity): the shards go through the swap store too.
  const RunResult infinity = RunZt(
      "train " +
      WriteJob("infinity.yaml", "", "",
               "parallel:\n  zero_stage: 3\noffload:\n  optimizer: NVME\n  params: NVME\n"
               "  nvme_path: " +
                   Path("") + "\n  buffer_count: 8\n  buffer_size: 65536\n") +
      " --quiet --run-dir " + Path("infinity-run"));
  EXPECT_EQ(infinity.exit_code, 0) << infinity.output;
  std::ifstream infinity_metrics(Path("infinity-run/metrics.jsonl"));
  lines = 0;
  while (std::getline(infinity_metrics, line)) {
    ++lines;
    EXPECT_THAT(line, HasSubstr("\"swap_bytes_in\""));
  }
  EXPECT_EQ(lines, 3);
}

TEST_F(ZtCliTest, TrainsAValidJob) {
  const RunResult r = RunZt("train " + WriteJob("ok.yaml") + " --quiet --run-dir " + Path("run"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream metrics(Path("run/metrics.jsonl"));
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) ++lines;
  EXPECT_EQ(lines, 3);
}

TEST_F(ZtCliTest, UnknownFieldIsNamed) {
  const RunResult r = RunZt("train " + WriteJob("bad.yaml", "  d_modle: 3\n"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("model.d_modle"), HasSubstr("unknown")));
}

TEST_F(ZtCliTest, HeadsMustDivideChannels) {
  std::string job = WriteJob("bad.yaml");
  // d_model 16 with n_head 3.
  Edit(job, "n_head: 2", "n_head: 3");
  const RunResult r = RunZt("train " + job);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("model.d_model"), HasSubstr("divisible")));
}

TEST_F(ZtCliTest, KvHeadsMustDivideHeads) {
  std::string job = WriteJob("bad.yaml", "  n_kv_head: 3\n");
  Edit(job, "GPT2", "LLAMA");
  const RunResult r = RunZt("train " + job);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("model.n_head"), HasSubstr("n_kv_head")));
}

TEST_F(ZtCliTest, SeqLenBeyondMaxSeqLen) {
  std::string job = WriteJob("bad.yaml");
  Edit(job, "seq_len: 16\ntrain", "seq_len: 32\ntrain");
  const RunResult r = RunZt("train " + job);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("data.seq_len"), HasSubstr("max_seq_len")));
}

TEST_F(ZtCliTest, MissingDataFileIsNamed) {
  const RunResult r = RunZt("train " + WriteJob("bad.yaml", "", Path("nope.bin")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("data.train[0]"), HasSubstr("nope.bin")));
}

// data.train patterns: one that matches trains; one that matches nothing is named, exit 2.
TEST_F(ZtCliTest, DataPatternsTrainAndAnEmptyOneIsNamed) {
  std::filesystem::create_directories(Path("shards"));
  std::filesystem::copy_file(Path("train.bin"), Path("shards/shard_0.bin"));
  std::filesystem::copy_file(Path("train.bin"), Path("shards/shard_1.bin"));
  const RunResult ok =
      RunZt("train " + WriteJob("ok.yaml", "", "\"" + Path("shards/shard_*.bin") + "\"") +
            " --quiet --run-dir " + Path("run"));
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  const RunResult r =
      RunZt("train " + WriteJob("bad.yaml", "", "\"" + Path("shards/val_*.bin") + "\""));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("data.train[0]: pattern '" + Path("shards/val_*.bin") +
                                  "' matches no file"));
}

TEST_F(ZtCliTest, TokenBeyondVocabularyIsNamed) {
  ASSERT_TRUE(WriteTokenShard(Path("big.bin"), std::vector<int32_t>(100, 70), 128).ok());
  const RunResult r = RunZt("train " + WriteJob("bad.yaml", "", Path("big.bin")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("big.bin"), HasSubstr("70"), HasSubstr("vocab_size")));
}

TEST_F(ZtCliTest, TruncatedShardIsNamed) {
  std::filesystem::copy_file(Path("train.bin"), Path("cut.bin"));
  std::filesystem::resize_file(Path("cut.bin"), 64 + 100);
  const RunResult r = RunZt("train " + WriteJob("bad.yaml", "", Path("cut.bin")));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, AllOf(HasSubstr("cut.bin"), HasSubstr("truncated")));
}

TEST_F(ZtCliTest, MissingJobFileIsNamed) {
  const RunResult r = RunZt("train " + Path("absent.yaml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("absent.yaml"));
}

TEST_F(ZtCliTest, ExportThenImportRoundTripsBitForBit) {
  for (const std::string family : {"GPT2", "LLAMA"}) {
    const std::string model_extra = family == "LLAMA" ? "  n_kv_head: 1\n" : "";
    const std::string job = WriteJob("a.yaml", model_extra);
    Edit(job, "GPT2", family);
    RunResult r = RunZt("train " + job + " --quiet --export " + Path("a.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string job2 =
        WriteJob("b.yaml", model_extra + "  init_from: " + Path("a.safetensors") + "\n");
    Edit(job2, "GPT2", family);
    r = RunZt("train " + job2 + " --quiet --steps 0 --export " + Path("b.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(ReadBytes(Path("a.safetensors")), ReadBytes(Path("b.safetensors"))) << family;
  }
}

TEST_F(ZtCliTest, TensorParallelTrainingExportsTheWholeModel) {
  // Two ranks at tensor_parallel 2 (one KV head, replicated on both): the export is the whole
  // model's, laid out as a one-rank run's, and loads back bit for bit.
  const std::string tp = "parallel:\n  world_size: 2\n  tensor_parallel: 2\n";
  const std::string job = WriteJob("tp.yaml", "  n_kv_head: 1\n", "", tp);
  Edit(job, "GPT2", "LLAMA");
  RunResult r = RunZt("train " + job + " --quiet --export " + Path("tp.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string one = WriteJob("one.yaml", "  n_kv_head: 1\n");
  Edit(one, "GPT2", "LLAMA");
  r = RunZt("train " + one + " --quiet --export " + Path("one.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(std::filesystem::file_size(Path("tp.safetensors")),
            std::filesystem::file_size(Path("one.safetensors")));
  const std::string back =
      WriteJob("back.yaml", "  n_kv_head: 1\n  init_from: " + Path("tp.safetensors") + "\n");
  Edit(back, "GPT2", "LLAMA");
  r = RunZt("train " + back + " --quiet --steps 0 --export " + Path("back.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadBytes(Path("tp.safetensors")), ReadBytes(Path("back.safetensors")));
}

// A pipeline-parallel job trains through `zt train` and --export writes the whole model
// (every unit from its stage, the head stage's copy of the tied wte left out), laid out as a
// one-rank run's and loading back bit for bit; --sample, which needs the whole model in one
// place, is refused before any step runs rather than after the last.
TEST_F(ZtCliTest, PipelineParallelTrainingExportsTheWholeModel) {
  // 1F1B (the default schedule) needs a micro-batch per stage.
  const std::string pp =
      "parallel:\n  world_size: 2\n  pipeline_parallel: 2\n  micro_batches: 2\n";
  const std::string job = WriteJob("pp.yaml", "", "", pp);
  RunResult r = RunZt("train " + job + " --quiet --export " + Path("pp.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string one = WriteJob("one.yaml");
  r = RunZt("train " + one + " --quiet --export " + Path("one.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(std::filesystem::file_size(Path("pp.safetensors")),
            std::filesystem::file_size(Path("one.safetensors")));
  const std::string back = WriteJob("back.yaml", "  init_from: " + Path("pp.safetensors") + "\n");
  r = RunZt("train " + back + " --quiet --steps 0 --export " + Path("back.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadBytes(Path("pp.safetensors")), ReadBytes(Path("back.safetensors")));
  std::filesystem::remove(Path("pp.safetensors"));
  r = RunZt("train " + job + " --quiet --sample 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, ::testing::HasSubstr("--sample: parallel.pipeline_parallel 2 leaves each"))
      << r.output;
}

}  // namespace
}  // namespace zt
