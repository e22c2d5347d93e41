// The rendezvous store's counters: StoreAdd with a request id adds once, whatever the number of
// retries (issue 20: a retry after a lost reply used to add twice), also across a restart.
#include "daemon/rendezvous_kv.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/daemon_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousKvTest, AnAdditionWithARequestIdCountsOnceHoweverOftenItIsRepeated) {
  testing::TempDir dir;
  {
    absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    RendezvousKv kv(store->get());
    EXPECT_EQ(kv.Add("job-1/1", "n", 5, "first").value(), 5);
    EXPECT_EQ(kv.Add("job-1/1", "n", 5, "first").value(), 5) << "a retry added again";
    EXPECT_EQ(kv.Add("job-1/1", "n", 2, "second").value(), 7);
    // Without an id every call adds (the Store contract for clients that do not retry).
    EXPECT_EQ(kv.Add("job-1/1", "n", 1).value(), 8);
    EXPECT_EQ(kv.Add("job-1/1", "n", 1).value(), 9);
    // The kept results are not keys a client can read, and scopes stay separate.
    EXPECT_EQ(kv.Get("job-1/1", "n").value(), "9");
    EXPECT_EQ(kv.Add("job-1/2", "n", 3, "first").value(), 3);
    absl::StatusOr<int64_t> long_id = kv.Add("job-1/1", "n", 1, std::string(129, 'x'));
    EXPECT_EQ(long_id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(long_id.status().message(), HasSubstr("request_id"));
  }
  // The coordinator restarted between the addition and its retry.
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  RendezvousKv kv(store->get());
  EXPECT_EQ(kv.Add("job-1/1", "n", 2, "second").value(), 7);
  EXPECT_EQ(kv.Get("job-1/1", "n").value(), "9");
}

}  // namespace
}  // namespace zt
