// Tests of daemon/job_index.h: the counts, the queue and the checkpoint directories follow every
// state change and removal, and the overlap lookup finds the same directory, an ancestor and a
// descendant by path components, never a sibling that merely shares a prefix.
#include "daemon/job_index.h"

#include <map>
#include <set>
#include <string>

#include "gtest/gtest.h"

namespace zt {
namespace {

using zerotrain::Job;
using Relation = JobIndex::CheckpointOverlap::Relation;

Job MakeJob(const std::string& id, Job::State state, const std::string& checkpoint_dir) {
  Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->mutable_checkpoint()->set_dir(checkpoint_dir);
  return job;
}

TEST(JobIndexTest, CountsAndQueueFollowStateChangesAndRemoval) {
  JobIndex index;
  Job a = MakeJob("a-1", Job::PENDING, "");
  Job b = MakeJob("b-2", Job::PENDING, "");
  index.Put(a);
  index.Put(b);
  EXPECT_EQ(index.counts(), (std::map<Job::State, int>{{Job::PENDING, 2}}));
  EXPECT_EQ(index.queued(), (std::set<std::string>{"a-1", "b-2"}));

  a.set_state(Job::RUNNING);
  index.Put(a);
  b.set_state(Job::RESTARTING);
  index.Put(b);
  EXPECT_EQ(index.counts(), (std::map<Job::State, int>{{Job::RUNNING, 1}, {Job::RESTARTING, 1}}));
  EXPECT_EQ(index.queued(), (std::set<std::string>{"b-2"}));

  index.Remove("b-2");
  index.Remove("never-added");
  EXPECT_EQ(index.counts(), (std::map<Job::State, int>{{Job::RUNNING, 1}}));
  EXPECT_TRUE(index.queued().empty());
}

TEST(JobIndexTest, OverlapsAreFoundByPathComponents) {
  JobIndex index;
  index.Put(MakeJob("owner-1", Job::RUNNING, "/data/ckpt/run"));
  const auto find = [&](const std::string& dir) {
    return index.FindCheckpointOverlap(NormalCheckpointDir(dir));
  };
  for (const auto& [dir, relation] :
       std::map<std::string, Relation>{{"/data/ckpt/run", Relation::kSame},
                                       {"/data/ckpt/run/", Relation::kSame},
                                       {"/data//ckpt/./run", Relation::kSame},
                                       {"/data/ckpt/run/step-5", Relation::kInside},
                                       {"/data/ckpt", Relation::kContains},
                                       {"/", Relation::kContains}}) {
    const auto overlap = find(dir);
    ASSERT_TRUE(overlap.has_value()) << dir;
    EXPECT_EQ(overlap->job_id, "owner-1") << dir;
    EXPECT_EQ(overlap->dir, "/data/ckpt/run") << dir;
    EXPECT_EQ(overlap->relation, relation) << dir;
  }
  // Siblings sharing a prefix of characters are not inside one another.
  EXPECT_FALSE(find("/data/ckpt/run2").has_value());
  EXPECT_FALSE(find("/data/ckpt/ru").has_value());
  EXPECT_FALSE(find("/data/ckp").has_value());
}

TEST(JobIndexTest, FinishedOrRemovedJobsReleaseTheirDirectoryAndSharersStay) {
  JobIndex index;
  Job first = MakeJob("first-1", Job::RUNNING, "/ckpt/shared");
  Job second = MakeJob("second-2", Job::PENDING, "/ckpt/shared");  // e.g. a takeover
  index.Put(first);
  index.Put(second);
  first.set_state(Job::SUCCEEDED);
  index.Put(first);
  auto overlap = index.FindCheckpointOverlap("/ckpt/shared");
  ASSERT_TRUE(overlap.has_value());
  EXPECT_EQ(overlap->job_id, "second-2");

  index.Remove("second-2");
  EXPECT_FALSE(index.FindCheckpointOverlap("/ckpt/shared").has_value());
  // A finished job put again (a recovered store) is not an owner either.
  index.Put(first);
  EXPECT_FALSE(index.FindCheckpointOverlap("/ckpt").has_value());
  EXPECT_EQ(index.counts(), (std::map<Job::State, int>{{Job::SUCCEEDED, 1}}));
}

TEST(JobIndexTest, RelativeDirectoriesAreTakenFromTheWorkingDirectory) {
  JobIndex index;
  index.Put(MakeJob("rel-1", Job::PLACED, "ckpt/rel"));
  const auto overlap = index.FindCheckpointOverlap(NormalCheckpointDir("./ckpt/rel/x"));
  ASSERT_TRUE(overlap.has_value());
  EXPECT_EQ(overlap->relation, Relation::kInside);
  EXPECT_EQ(overlap->dir, std::filesystem::current_path() / "ckpt/rel");
}

}  // namespace
}  // namespace zt
