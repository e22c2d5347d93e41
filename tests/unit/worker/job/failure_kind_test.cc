// Tests of the one classification of rank errors (worker/job/failure_kind.h).
#include "worker/job/failure_kind.h"

#include "gtest/gtest.h"

namespace zt {
namespace {

TEST(FailureKindTest, InputAndStateErrorsArePermanent) {
  for (absl::StatusCode code :
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
        absl::StatusCode::kFailedPrecondition, absl::StatusCode::kPermissionDenied,
        absl::StatusCode::kOutOfRange, absl::StatusCode::kUnimplemented,
        absl::StatusCode::kAlreadyExists, absl::StatusCode::kDataLoss}) {
    EXPECT_EQ(ClassifyFailure(code), FailureKind::kPermanent) << absl::StatusCodeToString(code);
  }
}

TEST(FailureKindTest, LostPeersTimeoutsPressureAndTheUnclassifiedAreTransient) {
  for (absl::StatusCode code :
       {absl::StatusCode::kUnavailable, absl::StatusCode::kAborted,
        absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kResourceExhausted,
        absl::StatusCode::kCancelled, absl::StatusCode::kInternal, absl::StatusCode::kUnknown,
        absl::StatusCode::kUnauthenticated}) {
    EXPECT_EQ(ClassifyFailure(code), FailureKind::kTransient) << absl::StatusCodeToString(code);
  }
  // A code from a newer peer, outside the enum this build knows.
  EXPECT_EQ(ClassifyFailure(static_cast<absl::StatusCode>(99)), FailureKind::kTransient);
}

TEST(FailureKindTest, OkIsNeverAPermanentFailure) {
  EXPECT_FALSE(IsPermanentFailure(absl::OkStatus()));
  EXPECT_TRUE(IsPermanentFailure(absl::NotFoundError("data.train[0]: 'x.bin'")));
  // The text is not read: a transient code with permanent-sounding words stays transient.
  EXPECT_FALSE(IsPermanentFailure(absl::UnavailableError("INVALID_ARGUMENT PERMISSION_DENIED")));
}

}  // namespace
}  // namespace zt
