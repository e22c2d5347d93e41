// The coordinator's state machine through real gRPC, with fake nodes driven by the test.
#include "daemon/coordinator.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/daemon_test_util.h"
#include "worker/checkpoint/checkpoint_owner.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using zerotrain::Job;
using zerotrain::RankExit;

constexpr int64_t kGiB = int64_t{1} << 30;

zerotrain::Job Get(testing::Harness& h, const std::string& id) {
  zerotrain::GetJobRequest request;
  request.set_job_id(id);
  zerotrain::Job job;
  grpc::Status status = h.jobs->GetJob(h.Context().get(), request, &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return job;
}

zerotrain::Job Submit(testing::Harness& h, const zerotrain::JobSpec& spec) {
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  zerotrain::Job job;
  grpc::Status status = h.jobs->SubmitJob(h.Context().get(), request, &job);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return job;
}

// Polls until the job is in `state` (the background pass runs on its own clock).
bool WaitForState(testing::Harness& h, const std::string& id, Job::State state,
                  absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Get(h, id).state() == state) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

std::vector<zerotrain::JobEvent> Watch(testing::Harness& h, const std::string& id, int64_t after,
                                       grpc::Status* status) {
  zerotrain::WatchJobRequest request;
  request.set_job_id(id);
  request.set_after_sequence(after);
  auto context = h.Context(std::chrono::seconds(30));
  auto reader = h.jobs->WatchJob(context.get(), request);
  std::vector<zerotrain::JobEvent> events;
  zerotrain::JobEvent event;
  while (reader->Read(&event)) events.push_back(event);
  *status = reader->Finish();
  return events;
}

zerotrain::Progress Step(int64_t step) {
  zerotrain::Progress progress;
  progress.set_step(step);
  progress.set_max_steps(5);
  progress.set_loss(5.0 - 0.5 * static_cast<double>(step));
  return progress;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void Start(CoordinatorOptions options = {}) {
    harness_.reset();
    options.allowed_roots = {dir_.path()};
    harness_ = std::make_unique<testing::Harness>(state_.path(), options);
    ASSERT_TRUE(harness_->ok());
  }
  testing::Harness& h() { return *harness_; }

  testing::TempDir dir_;
  testing::TempDir state_;
  std::unique_ptr<testing::Harness> harness_;
};

TEST_F(CoordinatorTest, SubmitRunsToSuccessAndWatchReplaysThenFollows) {
  Start();
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 2, kGiB));
  zerotrain::JobSpec spec = testing::SmallJob("tiny", dir_.path(), 2);
  spec.mutable_parallel()->set_zero_stage(3);
  const Job submitted = Submit(h(), spec);
  EXPECT_EQ(submitted.id(), "tiny-1");
  EXPECT_EQ(submitted.run_dir(), absl::StrCat(state_.path(), "/runs/tiny-1"));
  EXPECT_THAT(submitted.plan().pinned(), ::testing::ElementsAre("parallel.zero_stage"));
  EXPECT_EQ(submitted.plan().chosen().zero_stage(), 3);

  const zerotrain::Assignment assignment = node.Next();
  ASSERT_TRUE(assignment.has_start());
  const zerotrain::StartRanks& start = assignment.start();
  EXPECT_EQ(start.job_id(), "tiny-1");
  EXPECT_EQ(start.attempt(), 1);
  EXPECT_EQ(start.store_scope(), "tiny-1/1");
  EXPECT_EQ(start.resume_dir(), "");
  EXPECT_EQ(start.run_dir(), submitted.run_dir());
  EXPECT_TRUE(start.spec().parallel().has_zero_stage());
  EXPECT_EQ(start.spec().parallel().zero_stage(), 3);
  EXPECT_NE(start.spec().memory().activation_checkpointing(),
            zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED);
  ASSERT_EQ(start.ranks_size(), 2);
  EXPECT_EQ(start.ranks(0).device(), 0);
  EXPECT_EQ(start.ranks(1).device(), 1);
  EXPECT_EQ(Get(h(), "tiny-1").state(), Job::PLACED);

  // A watcher that joins now gets the history, then live events, and ends at SUCCEEDED.
  grpc::Status watch_status;
  std::vector<zerotrain::JobEvent> watched;
  std::thread watcher([&] { watched = Watch(h(), "tiny-1", 0, &watch_status); });

  ASSERT_TRUE(node.Started("tiny-1", 1, 0).ok());
  EXPECT_EQ(Get(h(), "tiny-1").state(), Job::PLACED);
  ASSERT_TRUE(node.Started("tiny-1", 1, 1).ok());
  EXPECT_EQ(Get(h(), "tiny-1").state(), Job::RUNNING);
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(node.Report("tiny-1", 1, 0,
                            [&](zerotrain::RankReport* r) { *r->mutable_progress() = Step(step); })
                    .ok());
  }
  // Rank 1's progress is not the job's.
  ASSERT_TRUE(node.Report("tiny-1", 1, 1,
                          [&](zerotrain::RankReport* r) { *r->mutable_progress() = Step(99); })
                  .ok());
  EXPECT_EQ(Get(h(), "tiny-1").progress().step(), 3);
  // The attempt's rendezvous scope lives while the job runs and goes when it ends.
  zerotrain::StoreSetRequest set;
  set.set_scope(start.store_scope());
  set.set_key("rank0/addr");
  set.set_value("127.0.0.1:1234");
  zerotrain::StoreSetResponse set_response;
  ASSERT_TRUE(h().store->StoreSet(h().Context().get(), set, &set_response).ok());
  ASSERT_TRUE(node.Exit("tiny-1", 1, 0, RankExit::FINISHED).ok());
  EXPECT_EQ(Get(h(), "tiny-1").state(), Job::RUNNING);
  ASSERT_TRUE(node.Exit("tiny-1", 1, 1, RankExit::FINISHED).ok());
  watcher.join();

  const Job done = Get(h(), "tiny-1");
  EXPECT_EQ(done.state(), Job::SUCCEEDED);
  ASSERT_EQ(done.attempts_size(), 1);
  EXPECT_EQ(done.attempts(0).end_reason(), "succeeded");
  EXPECT_GT(done.attempts(0).ended_ms(), 0);

  zerotrain::StoreGetRequest get;
  get.set_scope(start.store_scope());
  get.set_key("rank0/addr");
  zerotrain::StoreGetResponse got;
  EXPECT_EQ(h().store->StoreGet(h().Context().get(), get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);

  ASSERT_TRUE(watch_status.ok()) << watch_status.error_message();
  // submitted, placed, running, 3 progress, succeeded.
  ASSERT_EQ(watched.size(), 7u);
  for (size_t i = 0; i < watched.size(); ++i) EXPECT_EQ(watched[i].sequence(), int64_t(i) + 1);
  EXPECT_EQ(watched[0].state(), Job::PENDING);
  EXPECT_EQ(watched[1].state(), Job::PLACED);
  EXPECT_THAT(watched[1].message(), HasSubstr("node-a:0,1"));
  EXPECT_EQ(watched[2].state(), Job::RUNNING);
  EXPECT_EQ(watched[5].progress().step(), 3);
  EXPECT_DOUBLE_EQ(watched[5].progress().loss(), 3.5);
  EXPECT_EQ(watched.back().state(), Job::SUCCEEDED);

  // A reconnecting watcher gets only what it missed, and the stream ends at once.
  std::vector<zerotrain::JobEvent> rest = Watch(h(), "tiny-1", 5, &watch_status);
  ASSERT_TRUE(watch_status.ok());
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].sequence(), 6);

  // The devices are free again.
  std::vector<zerotrain::Node> nodes = h().coordinator().ListNodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_THAT(nodes[0].free_devices(), ::testing::ElementsAre(0, 1));
}

TEST_F(CoordinatorTest, FailedRankRestartsFromLatestCheckpointThenFailsAfterMaxRestarts) {
  Start();
  const std::string ckpt = dir_.Sub("ckpt");
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 2, kGiB));
  zerotrain::JobSpec spec = testing::SmallJob("r", dir_.path(), 2);
  spec.mutable_checkpoint()->set_dir(ckpt);
  spec.mutable_scheduling()->set_max_restarts(1);
  Submit(h(), spec);

  ASSERT_TRUE(node.Next().has_start());
  // The first attempt's ranks claim the directory and save step 20.
  ASSERT_TRUE(WriteCheckpointOwner(ckpt, {.job_id = "r-1", .job_name = "r"}).ok());
  std::filesystem::create_directories(absl::StrCat(ckpt, "/step-00000020"));
  { std::ofstream(absl::StrCat(ckpt, "/latest")) << "step-00000020"; }
  ASSERT_TRUE(node.Started("r-1", 1, 0).ok());
  ASSERT_TRUE(node.Started("r-1", 1, 1).ok());
  ASSERT_TRUE(node.Exit("r-1", 1, 1, RankExit::FAILED, "all-gather 'unit 3': peer gone").ok());
  Job job = Get(h(), "r-1");
  EXPECT_EQ(job.state(), Job::RESTARTING);
  EXPECT_EQ(job.attempts(0).end_reason(), "rank 1 on node-a: all-gather 'unit 3': peer gone");
  EXPECT_EQ(job.failure_reason(), job.attempts(0).end_reason());
  // Rank 0 is told to abort; its device is held until it says it stopped.
  const zerotrain::Assignment stop = node.Next();
  ASSERT_TRUE(stop.has_stop());
  EXPECT_EQ(stop.stop().attempt(), 1);
  EXPECT_EQ(stop.stop().reason(), zerotrain::StopRanks::ABORT);
  EXPECT_EQ(Get(h(), "r-1").attempts_size(), 1);

  // A report for the ended attempt is told to stop.
  zerotrain::RankReportResponse response;
  ASSERT_TRUE(node.Report(
                      "r-1", 1, 0,
                      [](zerotrain::RankReport* r) { *r->mutable_progress() = Step(1); }, &response)
                  .ok());
  EXPECT_TRUE(response.stop());
  ASSERT_TRUE(node.Exit("r-1", 1, 0, RankExit::STOPPED).ok());

  const zerotrain::Assignment second = node.Next();
  ASSERT_TRUE(second.has_start());
  EXPECT_EQ(second.start().attempt(), 2);
  EXPECT_EQ(second.start().resume_dir(), ckpt);
  EXPECT_EQ(second.start().store_scope(), "r-1/2");
  job = Get(h(), "r-1");
  EXPECT_EQ(job.state(), Job::PLACED);
  EXPECT_EQ(job.attempts(1).resumed_from_step(), 20);

  ASSERT_TRUE(node.Exit("r-1", 2, 0, RankExit::FAILED, "out of memory").ok());
  job = Get(h(), "r-1");
  EXPECT_EQ(job.state(), Job::FAILED);
  EXPECT_EQ(job.failure_reason(), "rank 0 on node-a: out of memory");
  EXPECT_EQ(job.attempts_size(), 2);

  // ResumeJob gives it a new budget; resuming a job that is not finished is refused.
  zerotrain::ResumeJobRequest resume;
  resume.set_job_id("r-1");
  Job resumed;
  ASSERT_TRUE(node.Exit("r-1", 2, 1, RankExit::STOPPED).ok());
  ASSERT_TRUE(h().jobs->ResumeJob(h().Context().get(), resume, &resumed).ok());
  EXPECT_EQ(resumed.state(), Job::PLACED);
  EXPECT_EQ(resumed.attempts_size(), 3);
  grpc::Status again = h().jobs->ResumeJob(h().Context().get(), resume, &resumed);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorTest, PermanentErrorsFailAtOnceAndPreemptionDoesNotCount) {
  Start();
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  zerotrain::JobSpec spec = testing::SmallJob("p", dir_.path(), 1);
  spec.mutable_scheduling()->set_max_restarts(0);
  Submit(h(), spec);
  ASSERT_TRUE(node.Next().has_start());
  ASSERT_TRUE(node.Exit("p-1", 1, 0, RankExit::STOPPED, "", /*preempted=*/true).ok());
  Job job = Get(h(), "p-1");
  // Requeued although max_restarts is 0; not placed back on the node that is leaving...
  EXPECT_EQ(job.state(), Job::RESTARTING);
  EXPECT_THAT(job.attempts(0).end_reason(), HasSubstr("preempted"));
  // ...until it registers again (its daemon came back).
  node.Register();
  EXPECT_EQ(Get(h(), "p-1").state(), Job::PLACED);
  const zerotrain::Assignment second = node.Next();
  ASSERT_TRUE(second.has_start());
  EXPECT_EQ(second.start().attempt(), 2);

  Submit(h(), testing::SmallJob("q", dir_.path(), 1));  // waits behind p for the device
  ASSERT_TRUE(node.ExitFailed("p-1", 2, 0,
                              absl::PermissionDeniedError(
                                  "data.train[0] '/x' is outside the allowed roots"))
                  .ok());
  job = Get(h(), "p-1");
  EXPECT_EQ(job.state(), Job::FAILED);
  EXPECT_THAT(job.failure_reason(), HasSubstr("PERMISSION_DENIED"));
  // The device went to the next job.
  const zerotrain::Assignment next = node.Next();
  ASSERT_TRUE(next.has_start());
  EXPECT_EQ(next.start().job_id(), "q-2");
}

// Issue 20: NOT_FOUND (a data path missing on the node) and FAILED_PRECONDITION (a checkpoint
// written for another configuration) used every restart; the exit's code decides, not its text.
TEST_F(CoordinatorTest, ExitCodeNotMessageDecidesWhetherToRestart) {
  Start();
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  struct Case {
    std::string name;
    absl::Status status;
    bool permanent;
  };
  const std::vector<Case> cases = {
      {"nf", absl::NotFoundError("data.train[0]: '/d/x.bin' does not exist"), true},
      {"fp", absl::FailedPreconditionError("checkpoint written for another configuration"), true},
      {"dl", absl::DataLossError("token shard '/d/x.bin' is truncated"), true},
      // Words of a permanent code in the text of a transient one change nothing.
      {"un", absl::UnavailableError("peer said INVALID_ARGUMENT, PERMISSION_DENIED"), false},
      {"de", absl::DeadlineExceededError("all-gather 'unit 3': peer gone"), false},
  };
  for (const Case& c : cases) {
    zerotrain::JobSpec spec = testing::SmallJob(c.name, dir_.path(), 1);
    spec.mutable_scheduling()->set_max_restarts(1);
    const std::string id = Submit(h(), spec).id();
    ASSERT_TRUE(node.Next().has_start()) << c.name;
    ASSERT_TRUE(node.ExitFailed(id, 1, 0, c.status).ok()) << c.name;
    Job job = Get(h(), id);
    // A restarted job is placed again at once: the failed rank gave its device back.
    EXPECT_EQ(job.state(), c.permanent ? Job::FAILED : Job::PLACED) << c.name;
    EXPECT_THAT(job.failure_reason(), HasSubstr(std::string(c.status.message()))) << c.name;
    if (c.permanent) {
      EXPECT_EQ(job.attempts_size(), 1) << c.name;
      EXPECT_EQ(job.failure_code(), static_cast<int32_t>(c.status.code())) << c.name;
      continue;
    }
    // Attempt 2 fails the same way and spends the one restart.
    EXPECT_EQ(job.attempts_size(), 2) << c.name;
    ASSERT_TRUE(node.Next().has_start()) << c.name;
    ASSERT_TRUE(node.ExitFailed(id, 2, 0, c.status).ok()) << c.name;
    job = Get(h(), id);
    EXPECT_EQ(job.state(), Job::FAILED) << c.name;
    EXPECT_EQ(job.attempts_size(), 2) << c.name;
    EXPECT_EQ(job.failure_code(), 0) << c.name << ": failed by spending its restarts";
  }
  // A node built before RankExit.status_code sends none: unclassified, restarted.
  const std::string old = Submit(h(), testing::SmallJob("old", dir_.path(), 1)).id();
  ASSERT_TRUE(node.Next().has_start());
  ASSERT_TRUE(node.Exit(old, 1, 0, RankExit::FAILED, "INVALID_ARGUMENT: x").ok());
  EXPECT_EQ(Get(h(), old).state(), Job::PLACED);
  EXPECT_EQ(Get(h(), old).attempts_size(), 2);
}

TEST_F(CoordinatorTest, SilentNodeEndsTheAttempt) {
  Start({.heartbeat_interval = absl::Milliseconds(300)});
  testing::FakeNode a(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  testing::FakeNode b(h(), testing::NodeWithDevices("node-b", 1, kGiB));
  std::atomic<bool> beating{true};
  std::thread heart([&] {
    while (beating.load()) {
      a.Heartbeat();
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  Submit(h(), testing::SmallJob("h", dir_.path(), 2));
  ASSERT_TRUE(a.Next().has_start());
  ASSERT_TRUE(b.Next().has_start());
  EXPECT_TRUE(WaitForState(h(), "h-1", Job::RESTARTING));
  const Job job = Get(h(), "h-1");
  EXPECT_EQ(job.attempts(0).end_reason(), "node node-b missed 3 heartbeats");
  const zerotrain::Assignment stop = a.Next();
  ASSERT_TRUE(stop.has_stop());
  EXPECT_EQ(stop.stop().reason(), zerotrain::StopRanks::ABORT);
  for (const zerotrain::Node& n : h().coordinator().ListNodes()) {
    EXPECT_EQ(n.healthy(), n.info().id() == "node-a") << n.info().id();
  }
  // The dead node learns it must register again.
  EXPECT_FALSE(b.Heartbeat());
  beating.store(false);
  heart.join();
}

TEST_F(CoordinatorTest, CancelStopsRanksThenCancels) {
  Start();
  // Without nodes the job waits PENDING and a cancel is immediate.
  Job pending = Submit(h(), testing::SmallJob("c", dir_.path(), 1));
  zerotrain::CancelJobRequest cancel;
  cancel.set_job_id(pending.id());
  Job cancelled;
  ASSERT_TRUE(h().jobs->CancelJob(h().Context().get(), cancel, &cancelled).ok());
  EXPECT_EQ(cancelled.state(), Job::CANCELLED);

  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  Submit(h(), testing::SmallJob("c", dir_.path(), 1));
  ASSERT_TRUE(node.Next().has_start());
  ASSERT_TRUE(node.Started("c-2", 1, 0).ok());
  cancel.set_job_id("c-2");
  Job stopping;
  ASSERT_TRUE(h().jobs->CancelJob(h().Context().get(), cancel, &stopping).ok());
  EXPECT_EQ(stopping.state(), Job::RUNNING);
  const zerotrain::Assignment stop = node.Next();
  ASSERT_TRUE(stop.has_stop());
  EXPECT_EQ(stop.stop().reason(), zerotrain::StopRanks::CANCEL);
  ASSERT_TRUE(node.Exit("c-2", 1, 0, RankExit::STOPPED).ok());
  const Job done = Get(h(), "c-2");
  EXPECT_EQ(done.state(), Job::CANCELLED);
  EXPECT_EQ(done.attempts(0).end_reason(), "cancelled");

  // Cancelling a finished job returns it unchanged.
  Job again;
  ASSERT_TRUE(h().jobs->CancelJob(h().Context().get(), cancel, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), done.SerializeAsString());
}

TEST_F(CoordinatorTest, JobThatCanNeverFitIsRefusedWithTheNumbers) {
  Start();
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = testing::SmallJob("big", dir_.path(), 2);
  Job job;
  grpc::Status status = h().jobs->SubmitJob(h().Context().get(), request, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("needs 2 CPU devices"));
  EXPECT_THAT(status.error_message(), HasSubstr("have 1 such devices (node-a: 1)"));
  EXPECT_TRUE(h().coordinator().ListJobs({})->jobs().empty());
}

// Issue 15: a CUDA job goes to the node that announced CUDA devices, planned with their
// memory, and never to CPU devices; with no GPU node registered it is refused with the numbers.
TEST_F(CoordinatorTest, CudaJobsArePlacedOnlyOnCudaDevices) {
  Start();
  testing::FakeNode cpu(h(), testing::NodeWithDevices("cpu-node", 4, 64 * kGiB));
  zerotrain::JobSpec spec = testing::SmallJob("gpu", dir_.path(), 1);
  spec.mutable_resources()->set_device(zerotrain::ResourceConfig::CUDA);
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  Job refused;
  grpc::Status status = h().jobs->SubmitJob(h().Context().get(), request, &refused);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("needs 1 CUDA devices"));

  zerotrain::NodeInfo gpu_info = testing::NodeWithDevices("gpu-node", 2, 80 * kGiB);
  for (zerotrain::DeviceInfo& d : *gpu_info.mutable_devices()) {
    d.set_kind(zerotrain::ResourceConfig::CUDA);
    d.set_name("NVIDIA H100 80GB HBM3");
    d.set_compute_capability("9.0");
  }
  testing::FakeNode gpu(h(), gpu_info);
  const Job job = Submit(h(), spec);
  EXPECT_EQ(job.state(), Job::PLACED);
  ASSERT_EQ(job.attempts_size(), 1);
  ASSERT_EQ(job.attempts(0).placement_size(), 1);
  EXPECT_EQ(job.attempts(0).placement(0).node_id(), "gpu-node");
  EXPECT_EQ(job.plan().device_memory_bytes(), 80 * kGiB);  // planned with the GPU's memory
  const zerotrain::Assignment start = gpu.Next();
  ASSERT_TRUE(start.has_start());
  EXPECT_EQ(start.start().spec().resources().device(), zerotrain::ResourceConfig::CUDA);
  const auto nodes = h().coordinator().ListNodes();
  for (const zerotrain::Node& n : nodes) {
    if (n.info().id() == "gpu-node") EXPECT_EQ(n.info().devices(0).compute_capability(), "9.0");
  }
}

TEST_F(CoordinatorTest, RestartKeepsJobsEventsAndRunningAttempts) {
  const CoordinatorOptions options{.heartbeat_interval = absl::Milliseconds(200),
                                   .reattach_grace = absl::Milliseconds(200)};
  Start(options);
  std::vector<zerotrain::JobEvent> before;
  {
    testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 2, kGiB));
    Submit(h(), testing::SmallJob("keep", dir_.path(), 1));
    Submit(h(), testing::SmallJob("lose", dir_.path(), 1));
    ASSERT_TRUE(node.Next().has_start());
    ASSERT_TRUE(node.Next().has_start());
    ASSERT_TRUE(node.Started("keep-1", 1, 0).ok());
    ASSERT_TRUE(node.Started("lose-2", 1, 0).ok());
    ASSERT_TRUE(node.Report("keep-1", 1, 0,
                            [](zerotrain::RankReport* r) { *r->mutable_progress() = Step(2); })
                    .ok());
    before = h().coordinator().WaitForEvents("keep-1", 0, absl::ZeroDuration())->events;
    ASSERT_EQ(before.size(), 4u);
  }
  Start(options);  // a new Coordinator over the same state directory
  Job keep = Get(h(), "keep-1");
  EXPECT_EQ(keep.state(), Job::RUNNING);
  EXPECT_EQ(keep.progress().step(), 2);
  std::vector<zerotrain::JobEvent> after =
      h().coordinator().WaitForEvents("keep-1", 0, absl::ZeroDuration())->events;
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].SerializeAsString(), before[i].SerializeAsString());
  }
  // The node comes back still running keep-1's rank but not lose-2's.
  zerotrain::RunningAttempt running;
  running.set_job_id("keep-1");
  running.set_attempt(1);
  running.add_ranks(0);
  // ...and an attempt the coordinator does not run, which it tells the node to abort.
  zerotrain::RunningAttempt ghost;
  ghost.set_job_id("ghost-9");
  ghost.set_attempt(1);
  ghost.add_ranks(0);
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 2, kGiB), {running, ghost});
  const zerotrain::Assignment abort_ghost = node.Next();
  ASSERT_TRUE(abort_ghost.has_stop());
  EXPECT_EQ(abort_ghost.stop().job_id(), "ghost-9");
  EXPECT_EQ(abort_ghost.stop().reason(), zerotrain::StopRanks::ABORT);
  EXPECT_EQ(Get(h(), "keep-1").state(), Job::RUNNING);
  // lose-2's attempt ended, and the job was placed again on the device it freed.
  const Job lose = Get(h(), "lose-2");
  ASSERT_EQ(lose.attempts_size(), 2);
  EXPECT_THAT(lose.attempts(0).end_reason(), HasSubstr("without rank(s) 0"));
  EXPECT_EQ(lose.state(), Job::PLACED);
  const zerotrain::Assignment restart = node.Next();
  ASSERT_TRUE(restart.has_start());
  EXPECT_EQ(restart.start().job_id(), "lose-2");
  EXPECT_EQ(restart.start().attempt(), 2);
  // Past the reattach deadline the reattached job keeps running.
  for (int i = 0; i < 8; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    ASSERT_TRUE(node.Heartbeat());
  }
  h().coordinator().Tick();
  EXPECT_EQ(Get(h(), "keep-1").state(), Job::RUNNING);
  ASSERT_TRUE(node.Exit("keep-1", 1, 0, RankExit::FINISHED).ok());
  EXPECT_EQ(Get(h(), "keep-1").state(), Job::SUCCEEDED);
  // Job numbers continue from the stored counter.
  EXPECT_EQ(Submit(h(), testing::SmallJob("next", dir_.path(), 1)).id(), "next-3");
}

TEST_F(CoordinatorTest, AttemptWhoseNodeDoesNotComeBackAfterRestartFails) {
  const CoordinatorOptions options{.heartbeat_interval = absl::Milliseconds(300),
                                   .reattach_grace = absl::Milliseconds(300)};
  Start(options);
  {
    testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
    Submit(h(), testing::SmallJob("gone", dir_.path(), 1));
    ASSERT_TRUE(node.Next().has_start());
    ASSERT_TRUE(node.Started("gone-1", 1, 0).ok());
  }
  Start(options);
  EXPECT_EQ(Get(h(), "gone-1").state(), Job::RUNNING);
  EXPECT_TRUE(WaitForState(h(), "gone-1", Job::RESTARTING));
  EXPECT_THAT(Get(h(), "gone-1").attempts(0).end_reason(),
              HasSubstr("did not report the attempt's ranks in time"));
}

TEST_F(CoordinatorTest, EstimateReportsThePlanAndItsAlternatives) {
  Start();
  zerotrain::EstimateJobRequest request;
  *request.mutable_spec() = testing::SmallJob("e", dir_.path(), 2);
  request.set_device_memory_bytes(kGiB);
  zerotrain::EstimateJobResponse response;
  grpc::Status status = h().jobs->EstimateJob(h().Context().get(), request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.plan().device_memory_bytes(), kGiB);
  EXPECT_TRUE(response.plan().chosen().fits());
  EXPECT_TRUE(response.plan().pinned().empty());
  // Every stage × every checkpointing policy when nothing is pinned.
  EXPECT_EQ(response.plan().candidates_size(), 12);
}

// Checkpoint ownership (issue 20): job `owner` saved into D; job `intruder`, another name and
// the same D, used to be accepted, resume from owner's step and prune owner's steps.
void SaveFakeCheckpoint(const std::string& dir, const std::string& owner_id) {
  if (!owner_id.empty()) {
    ASSERT_TRUE(WriteCheckpointOwner(dir, {.job_id = owner_id, .job_name = "owner"}).ok());
  }
  std::filesystem::create_directories(absl::StrCat(dir, "/step-00000006"));
  std::ofstream(absl::StrCat(dir, "/step-00000006/manifest.json")) << "{}";
  std::ofstream(absl::StrCat(dir, "/latest")) << "step-00000006";
}

grpc::Status TrySubmit(testing::Harness& h, const zerotrain::JobSpec& spec, Job* job) {
  zerotrain::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  return h.jobs->SubmitJob(h.Context().get(), request, job);
}

TEST_F(CoordinatorTest, SubmitRefusesADirectoryHoldingAnotherJobsCheckpoints) {
  Start();
  const std::string ckpt = dir_.Sub("ckpt");
  SaveFakeCheckpoint(ckpt, "owner-1");
  zerotrain::JobSpec spec = testing::SmallJob("intruder", dir_.path(), 1);
  spec.mutable_checkpoint()->set_dir(ckpt);
  Job job;
  grpc::Status status = TrySubmit(h(), spec, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr(ckpt));
  EXPECT_THAT(status.error_message(), HasSubstr("job owner-1 (owner)"));
  EXPECT_THAT(status.error_message(), HasSubstr("zt resume DIR --job JOB"));
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(ckpt, "/step-00000006/manifest.json")));

  // Checkpoints that no record claims (written before records existed) are refused too.
  const std::string legacy = dir_.Sub("legacy");
  SaveFakeCheckpoint(legacy, "");
  spec.mutable_checkpoint()->set_dir(legacy);
  status = TrySubmit(h(), spec, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("no job claims"));

  // Continuing them is explicit: ResumeJob(checkpoint) takes the directory over.
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  zerotrain::ResumeJobRequest resume;
  resume.set_checkpoint(ckpt);
  *resume.mutable_spec() = testing::SmallJob("continued", dir_.path(), 1);
  ASSERT_TRUE(h().jobs->ResumeJob(h().Context().get(), resume, &job).ok());
  EXPECT_TRUE(job.takes_over_checkpoints());
  const zerotrain::Assignment start = node.Next();
  ASSERT_TRUE(start.has_start());
  EXPECT_EQ(start.start().resume_dir(), ckpt);
  EXPECT_TRUE(start.start().take_over_checkpoints());
}

TEST_F(CoordinatorTest, SubmitRefusesTheCheckpointTreeOfAJobThatHasNotFinished) {
  Start();
  const std::string ckpt = dir_.Sub("shared/ckpt");
  zerotrain::JobSpec first = testing::SmallJob("first", dir_.path(), 1);
  first.mutable_checkpoint()->set_dir(ckpt);
  const Job pending = Submit(h(), first);  // no node: it stays PENDING
  ASSERT_EQ(pending.state(), Job::PENDING);

  zerotrain::JobSpec second = testing::SmallJob("second", dir_.path(), 1);
  for (const std::string& dir :
       {ckpt, ckpt + "/", ckpt + "/inner", dir_.Sub("shared"), dir_.Sub("shared//ckpt")}) {
    second.mutable_checkpoint()->set_dir(dir);
    Job job;
    const grpc::Status status = TrySubmit(h(), second, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << dir;
    EXPECT_THAT(status.error_message(), HasSubstr("of job first-1 (first), which is PENDING"))
        << dir;
  }
  // A sibling is fine; and once the first job has finished, its directory is free again.
  second.mutable_checkpoint()->set_dir(dir_.Sub("shared/ckpt2"));
  Submit(h(), second);
  zerotrain::CancelJobRequest cancel;
  cancel.set_job_id(pending.id());
  Job cancelled;
  ASSERT_TRUE(h().jobs->CancelJob(h().Context().get(), cancel, &cancelled).ok());
  ASSERT_TRUE(WaitForState(h(), pending.id(), Job::CANCELLED));
  zerotrain::JobSpec third = testing::SmallJob("third", dir_.path(), 1);
  third.mutable_checkpoint()->set_dir(ckpt + "/inner");
  Job job;
  EXPECT_TRUE(TrySubmit(h(), third, &job).ok());
}

TEST_F(CoordinatorTest, AFirstAttemptNeverResumesAnotherJobsCheckpoints) {
  Start();
  const std::string ckpt = dir_.Sub("ckpt");
  zerotrain::JobSpec spec = testing::SmallJob("late", dir_.path(), 1);
  spec.mutable_checkpoint()->set_dir(ckpt);
  const Job job = Submit(h(), spec);
  // While it waits for a node, another run (a `zt train`) saves into the directory.
  SaveFakeCheckpoint(ckpt, "local:other");
  testing::FakeNode node(h(), testing::NodeWithDevices("node-a", 1, kGiB));
  const zerotrain::Assignment start = node.Next();
  ASSERT_TRUE(start.has_start());
  EXPECT_EQ(start.start().resume_dir(), "") << "resumed local:other's step 6";
  EXPECT_FALSE(start.start().take_over_checkpoints());
  EXPECT_EQ(Get(h(), job.id()).attempts(0).resumed_from_step(), 0);
}

}  // namespace
}  // namespace zt
