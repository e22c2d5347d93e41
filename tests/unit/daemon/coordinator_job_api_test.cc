// The job API's bounds and bookkeeping (issue 20): request ids that make a retried SubmitJob
// safe, the spec size limit, ListJobs pages of summaries, DeleteJob, the retention of finished
// jobs, and the one validation of names and strings, all through real gRPC.
#include <set>
#include <thread>

#include "daemon/coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/daemon_test_util.h"

namespace zt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using zerotrain::Job;

class CoordinatorJobApiTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }

  // (Re)starts the coordinator over the same state directory.
  void Start(CoordinatorOptions options = {}) {
    harness_.reset();
    options.allowed_roots = {dir_.path()};
    harness_ = std::make_unique<testing::Harness>(dir_.path(), options);
    ASSERT_TRUE(harness_->ok());
  }

  grpc::Status Submit(const zerotrain::JobSpec& spec, const std::string& request_id, Job* job) {
    zerotrain::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    request.set_request_id(request_id);
    return harness_->jobs->SubmitJob(harness_->Context().get(), request, job);
  }
  std::string SubmitOk(const std::string& name, const std::string& request_id = "") {
    Job job;
    const grpc::Status status = Submit(testing::SmallJob(name, dir_.path(), 1), request_id, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job.id();
  }
  grpc::Status List(const zerotrain::ListJobsRequest& request,
                    zerotrain::ListJobsResponse* response) {
    return harness_->jobs->ListJobs(harness_->Context().get(), request, response);
  }
  // Every job id, newest first, paging with `page_size`; the number of pages in *pages.
  std::vector<std::string> AllIds(int page_size, int* pages = nullptr) {
    zerotrain::ListJobsRequest request;
    request.set_page_size(page_size);
    std::vector<std::string> ids;
    int count = 0;
    do {
      zerotrain::ListJobsResponse response;
      const grpc::Status status = List(request, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok()) break;
      ++count;
      for (const zerotrain::JobSummary& job : response.jobs()) ids.push_back(job.id());
      request.set_page_token(response.next_page_token());
    } while (!request.page_token().empty());
    if (pages != nullptr) *pages = count;
    return ids;
  }
  grpc::Status Cancel(const std::string& id) {
    zerotrain::CancelJobRequest request;
    request.set_job_id(id);
    Job job;
    return harness_->jobs->CancelJob(harness_->Context().get(), request, &job);
  }
  grpc::Status Delete(const std::string& id) {
    zerotrain::DeleteJobRequest request;
    request.set_job_id(id);
    zerotrain::DeleteJobResponse response;
    return harness_->jobs->DeleteJob(harness_->Context().get(), request, &response);
  }
  grpc::Status GetJob(const std::string& id, Job* job) {
    zerotrain::GetJobRequest request;
    request.set_job_id(id);
    return harness_->jobs->GetJob(harness_->Context().get(), request, job);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::Harness> harness_;
};

TEST_F(CoordinatorJobApiTest, ARepeatedRequestIdReturnsTheFirstJobEvenAfterARestart) {
  const std::string first = SubmitOk("dedup", "req-1");
  EXPECT_EQ(SubmitOk("dedup", "req-1"), first);
  Start();
  EXPECT_EQ(SubmitOk("dedup", "req-1"), first);
  EXPECT_THAT(AllIds(0), ElementsAre(first));

  const std::string second = SubmitOk("dedup", "req-2");
  EXPECT_NE(second, first);
  const std::string third = SubmitOk("dedup");
  const std::string fourth = SubmitOk("dedup");
  EXPECT_NE(third, fourth) << "an empty request_id never deduplicates";

  Job job;
  const grpc::Status other_name = Submit(testing::SmallJob("other", dir_.path(), 1), "req-1", &job);
  EXPECT_EQ(other_name.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(other_name.error_message(), HasSubstr(first));
  const grpc::Status bad = Submit(testing::SmallJob("x", dir_.path(), 1), "a b", &job);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("request_id"));
}

TEST_F(CoordinatorJobApiTest, ConcurrentSubmitsOfOneRequestIdMakeOneJob) {
  std::vector<std::string> ids(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); ++i) {
    threads.emplace_back([&, i] { ids[i] = SubmitOk("race", "same-request"); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
  EXPECT_EQ(AllIds(0).size(), 1u);
}

// Regression: three specs of 3.3 MB were accepted, and every ListJobs after them failed
// "Received message larger than max".
TEST_F(CoordinatorJobApiTest, ASpecOverTheLimitIsRefusedNamingTheLimitAndItsSize) {
  zerotrain::JobSpec big = testing::SmallJob("big", dir_.path(), 1);
  for (int i = 0; i < 60000; ++i) {
    big.mutable_data()->add_train(absl::StrCat(dir_.path(), "/shards/shard_", i, ".bin"));
  }
  const size_t size = big.ByteSizeLong();
  ASSERT_GT(size, size_t{2} << 20);
  ASSERT_LT(size, size_t{4} << 20) << "under gRPC's receive limit, so the coordinator answers";
  Job job;
  const grpc::Status status = Submit(big, "", &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(size, " bytes")));
  EXPECT_THAT(status.error_message(), HasSubstr("at most 1048576 (--max-spec-bytes)"));
  EXPECT_TRUE(AllIds(0).empty());

  Start({.max_spec_bytes = 4 << 10});
  zerotrain::JobSpec small_over = testing::SmallJob("over", dir_.path(), 1);
  for (int i = 0; i < 200; ++i) small_over.mutable_data()->add_train(dir_.Sub("s.bin"));
  EXPECT_THAT(Submit(small_over, "", &job).error_message(), HasSubstr("at most 4096"));
}

TEST_F(CoordinatorJobApiTest, ListJobsPagesSummariesNewestFirst) {
  std::vector<std::string> submitted;
  for (int i = 0; i < 7; ++i) submitted.push_back(SubmitOk(absl::StrCat("page", i)));
  const std::vector<std::string> newest_first(submitted.rbegin(), submitted.rend());
  int pages = 0;
  EXPECT_EQ(AllIds(3, &pages), newest_first);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(AllIds(7, &pages), newest_first);
  EXPECT_EQ(pages, 1);
  EXPECT_EQ(AllIds(0), newest_first);

  zerotrain::ListJobsRequest request;
  request.set_page_size(2);
  zerotrain::ListJobsResponse response;
  ASSERT_TRUE(List(request, &response).ok());
  const zerotrain::JobSummary& newest = response.jobs(0);
  EXPECT_EQ(newest.name(), "page6");
  EXPECT_EQ(newest.state(), Job::PENDING);
  EXPECT_EQ(newest.world_size(), 1);
  EXPECT_GT(newest.created_ms(), 0);

  ASSERT_TRUE(Cancel(submitted[1]).ok());
  ASSERT_TRUE(Cancel(submitted[4]).ok());
  request.add_states(Job::CANCELLED);
  request.set_page_size(1);
  std::vector<std::string> cancelled;
  do {
    response.Clear();
    ASSERT_TRUE(List(request, &response).ok());
    for (const auto& job : response.jobs()) cancelled.push_back(job.id());
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  EXPECT_THAT(cancelled, ElementsAre(submitted[4], submitted[1]));

  zerotrain::ListJobsRequest bad;
  bad.set_page_size(kMaxListPageSize + 1);
  EXPECT_EQ(List(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_page_size(-1);
  EXPECT_EQ(List(bad, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  bad.set_page_size(0);
  bad.set_page_token("garbage");
  const grpc::Status token = List(bad, &response);
  EXPECT_EQ(token.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(token.error_message(), HasSubstr("page_token"));
}

TEST_F(CoordinatorJobApiTest, DeleteRemovesOnlyAFinishedJobWithItsEventsAndRequestId) {
  const std::string id = SubmitOk("doomed", "req-doomed");
  const grpc::Status active = Delete(id);
  EXPECT_EQ(active.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(active.error_message(), HasSubstr("PENDING"));
  EXPECT_EQ(Delete("no-such-1").error_code(), grpc::StatusCode::NOT_FOUND);

  ASSERT_TRUE(Cancel(id).ok());
  ASSERT_TRUE(Delete(id).ok());
  Job job;
  EXPECT_EQ(GetJob(id, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(AllIds(0).empty());
  Start();
  EXPECT_EQ(GetJob(id, &job).error_code(), grpc::StatusCode::NOT_FOUND) << "deleted for good";
  EXPECT_TRUE(AllIds(0).empty());
  const std::string again = SubmitOk("doomed", "req-doomed");
  EXPECT_NE(again, id) << "the request id went with the job";
}

// A FAILED job whose other ranks are still stopping keeps its record until their exits are
// reported, so that the node's reports find it and its devices are freed.
TEST_F(CoordinatorJobApiTest, AFailedJobIsKeptUntilItsRanksHaveExited) {
  Start({.keep_finished_jobs = 0, .keep_finished_for = absl::Milliseconds(1)});
  testing::FakeNode node(*harness_, testing::NodeWithDevices("node-a", 2, int64_t{1} << 30));
  zerotrain::JobSpec spec = testing::SmallJob("pair", dir_.path(), 2);
  spec.mutable_scheduling()->set_max_restarts(0);
  Job job;
  ASSERT_TRUE(Submit(spec, "", &job).ok());
  ASSERT_TRUE(node.Next().has_start());
  ASSERT_TRUE(node.Exit(job.id(), 1, 0, zerotrain::RankExit::FAILED, "boom").ok());
  ASSERT_TRUE(GetJob(job.id(), &job).ok());
  ASSERT_EQ(job.state(), Job::FAILED);
  const grpc::Status early = Delete(job.id());
  EXPECT_EQ(early.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(early.error_message(), HasSubstr("not all exited"));
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(harness_->coordinator().PruneFinishedJobs(), 0);
  ASSERT_TRUE(node.Exit(job.id(), 1, 1, zerotrain::RankExit::STOPPED).ok());
  EXPECT_EQ(harness_->coordinator().PruneFinishedJobs(), 1);
  EXPECT_TRUE(AllIds(0).empty());
}

TEST_F(CoordinatorJobApiTest, RetentionKeepsTheNewestFinishedJobsAndNeverAnActiveOne) {
  Start({.keep_finished_jobs = 2, .keep_finished_for = absl::ZeroDuration()});
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(SubmitOk(absl::StrCat("kept", i)));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Cancel(ids[i]).ok());
  EXPECT_EQ(harness_->coordinator().PruneFinishedJobs(), 2);
  EXPECT_THAT(AllIds(0), ElementsAre(ids[4], ids[3], ids[2]));
  EXPECT_EQ(harness_->coordinator().PruneFinishedJobs(), 0);
  Start({.keep_finished_jobs = 2, .keep_finished_for = absl::ZeroDuration()});
  EXPECT_THAT(AllIds(0), ElementsAre(ids[4], ids[3], ids[2]));

  Start({.keep_finished_jobs = 0, .keep_finished_for = absl::Milliseconds(1)});
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(harness_->coordinator().PruneFinishedJobs(), 2);
  EXPECT_THAT(AllIds(0), ElementsAre(ids[4])) << "a PENDING job is never pruned";
}

TEST_F(CoordinatorJobApiTest, TheBackgroundPassAppliesTheRetention) {
  Start({.tick_interval = absl::Milliseconds(20),
         .keep_finished_jobs = 1,
         .prune_interval = absl::Milliseconds(20)});
  const std::string old_id = SubmitOk("old");
  const std::string new_id = SubmitOk("new");
  ASSERT_TRUE(Cancel(old_id).ok());
  ASSERT_TRUE(Cancel(new_id).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (AllIds(0).size() > 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_THAT(AllIds(0), ElementsAre(new_id));
}

// Regression: an empty name made job "-1"; NUL and newline in checkpoint.dir were accepted
// (the node read "x" where the spec said "x\0y").
TEST_F(CoordinatorJobApiTest, SubmitRefusesAnEmptyNameAndControlCharactersByField) {
  struct Case {
    std::function<void(zerotrain::JobSpec&)> spoil;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](zerotrain::JobSpec& s) { s.set_name(""); }, "name: required"},
      {[&](zerotrain::JobSpec& s) {
         s.mutable_checkpoint()->set_dir(dir_.Sub(std::string("x\0y", 3)));
       },
       "checkpoint.dir: "},
      {[&](zerotrain::JobSpec& s) { s.mutable_checkpoint()->set_dir(dir_.Sub("a\nb")); },
       "checkpoint.dir: "},
      {[&](zerotrain::JobSpec& s) { s.mutable_data()->add_train(dir_.Sub("t\x7f.bin")); },
       "data.train[1]: "},
      {[&](zerotrain::JobSpec& s) { s.mutable_model()->set_init_from(dir_.Sub("m\t")); },
       "model.init_from: "},
  };
  for (const Case& c : cases) {
    zerotrain::JobSpec spec = testing::SmallJob("valid", dir_.path(), 1);
    c.spoil(spec);
    Job job;
    const grpc::Status status = Submit(spec, "", &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_THAT(status.error_message(), HasSubstr(c.field));
  }
  EXPECT_TRUE(AllIds(0).empty());
}

}  // namespace
}  // namespace zt
