#include "daemon/state_store.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/unit/daemon/daemon_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

zerotrain::Job JobNamed(const std::string& id, zerotrain::Job::State state) {
  zerotrain::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_name("n");
  job.set_created_ms(1234);
  return job;
}

zerotrain::JobEvent Event(int64_t sequence, const std::string& message) {
  zerotrain::JobEvent event;
  event.set_sequence(sequence);
  event.set_message(message);
  return event;
}

TEST(StateStoreTest, EverythingWrittenIsThereAfterReopening) {
  testing::TempDir dir;
  {
    absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->PutJob(JobNamed("a-1", zerotrain::Job::PENDING)).ok());
    // Twelve events so that a lexical order of unpadded numbers (1, 10, 11, 12, 2, ...) would
    // show as a wrong order.
    for (int64_t seq = 1; seq <= 12; ++seq) {
      ASSERT_TRUE((*store)
                      ->PutJobWithEvent(JobNamed("b-2", zerotrain::Job::RUNNING),
                                        Event(seq, absl::StrCat("e", seq)),
                                        seq % 2 == 0 ? Durability::kSync : Durability::kWal)
                      .ok());
    }
    ASSERT_TRUE((*store)->PutNode(testing::NodeWithDevices("node-a", 2, 1 << 30), 99).ok());
    EXPECT_EQ(*(*store)->NextJobNumber(Durability::kSync), 1);
    // The coordinator's way: the counter in the log only, synced by the next synced write.
    EXPECT_EQ(*(*store)->NextJobNumber(Durability::kWal), 2);
    ASSERT_TRUE((*store)->KvSet("b-2/1", "k", std::string("v\0w", 3)).ok());
    ASSERT_TRUE((*store)->KvSet("b-20/1", "k", "other job").ok());
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::vector<zerotrain::Job>> jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ((*jobs)[0].id(), "a-1");
  EXPECT_EQ((*jobs)[0].created_ms(), 1234);
  EXPECT_EQ((*jobs)[1].state(), zerotrain::Job::RUNNING);
  absl::StatusOr<std::vector<zerotrain::JobEvent>> events = (*store)->LoadEvents("b-2");
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ((*events)[i].sequence(), i + 1);
  EXPECT_TRUE((*store)->LoadEvents("a-1")->empty());
  absl::StatusOr<std::vector<zerotrain::Node>> nodes = (*store)->LoadNodes();
  ASSERT_TRUE(nodes.ok());
  ASSERT_EQ(nodes->size(), 1u);
  EXPECT_EQ((*nodes)[0].info().devices_size(), 2);
  EXPECT_EQ((*nodes)[0].registered_ms(), 99);
  EXPECT_EQ(*(*store)->NextJobNumber(Durability::kSync), 3);
  EXPECT_EQ(**(*store)->KvGet("b-2/1", "k"), std::string("v\0w", 3));
  EXPECT_FALSE((*store)->KvGet("b-2/1", "missing")->has_value());

  // A job's scopes go; another job whose id extends it keeps its own.
  ASSERT_TRUE((*store)->KvDeletePrefix("b-2/").ok());
  EXPECT_FALSE((*store)->KvGet("b-2/1", "k")->has_value());
  EXPECT_EQ(**(*store)->KvGet("b-20/1", "k"), "other job");
}

TEST(StateStoreTest, CorruptRecordIsDataLossNamingTheKey) {
  testing::TempDir dir;
  {
    absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->PutJob(JobNamed("a-1", zerotrain::Job::PENDING)).ok());
  }
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.Sub("db"), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    // A field tag with wire type 7 does not exist: no proto parses this.
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "job/a-1", "\xff\xff\xff\xff").ok());
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
  ASSERT_TRUE(store.ok());
  absl::StatusOr<std::vector<zerotrain::Job>> jobs = (*store)->LoadJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(jobs.status().message(), HasSubstr("'job/a-1'"));
}

TEST(StateStoreTest, OtherFormatIsRefusedNamingTheDirectory) {
  testing::TempDir dir;
  { ASSERT_TRUE(StateStore::Open(dir.path()).ok()); }
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir.Sub("db"), &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "meta/format", "zerotrain-state 99").ok());
  }
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.path());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(store.status().message(), HasSubstr(dir.path()));
  EXPECT_THAT(store.status().message(), HasSubstr("zerotrain-state 99"));
}

TEST(StateStoreTest, MissingDirectoryIsNamed) {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<StateStore>> store = StateStore::Open(dir.Sub("nope"));
  EXPECT_EQ(store.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store.status().message(), HasSubstr(dir.Sub("nope")));
}

}  // namespace
}  // namespace zt
