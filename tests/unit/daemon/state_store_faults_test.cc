// The state store on a disk that fills and frees (issue 20): writes fail cleanly while it is
// full, and the store writes again by itself once space is back, with no reopen. Through
// FullDiskFs, a RocksDB FileSystem that fails writes with ENOSPC on demand.
#include "daemon/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/daemon_test_util.h"
#include "tests/unit/daemon/full_disk_fs.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

zerotrain::Job JobNamed(const std::string& id) {
  zerotrain::Job job;
  job.set_id(id);
  job.set_state(zerotrain::Job::PENDING);
  job.mutable_spec()->set_name("n");
  return job;
}

// `write` until it succeeds or `timeout` passes; its last status. RocksDB's own recovery (its
// SstFileManager's) and the store's Resume() race for the first moments after space is back,
// so the first write may still fail; within milliseconds one of them has resumed the database.
template <typename Write>
absl::Status SucceedsWithin(absl::Duration timeout, Write write) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status status = write();
  while (!status.ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    status = write();
  }
  return status;
}

// A store in a temporary directory on a FullDiskFs; `store` is null when it did not open.
struct FullDiskStore {
  FullDiskStore() {
    absl::StatusOr<std::unique_ptr<StateStore>> opened =
        StateStore::Open(dir.path(), {.env = disk.env.get()});
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (opened.ok()) store = *std::move(opened);
  }
  testing::TempDir dir;
  testing::FullDiskEnv disk;
  std::unique_ptr<StateStore> store;
};

// SyncLog makes the log's unsynced writes durable, and fails as a write does when it cannot.
TEST(StateStoreFaultsTest, SyncLogSyncsOrFailsAsAWrite) {
  FullDiskStore fixture;
  ASSERT_NE(fixture.store, nullptr);
  StateStore& store = *fixture.store;
  ASSERT_TRUE(store.KvSet("a/1", "k", "v").ok());  // to the log only
  int before = fixture.disk.fs->syncs();
  ASSERT_TRUE(store.SyncLog().ok());
  EXPECT_GT(fixture.disk.fs->syncs(), before);

  ASSERT_TRUE(store.KvSet("a/1", "k", "w").ok());
  fixture.disk.fs->SetSyncsFail(true);
  const absl::Status failed = store.SyncLog();
  EXPECT_TRUE(absl::IsUnavailable(failed)) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("syncing the write-ahead log"));
  EXPECT_FALSE(store.writable());
  EXPECT_GE(store.write_errors(), 1);
  fixture.disk.fs->SetSyncsFail(false);
}

TEST(StateStoreFaultsTest, WritesAgainByItselfOnceTheFullDiskHasSpace) {
  FullDiskStore fixture;
  ASSERT_NE(fixture.store, nullptr);
  testing::FullDiskEnv& disk = fixture.disk;
  StateStore& store = *fixture.store;
  ASSERT_TRUE(store.PutJob(JobNamed("before-1")).ok());
  EXPECT_TRUE(store.writable());

  disk.fs->SetFull(true);
  const absl::Status full = store.PutJob(JobNamed("during-2"));
  EXPECT_TRUE(absl::IsUnavailable(full)) << full;
  EXPECT_THAT(full.message(), HasSubstr("No space left"));
  EXPECT_THAT(full.message(), HasSubstr("resumes by itself"));
  EXPECT_FALSE(store.writable());
  EXPECT_FALSE(store.Writable()) << "still full: Resume() cannot succeed";
  EXPECT_FALSE(store.NextJobNumber(Durability::kSync).ok());
  EXPECT_FALSE(store.KvSet("a/1", "k", "v").ok());
  EXPECT_GE(store.write_errors(), 3);
  EXPECT_GT(disk.fs->refused(), 0);

  // Space is back: a write resumes the database first (before issue 20 every write failed
  // until the process restarted: RocksDB's background error stayed).
  disk.fs->SetFull(false);
  const absl::Status after =
      SucceedsWithin(absl::Seconds(10), [&] { return store.PutJob(JobNamed("after-3")); });
  ASSERT_TRUE(after.ok()) << after;
  EXPECT_TRUE(store.writable());
  ASSERT_TRUE(store.KvSet("a/1", "k", "v").ok());
  absl::StatusOr<std::vector<zerotrain::Job>> jobs = store.LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  std::vector<std::string> ids;
  for (const zerotrain::Job& job : *jobs) ids.push_back(job.id());
  EXPECT_THAT(ids, ::testing::ElementsAre("after-3", "before-1"));
}

TEST(StateStoreFaultsTest, WritableResumesWithoutAWrite) {
  FullDiskStore fixture;
  ASSERT_NE(fixture.store, nullptr);
  testing::FullDiskEnv& disk = fixture.disk;
  StateStore& store = *fixture.store;
  disk.fs->SetFull(true);
  ASSERT_FALSE(store.PutJob(JobNamed("a-1")).ok());
  EXPECT_FALSE(store.Writable());
  disk.fs->SetFull(false);
  const absl::Status writable = SucceedsWithin(absl::Seconds(10), [&] {
    return store.Writable() ? absl::OkStatus() : absl::UnavailableError("not writable");
  });
  EXPECT_TRUE(writable.ok());
  EXPECT_TRUE(store.writable());
  EXPECT_TRUE(store.PutJob(JobNamed("b-2")).ok());
}

TEST(StateStoreFaultsTest, SurvivesManyFullAndFreeCyclesAndReopens) {
  testing::TempDir dir;
  testing::FullDiskEnv disk;
  {
    absl::StatusOr<std::unique_ptr<StateStore>> opened =
        StateStore::Open(dir.path(), {.env = disk.env.get()});
    ASSERT_TRUE(opened.ok()) << opened.status();
    for (int cycle = 0; cycle < 20; ++cycle) {
      disk.fs->SetFull(true);
      EXPECT_FALSE((*opened)->PutJob(JobNamed(absl::StrCat("lost-", cycle))).ok());
      disk.fs->SetFull(false);
      const absl::Status kept = SucceedsWithin(absl::Seconds(10), [&] {
        return (*opened)->PutJob(JobNamed(absl::StrCat("kept-", cycle)));
      });
      ASSERT_TRUE(kept.ok()) << cycle << ": " << kept;
    }
  }
  absl::StatusOr<std::unique_ptr<StateStore>> reopened = StateStore::Open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<std::vector<zerotrain::Job>> jobs = (*reopened)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 20u);
  for (const zerotrain::Job& job : *jobs) EXPECT_THAT(job.id(), HasSubstr("kept-"));
}

TEST(StateStoreFaultsTest, WritesBelowTheFreeSpaceReserveAreRefusedBeforeRocksDbSeesThem) {
  testing::TempDir dir;
  ASSERT_TRUE(StateStore::Open(dir.path()).ok());  // writes the format record
  // No disk has an exabyte free: every write is under the reserve.
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      StateStore::Open(dir.path(), {.min_free_bytes = int64_t{1} << 60});
  ASSERT_TRUE(store.ok()) << store.status();
  const absl::Status refused = (*store)->PutJob(JobNamed("a-1"));
  EXPECT_TRUE(absl::IsUnavailable(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("bytes free"));
  EXPECT_THAT(refused.message(), HasSubstr(dir.path()));
  EXPECT_FALSE((*store)->writable());
  EXPECT_FALSE((*store)->Writable());
  absl::StatusOr<std::vector<zerotrain::Job>> jobs = (*store)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << "reads go on: " << jobs.status();
  EXPECT_TRUE(jobs->empty());
}

}  // namespace
}  // namespace zt
