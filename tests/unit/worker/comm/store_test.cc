#include "worker/comm/store.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

enum class StoreKind { kInProcess, kFile };

class StoreTest : public ::testing::TestWithParam<StoreKind> {
 protected:
  void SetUp() override {
    if (GetParam() == StoreKind::kInProcess) {
      store_ = std::make_unique<InProcessStore>();
      return;
    }
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = absl::StrCat(::testing::TempDir(), "/zt_filestore_", getpid(), "_", name);
    std::filesystem::remove_all(dir_);
    auto fs = FileStore::Create(dir_, absl::Milliseconds(1));
    ASSERT_TRUE(fs.ok()) << fs.status();
    store_ = std::move(*fs);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Store> store_;
  std::string dir_;
};

TEST_P(StoreTest, SetGetRoundTripsBytesAndKeysWithSlashes) {
  const std::string value("a\0b/\xff", 5);
  ASSERT_TRUE(store_->Set("grp/unit 3/0/arrived/1", value).ok());
  auto got = store_->Get("grp/unit 3/0/arrived/1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, value);
  // A key that differs only in an escaped character is another key.
  EXPECT_TRUE(absl::IsNotFound(store_->Get("grp/unit 3/0/arrived_1").status()));
  ASSERT_TRUE(store_->Set("grp/unit 3/0/arrived/1", "new").ok());
  EXPECT_EQ(*store_->Get("grp/unit 3/0/arrived/1"), "new");
  EXPECT_TRUE(*store_->Contains("grp/unit 3/0/arrived/1"));
  EXPECT_FALSE(*store_->Contains("absent"));
}

TEST_P(StoreTest, WaitReturnsWhenAnotherThreadSetsTheKeys) {
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_TRUE(store_->Set("a", "1").ok());
    ASSERT_TRUE(store_->Set("b", "2").ok());
  });
  absl::Status s = store_->Wait({"a", "b"}, absl::Seconds(10));
  setter.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(*store_->Get("b"), "2");
}

TEST_P(StoreTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  ASSERT_TRUE(store_->Set("present", "x").ok());
  const absl::Time start = absl::Now();
  absl::Status s = store_->Wait({"present", "missing/1"}, absl::Milliseconds(100));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find("missing/1"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("present"), std::string::npos) << s;
  EXPECT_GE(took, absl::Milliseconds(100));
  // Generous: only guards against waiting forever on a loaded 2-core machine.
  EXPECT_LT(took, absl::Seconds(5));
}

TEST_P(StoreTest, AddIsAtomicAcrossThreads) {
  constexpr int kPerThread = 200;
  auto bump = [&] {
    for (int i = 0; i < kPerThread; ++i) ASSERT_TRUE(store_->Add("counter", 1).ok());
  };
  std::thread t1(bump), t2(bump);
  t1.join();
  t2.join();
  auto v = store_->Add("counter", 5);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 2 * kPerThread + 5);
  EXPECT_EQ(*store_->Get("counter"), absl::StrCat(2 * kPerThread + 5));
  ASSERT_TRUE(store_->Set("text", "abc").ok());
  absl::StatusOr<int64_t> bad = store_->Add("text", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("text"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest,
                         ::testing::Values(StoreKind::kInProcess, StoreKind::kFile),
                         [](const auto& info) {
                           return info.param == StoreKind::kInProcess ? "InProcess" : "File";
                         });

}  // namespace
}  // namespace zt
