// The row-aligned shard of a unit (issue 18's step 1 for the tied embedding): G equal,
// aligned, contiguous shards of whole rows, checked against a brute-force reference of the
// fewest whole rows per rank whose elements are a multiple of the alignment.
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

ShardGeometry Group(int group_size, int rank, int world_size = 0) {
  return {.world_size = world_size > 0 ? world_size : group_size,
          .group_size = group_size,
          .rank = rank};
}

// GPT-2 1.5B's embedding unit, [wte; wpe] = (50257 + 1024) x 1600, at 8 ranks: 6411 rows each
// (ceil(51281 / 8); 1600 elements is already a multiple of 64), the last rank 6404.
TEST(RowAlignedShardTest, GptTwoXlEmbeddingAtEightRanks) {
  constexpr int64_t kRows = 50257 + 1024, kC = 1600;
  for (int r = 0; r < 8; ++r) {
    absl::StatusOr<UnitShard> s = RowAlignedShardOf(kRows * kC, kC, Group(8, r));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->shard_numel, 6411 * kC);
    EXPECT_EQ(s->padded, 8 * 6411 * kC);
    EXPECT_EQ(s->offset, r * 6411 * kC);
    EXPECT_EQ(s->owned.begin, r * 6411 * kC);
    EXPECT_EQ(s->owned.end, r == 7 ? kRows * kC : (r + 1) * 6411 * kC);
  }
}

// The fewest rows >= ceil(rows / G) whose elements are a multiple of the alignment, found by
// counting up (the function under test computes it with a gcd).
int64_t ReferenceRowsPerShard(int64_t rows, int64_t row_numel, int group_size) {
  int64_t r = (rows + group_size - 1) / group_size;
  while ((r * row_numel) % kShardAlignmentElements != 0) ++r;
  return r;
}

TEST(RowAlignedShardTest, EqualAlignedShardsOfWholeRowsCoverTheUnit) {
  for (int64_t row_numel : {1, 7, 48, 64, 100, 768, 1600}) {
    for (int64_t rows : {1, 5, 63, 64, 1000, 51281}) {
      for (int g : {1, 2, 3, 4, 8}) {
        const int64_t numel = rows * row_numel;
        const int64_t want_rows = ReferenceRowsPerShard(rows, row_numel, g);
        int64_t covered = 0;
        for (int r = 0; r < g; ++r) {
          absl::StatusOr<UnitShard> s = RowAlignedShardOf(numel, row_numel, Group(g, r));
          ASSERT_TRUE(s.ok()) << s.status();
          SCOPED_TRACE(testing::Message() << "C " << row_numel << " rows " << rows << " G " << g
                                          << " rank " << r);
          EXPECT_EQ(s->numel, numel);
          EXPECT_EQ(s->shard_numel, want_rows * row_numel);
          EXPECT_EQ(s->shard_numel % kShardAlignmentElements, 0);
          EXPECT_EQ(s->padded, s->shard_numel * g);
          EXPECT_GE(s->padded, numel);
          EXPECT_EQ(s->offset, r * s->shard_numel);
          // Owned ranges follow each other without a gap and start and end on row boundaries.
          EXPECT_EQ(s->owned.begin, covered);
          EXPECT_EQ(s->owned.begin % row_numel, 0);
          EXPECT_EQ(s->owned.end % row_numel, 0);
          EXPECT_LE(s->owned.end - s->owned.begin, s->shard_numel);
          covered = s->owned.end;
        }
        EXPECT_EQ(covered, numel) << "C " << row_numel << " rows " << rows << " G " << g;
      }
    }
  }
}

// With hybrid sharding the shard is of the rank's place in its shard group, as ShardOf's.
TEST(RowAlignedShardTest, HybridShardingUsesTheShardGroupRank) {
  constexpr int64_t kC = 64, kRows = 1000;
  // World 8 in shard groups of 4: rank 5 is member 1 of group 1, so it owns group rank 1's
  // rows, the same rows as rank 1.
  absl::StatusOr<UnitShard> hybrid = RowAlignedShardOf(kRows * kC, kC, Group(4, 5, 8));
  absl::StatusOr<UnitShard> flat = RowAlignedShardOf(kRows * kC, kC, Group(4, 1));
  ASSERT_TRUE(hybrid.ok() && flat.ok());
  EXPECT_EQ(hybrid->owned.begin, 250 * kC);
  EXPECT_EQ(hybrid->owned.end, 500 * kC);
  EXPECT_EQ(hybrid->offset, flat->offset);
}

TEST(RowAlignedShardTest, PartialRowsAreRefused) {
  for (int64_t row_numel : {0, -3, 7}) {
    absl::StatusOr<UnitShard> s = RowAlignedShardOf(100, row_numel, Group(2, 0));
    ASSERT_FALSE(s.ok()) << row_numel;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(s.status().message(), "row_numel")) << s.status();
  }
}

}  // namespace
}  // namespace zt
