// Tests of the exit codes a batch script acts on (cli/exit_codes.cc, documented in main.cc).
#include <string>

#include "cli/commands.h"
#include "gtest/gtest.h"

namespace zt::cli {
namespace {

TEST(ExitCodeForTest, EachCodeSaysWhatToDoNext) {
  EXPECT_EQ(ExitCodeFor(absl::OkStatus()), 0);
  EXPECT_EQ(ExitCodeFor(absl::InternalError("x")), 1);
  EXPECT_EQ(ExitCodeFor(absl::AbortedError("x")), 1);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("x")), 1);
  for (const absl::Status& input :
       {absl::InvalidArgumentError("x"), absl::NotFoundError("x"), absl::PermissionDeniedError("x"),
        absl::FailedPreconditionError("x"), absl::OutOfRangeError("x"), absl::DataLossError("x"),
        absl::AlreadyExistsError("x"), absl::UnimplementedError("x")}) {
    EXPECT_EQ(ExitCodeFor(input), 2) << input;
  }
  EXPECT_EQ(ExitCodeFor(absl::CancelledError("x")), 3);
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x")), 4);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x")), 4);
  // Offline verbs: a lost peer's Unavailable/DeadlineExceeded is a failed run.
  EXPECT_EQ(ExitCodeFor(absl::UnavailableError("x"), VerbKind::kOffline), 1);
  EXPECT_EQ(ExitCodeFor(absl::DeadlineExceededError("x"), VerbKind::kOffline), 1);
  EXPECT_EQ(ExitCodeFor(absl::InvalidArgumentError("x"), VerbKind::kOffline), 2);
  // `zt train` by the classification the daemon restarts jobs by (worker/job/failure_kind.h).
  EXPECT_EQ(ExitCodeFor(absl::NotFoundError("x"), VerbKind::kOffline), 2);
  EXPECT_EQ(ExitCodeFor(absl::FailedPreconditionError("x"), VerbKind::kOffline), 2);
  EXPECT_EQ(ExitCodeFor(absl::UnimplementedError("x"), VerbKind::kOffline), 2);
  EXPECT_EQ(ExitCodeFor(absl::AbortedError("x"), VerbKind::kOffline), 1);
  EXPECT_EQ(ExitCodeFor(absl::ResourceExhaustedError("x"), VerbKind::kOffline), 1);
  EXPECT_EQ(ExitCodeFor(absl::UnauthenticatedError("x")), 5);
}

TEST(JobOutcomeTest, FinalStatesMapToTheirExitCodes) {
  EXPECT_EQ(ExitCodeFor(JobOutcome(zerotrain::Job::SUCCEEDED, "j-1", "")), 0);
  const absl::Status failed = JobOutcome(zerotrain::Job::FAILED, "j-1", "rank 1: boom");
  EXPECT_EQ(ExitCodeFor(failed), 1);
  EXPECT_EQ(std::string(failed.message()), "job j-1 FAILED: rank 1: boom");
  EXPECT_EQ(ExitCodeFor(JobOutcome(zerotrain::Job::CANCELLED, "j-1", "")), 3);
  EXPECT_EQ(ExitCodeFor(JobOutcome(zerotrain::Job::RUNNING, "j-1", "")), 1);
  // Failed without a restart on an error no rerun fixes: exit 2, as `zt train` would.
  const absl::Status permanent =
      JobOutcome(zerotrain::Job::FAILED, "j-1", "rank 0: NOT_FOUND: data.train[0]",
                 static_cast<int32_t>(absl::StatusCode::kNotFound));
  EXPECT_EQ(ExitCodeFor(permanent), 2);
  EXPECT_EQ(std::string(permanent.message()), "job j-1 FAILED: rank 0: NOT_FOUND: data.train[0]");
  // A transient code never turns into "coordinator unreachable" (4): the job FAILED, exit 1.
  EXPECT_EQ(ExitCodeFor(JobOutcome(zerotrain::Job::FAILED, "j-1", "x",
                                   static_cast<int32_t>(absl::StatusCode::kUnavailable))),
            1);
}

}  // namespace
}  // namespace zt::cli
