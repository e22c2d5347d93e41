// One job's ranks split over two `zt train` processes that meet through a file-backed
// rendezvous directory: the split run must equal the same job run in one process, a process
// killed mid-run must make its peer fail within parallel.comm_timeout_s with an error naming
// the collective and the missing rank, and bad --ranks/--rendezvous input is refused (exit 2).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/zt_process.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/data/token_shard.h"

namespace zt {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using testing::Clock;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testing::ReadText;
using testing::RunZt;
using testing::ZtProcess;

// One line of metrics.jsonl, the fields that must not depend on how ranks map onto processes.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  int64_t comm_bytes = 0;
};

std::vector<StepMetrics> ReadMetrics(const std::string& path) {
  std::vector<StepMetrics> steps;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    steps.push_back({.step = j.at("step").get<int64_t>(),
                     .loss = j.at("loss").get<double>(),
                     .grad_norm = j.at("grad_norm").get<double>(),
                     .lr = j.at("lr").get<double>(),
                     .comm_bytes = j.at("comm_bytes").get<int64_t>()});
  }
  return steps;
}

int CountLines(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) ++n;
  return n;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = std::filesystem::temp_directory_path() /
           ("zt-multi-process-test-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    // Ids from the upper half of the vocabulary only: a unigram skew the model learns within
    // a few steps, so the equivalence test can also see that training moved the weights.
    std::vector<int32_t> tokens(5000);
    std::mt19937 rng(7);
    for (int32_t& t : tokens) t = static_cast<int32_t>(32 + rng() % 32);
    ASSERT_TRUE(WriteTokenShard(Path("train.bin"), tokens, 64).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A small GPT-2 job; `parallel` is the body of the parallel map (YAML, indented 2).
  std::string WriteJob(const std::string& name, const std::string& parallel, int64_t max_steps) {
    std::ofstream f(Path(name));
    f << "name: multi-process\n"
         "model:\n"
         "  family: GPT2\n"
         "  n_layer: 2\n"
         "  n_head: 2\n"
         "  d_model: 32\n"
         "  vocab_size: 64\n"
         "  max_seq_len: 16\n"
         "data:\n"
         "  train: ["
      << Path("train.bin")
      << "]\n"
         "  seq_len: 16\n"
         "train:\n"
         "  micro_batch_size: 2\n"
         "  max_steps: "
      << max_steps
      << "\n"
         "optimizer:\n"
         "  lr: 0.003\n"
         "resources:\n"
         "  cpu_threads: 1\n"
         "parallel:\n"
      << parallel;
    return Path(name);
  }

  std::filesystem::path dir_;
};

// --- Two processes equal one process -------------------------------------------------------

struct SplitCase {
  const char* name;
  const char* parallel;  // the job's parallel map
};

class MultiProcessEquivalenceTest : public MultiProcessTest,
                                    public ::testing::WithParamInterface<SplitCase> {};

TEST_P(MultiProcessEquivalenceTest, TwoProcessesEqualOneProcess) {
  const std::string job = WriteJob("job.yaml", GetParam().parallel, 6);
  std::filesystem::create_directories(Path("rendezvous"));
  auto split_args = [&](const std::string& ranks) {
    return std::vector<std::string>{"train",        job,
                                    "--ranks",      ranks,
                                    "--rendezvous", Path("rendezvous"),
                                    "--run-dir",    Path("A"),
                                    "--export",     Path("A/w.safetensors"),
                                    "--quiet"};
  };
  {
    // Both processes start before either is waited on: each blocks in rendezvous until the
    // other's ranks arrive.
    ZtProcess low(split_args("0-1"), Path("low.log"));
    ZtProcess high(split_args("2-3"), Path("high.log"));
    ASSERT_TRUE(low.started());
    ASSERT_TRUE(high.started());
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    EXPECT_EQ(low.WaitUntil(deadline), 0) << low.Output();
    EXPECT_EQ(high.WaitUntil(deadline), 0) << high.Output();
  }
  const auto [one_code, one_output] =
      RunZt({"train", job, "--run-dir", Path("B"), "--export", Path("B/w.safetensors"), "--quiet"},
            Path("one.log"));
  ASSERT_EQ(one_code, 0) << one_output;

  // The processes run the same collectives, in the same order, over the same bytes as the
  // threads of one process, so the results agree bit for bit (they did when this was
  // written): equality is exact, and any tolerance would only hide a changed reduction order.
  const std::vector<StepMetrics> split = ReadMetrics(Path("A/metrics.jsonl"));
  const std::vector<StepMetrics> one = ReadMetrics(Path("B/metrics.jsonl"));
  ASSERT_EQ(split.size(), 6u);
  ASSERT_EQ(one.size(), 6u);
  for (size_t i = 0; i < one.size(); ++i) {
    SCOPED_TRACE("metrics line " + std::to_string(i));
    EXPECT_EQ(split[i].step, one[i].step);
    EXPECT_TRUE(std::isfinite(one[i].loss));
    EXPECT_EQ(split[i].loss, one[i].loss);
    EXPECT_EQ(split[i].grad_norm, one[i].grad_norm);
    EXPECT_EQ(split[i].lr, one[i].lr);
    // Same collectives over the same buffers: the same traffic, and some traffic at all.
    EXPECT_EQ(split[i].comm_bytes, one[i].comm_bytes);
    EXPECT_GT(split[i].comm_bytes, 0);
  }
  // Training moved the model: a job whose steps did nothing would also compare equal.
  EXPECT_LT(one.back().loss, one.front().loss);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> a =
      SafetensorsFile::Open(Path("A/w.safetensors"));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> b =
      SafetensorsFile::Open(Path("B/w.safetensors"));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ((*a)->tensors().size(), (*b)->tensors().size());
  ASSERT_FALSE((*b)->tensors().empty());
  for (const SafetensorsTensorInfo& tb : (*b)->tensors()) {
    SCOPED_TRACE(tb.name);
    const SafetensorsTensorInfo* ta = (*a)->Find(tb.name);
    ASSERT_NE(ta, nullptr);
    ASSERT_EQ(ta->shape, tb.shape);
    std::vector<float> va(ta->numel()), vb(tb.numel());
    ASSERT_TRUE((*a)->ReadAsF32(*ta, absl::MakeSpan(va)).ok());
    ASSERT_TRUE((*b)->ReadAsF32(tb, absl::MakeSpan(vb)).ok());
    int64_t differing = 0;
    for (size_t k = 0; k < vb.size(); ++k) differing += va[k] != vb[k];
    EXPECT_EQ(differing, 0);
  }
  // Same tensors, same values, same writer: the same bytes, header included.
  EXPECT_EQ(ReadText(Path("A/w.safetensors")), ReadText(Path("B/w.safetensors")));
}

INSTANTIATE_TEST_SUITE_P(
    MultiProcess, MultiProcessEquivalenceTest,
    ::testing::Values(
        SplitCase{"Stage0", "  world_size: 4\n  zero_stage: 0\n  comm_timeout_s: 20\n"},
        SplitCase{"Stage3", "  world_size: 4\n  zero_stage: 3\n  comm_timeout_s: 20\n"},
        // Hybrid: shard groups {0,1} and {2,3} each lie inside one process, so the
        // cross-group all-reduce is the traffic that crosses processes.
        SplitCase{"Stage2Hybrid",
                  "  world_size: 4\n  zero_stage: 2\n  shard_group_size: 2\n"
                  "  comm_timeout_s: 20\n"}),
    [](const ::testing::TestParamInfo<SplitCase>& info) { return std::string(info.param.name); });

// offload.optimizer NVME over processes that share the node: each process opens a swap store
// of its own (RocksDB admits one process per store) beside the one a whole-job process opens,
// and the split run ends with the weights of the one-process run, byte for byte.
TEST_F(MultiProcessTest, NvmeOffloadedRanksInTwoProcessesEqualOneProcess) {
  std::filesystem::create_directories(Path("swap"));
  const std::string job =
      WriteJob("job.yaml",
               "  world_size: 4\n  zero_stage: 2\n  comm_timeout_s: 20\n"
               "offload:\n  optimizer: NVME\n  nvme_path: " +
                   Path("swap") + "\n  buffer_count: 4\n  buffer_size: 262144\n",
               4);
  std::filesystem::create_directories(Path("rendezvous"));
  auto split_args = [&](const std::string& ranks) {
    return std::vector<std::string>{"train",        job,
                                    "--ranks",      ranks,
                                    "--rendezvous", Path("rendezvous"),
                                    "--run-dir",    Path("A"),
                                    "--export",     Path("A/w.safetensors"),
                                    "--quiet"};
  };
  {
    ZtProcess low(split_args("0-1"), Path("low.log"));
    ZtProcess high(split_args("2-3"), Path("high.log"));
    ASSERT_TRUE(low.started());
    ASSERT_TRUE(high.started());
    const auto deadline = Clock::now() + std::chrono::seconds(300);
    EXPECT_EQ(low.WaitUntil(deadline), 0) << low.Output();
    EXPECT_EQ(high.WaitUntil(deadline), 0) << high.Output();
  }
  const auto [one_code, one_output] =
      RunZt({"train", job, "--run-dir", Path("B"), "--export", Path("B/w.safetensors"), "--quiet"},
            Path("one.log"));
  ASSERT_EQ(one_code, 0) << one_output;
  // Each process had a store of its own (RocksDB admits one process to an index: a shared one
  // would have refused the second), and each deleted it when its ranks ended.
  EXPECT_FALSE(std::filesystem::exists(Path("swap/zerotrain-swap.ranks-0-1")));
  EXPECT_FALSE(std::filesystem::exists(Path("swap/zerotrain-swap.ranks-2-3")));
  EXPECT_FALSE(std::filesystem::exists(Path("swap/zerotrain-swap")));
  EXPECT_TRUE(std::filesystem::is_directory(Path("swap")));
  const std::string one = ReadText(Path("B/w.safetensors"));
  ASSERT_FALSE(one.empty());
  EXPECT_TRUE(ReadText(Path("A/w.safetensors")) == one);
}

// --- A lost peer ---------------------------------------------------------------------------

// Ranks 0 and 1 of a long stage-3 job in two processes; once rank 0 has recorded two steps,
// `signal` hits the process of rank 1. Returns rank 0's exit code (nullopt: still running 60 s
// later), its output, and the seconds from the signal to its exit.
struct SurvivorResult {
  std::optional<int> exit_code;
  std::string output;
  double seconds_after_signal = 0;
};

class MultiProcessLostPeerTest : public MultiProcessTest {
 protected:
  static constexpr double kCommTimeoutS = 5;

  void RunAndSignalRank1(int signal, SurvivorResult* result) {
    const std::string job =
        WriteJob("job.yaml", "  world_size: 2\n  zero_stage: 3\n  comm_timeout_s: 5\n", 100000);
    std::filesystem::create_directories(Path("rendezvous"));
    auto args = [&](const std::string& rank) {
      return std::vector<std::string>{"train",        job,
                                      "--ranks",      rank,
                                      "--rendezvous", Path("rendezvous"),
                                      "--run-dir",    Path("run" + rank),
                                      "--quiet"};
    };
    ZtProcess survivor(args("0"), Path("survivor.log"));
    ZtProcess peer(args("1"), Path("peer.log"));
    ASSERT_TRUE(survivor.started());
    ASSERT_TRUE(peer.started());

    // Strike only once training is under way: past rendezvous, two steps recorded.
    const auto startup_deadline = Clock::now() + std::chrono::seconds(60);
    while (CountLines(Path("run0/metrics.jsonl")) < 2) {
      ASSERT_FALSE(survivor.Poll()) << survivor.Output();
      ASSERT_FALSE(peer.Poll()) << peer.Output();
      ASSERT_LT(Clock::now(), startup_deadline) << "rank 0 recorded no 2 steps within 60 s";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(peer.Signal(signal), 0);
    const auto signalled_at = Clock::now();
    // 60 s bounds the wait so that a survivor that never notices fails the test instead of
    // hanging it; the destructors then kill both processes.
    result->exit_code = survivor.WaitUntil(signalled_at + std::chrono::seconds(60));
    result->seconds_after_signal =
        std::chrono::duration<double>(Clock::now() - signalled_at).count();
    result->output = survivor.Output();
  }
};

// A killed process closes its sockets: the survivor learns at once, without waiting out the
// timeout, and must say which collective broke and which rank it lost.
TEST_F(MultiProcessLostPeerTest, KilledPeerFailsTheSurvivorWithinTheTimeout) {
  SurvivorResult r;
  ASSERT_NO_FATAL_FAILURE(RunAndSignalRank1(SIGKILL, &r));
  ASSERT_TRUE(r.exit_code.has_value()) << "rank 0 still running 60 s after rank 1 was killed";
  // 1: the run failed (2 would blame the job file).
  EXPECT_EQ(*r.exit_code, 1) << r.output;
  // The timeout plus 25 s for the step in flight and the exit, on 2 shared cores.
  EXPECT_LT(r.seconds_after_signal, kCommTimeoutS + 25) << r.output;
  // e.g. "zt: AllGather 'block.1 all-gather' on rank 0 of 2: ranks [1] did not arrive within
  // 5 s (...)". Which collective breaks depends on where the kill lands.
  EXPECT_THAT(r.output, ContainsRegex("'[a-z0-9. -]+' on rank 0 of 2"));
  EXPECT_THAT(r.output, HasSubstr("ranks [1]"));
}

// A stopped process keeps its sockets open and says nothing: only parallel.comm_timeout_s
// ends the survivor's wait, and not before it has passed.
TEST_F(MultiProcessLostPeerTest, StalledPeerFailsTheSurvivorAfterTheTimeout) {
  SurvivorResult r;
  ASSERT_NO_FATAL_FAILURE(RunAndSignalRank1(SIGSTOP, &r));
  ASSERT_TRUE(r.exit_code.has_value()) << "rank 0 still running 60 s after rank 1 stopped";
  EXPECT_EQ(*r.exit_code, 1) << r.output;
  // Lower bound: the wait that times out began at most one collective (milliseconds here)
  // before the signal; 0.5 s of slack covers that and the 20 ms polling, so failing sooner
  // means the survivor did not honour comm_timeout_s.
  EXPECT_GT(r.seconds_after_signal, kCommTimeoutS - 0.5) << r.output;
  EXPECT_LT(r.seconds_after_signal, kCommTimeoutS + 25) << r.output;
  EXPECT_THAT(r.output, ContainsRegex("'[a-z0-9. -]+' on rank 0 of 2"));
  EXPECT_THAT(r.output, HasSubstr("ranks [1]"));
  EXPECT_THAT(r.output, AnyOf(HasSubstr("within 5 s"), HasSubstr("Timed out")));
}

// --- Bad input -----------------------------------------------------------------------------

TEST_F(MultiProcessTest, PartOfTheRanksNeedsARendezvous) {
  const std::string job =
      WriteJob("job.yaml", "  world_size: 4\n  zero_stage: 3\n  comm_timeout_s: 20\n", 6);
  const auto [code, output] =
      RunZt({"train", job, "--ranks", "0-1", "--run-dir", Path("run"), "--quiet"}, Path("zt.log"));
  EXPECT_EQ(code, 2) << output;
  EXPECT_THAT(output, HasSubstr("--rendezvous"));
  // Refused before anything trained.
  EXPECT_FALSE(std::filesystem::exists(Path("run/metrics.jsonl")));
}

TEST_F(MultiProcessTest, RanksOutsideTheWorldAreRefused) {
  const std::string job =
      WriteJob("job.yaml", "  world_size: 2\n  zero_stage: 3\n  comm_timeout_s: 20\n", 6);
  std::filesystem::create_directories(Path("rendezvous"));
  for (const std::string ranks : {"5", "1-2", "1-0", "x"}) {
    SCOPED_TRACE("--ranks " + ranks);
    const auto [code, output] = RunZt({"train", job, "--ranks", ranks, "--rendezvous",
                                       Path("rendezvous"), "--run-dir", Path("run"), "--quiet"},
                                      Path("zt.log"));
    EXPECT_EQ(code, 2) << output;
    EXPECT_THAT(output, AllOf(HasSubstr("--ranks"), HasSubstr(ranks)));
    EXPECT_FALSE(std::filesystem::exists(Path("run/metrics.jsonl")));
  }
}

}  // namespace
}  // namespace zt
