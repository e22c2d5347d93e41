// RemoteStore against an in-test RendezvousService: the Store contract over gRPC, a
// coordinator restart in the middle of a Wait, and a wrong token.
#include "worker/node/remote_store.h"

#include <future>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/node/fake_coordinator.h"
#include "worker/node/control_channel.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

class RemoteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { coordinator_.Start(); }

  std::unique_ptr<RemoteStore> Connect(const std::string& token,
                                       const std::string& scope = "job-1/1",
                                       absl::Duration max_wait_rpc = absl::Seconds(10)) {
    auto channel = ConnectControlPlane({.address = coordinator_.address()});
    EXPECT_TRUE(channel.ok()) << channel.status();
    RemoteStoreOptions options{.coordinator = coordinator_.address(),
                               .token = token,
                               .scope = scope,
                               .max_wait_rpc = max_wait_rpc};
    options.retry.retry_for = absl::Seconds(20);
    auto store = RemoteStore::Create(*channel, options);
    EXPECT_TRUE(store.ok()) << store.status();
    return std::move(*store);
  }

  testing::FakeCoordinator coordinator_{"secret"};
};

TEST_F(RemoteStoreTest, SetGetContainsWaitAndAdd) {
  std::unique_ptr<RemoteStore> store = Connect("secret");
  ASSERT_TRUE(store->Set("a", std::string("x\0y", 3)).ok());
  absl::StatusOr<std::string> a = store->Get("a");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, std::string("x\0y", 3)) << "values are bytes, zeros included";
  EXPECT_TRUE(store->Contains("a").value());
  EXPECT_FALSE(store->Contains("b").value());
  absl::StatusOr<std::string> missing = store->Get("b");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("'b'"));

  EXPECT_EQ(store->Add("n", 5).value(), 5);
  EXPECT_EQ(store->Add("n", -2).value(), 3);

  // Scopes are separate namespaces.
  EXPECT_FALSE(Connect("secret", "job-1/2")->Contains("a").value());

  // A waiter is released by another rank's Set.
  std::future<absl::Status> waited = std::async(std::launch::async, [&] {
    return store->Wait({"a", "c"}, absl::Seconds(30));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(Connect("secret")->Set("c", "1").ok());
  EXPECT_TRUE(waited.get().ok());

  // Waits longer than one RPC are made of several; the deadline still names what is missing.
  std::unique_ptr<RemoteStore> short_rpcs = Connect("secret", "job-1/1", absl::Milliseconds(30));
  const absl::Time start = absl::Now();
  absl::Status timed_out = short_rpcs->Wait({"a", "never"}, absl::Milliseconds(200));
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded) << timed_out;
  EXPECT_THAT(timed_out.message(), HasSubstr("never"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
}

TEST_F(RemoteStoreTest, AWaitRidesOutACoordinatorRestart) {
  std::unique_ptr<RemoteStore> store = Connect("secret", "job-1/1", absl::Milliseconds(500));
  ASSERT_TRUE(store->Set("before", "kept").ok());
  std::future<absl::Status> waited =
      std::async(std::launch::async, [&] { return store->Wait({"after"}, absl::Seconds(30)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int port = coordinator_.port();
  coordinator_.Stop();
  // Down long enough for the waiter's retries to meet a refused connection.
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(waited.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the Wait returned while the coordinator was down: " << waited.get();
  coordinator_.Start(port);
  coordinator_.state().StoreOf("job-1/1").Set("after", "1").IgnoreError();
  ASSERT_EQ(waited.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_TRUE(waited.get().ok());
  EXPECT_EQ(store->Get("before").value(), "kept");
}

TEST_F(RemoteStoreTest, AWrongTokenIsRefusedNamingTheKeyAndCoordinator) {
  std::unique_ptr<RemoteStore> store = Connect("not-the-token");
  absl::Status set = store->Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnauthenticated) << set;
  EXPECT_THAT(set.message(), HasSubstr("wrong token"));
  EXPECT_THAT(set.message(), HasSubstr("'k'"));
  EXPECT_THAT(set.message(), HasSubstr(coordinator_.address()));
  EXPECT_EQ(store->Add("n", 1).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(coordinator_.state().StoreOf("job-1/1").Contains("k").value());
}

TEST_F(RemoteStoreTest, AnUnreachableCoordinatorIsReportedAfterTheRetryWindow) {
  auto channel = ConnectControlPlane({.address = coordinator_.address()});
  ASSERT_TRUE(channel.ok());
  RemoteStoreOptions options{
      .coordinator = coordinator_.address(), .token = "secret", .scope = "s"};
  options.retry.retry_for = absl::Milliseconds(300);
  std::unique_ptr<RemoteStore> store = RemoteStore::Create(*channel, options).value();
  coordinator_.Stop();
  absl::Status set = store->Set("k", "v");
  EXPECT_EQ(set.code(), absl::StatusCode::kUnavailable) << set;
  EXPECT_THAT(set.message(), HasSubstr("unreachable"));
  EXPECT_THAT(set.message(), HasSubstr(coordinator_.address()));
}

TEST(RemoteStoreCreate, RefusesAnEmptyScopeOrToken) {
  auto channel = ConnectControlPlane({.address = "127.0.0.1:1"}).value();
  EXPECT_THAT(RemoteStore::Create(channel, {.token = "t"}).status().message(), HasSubstr("scope"));
  EXPECT_THAT(RemoteStore::Create(channel, {.scope = "s"}).status().message(), HasSubstr("token"));
}

}  // namespace
}  // namespace zt
