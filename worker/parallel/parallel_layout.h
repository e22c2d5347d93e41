// The place of one rank in a job's 3D layout (tensor × data × pipeline parallel), derived once
// from the job and handed to the memory plan, the communicators and the engines, so that no
// part re-derives it.
//
// Rank order, as Megatron-LM orders it: tensor-parallel innermost, then data-parallel, then
// pipeline-parallel outermost (docs/parallelism.md):
//
//   rank = tp_rank + tp · (dp_rank + dp · pp_rank)        tp · dp · pp = world
//
// TP innermost puts each TP group on consecutive ranks, hence on one node, where its
// per-layer all-reduces find the fastest links; PP outermost sends only activations between
// nodes. With tp = pp = 1 the data-parallel group is the world and dp_rank is the rank.
//
// ZeRO works inside the data-parallel group (DESIGN.md, "Shard"): its G = shard_group_size
// consecutive data-parallel members shard one copy of the model states; the dp / G shard
// groups replicate it (hybrid sharding). ShardGeometry is that geometry.
//
// Values: copyable, immutable, thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"

namespace zt {

// ZeRO's geometry inside one data-parallel group. The N members form N/G shard groups of G
// consecutive members (G = parallel.shard_group_size; G = N unless hybrid): member r is member
// r mod G of shard group r / G. Inside a shard group the model states are sharded; across
// groups they are replicated.
struct ShardGeometry {
  int world_size = 1;  // N: the data-parallel size (the job's world when tp = pp = 1)
  int group_size = 1;  // G
  int rank = 0;        // this rank's place in its data-parallel group
  // 0: every unit splits into G equal flat shards (ShardOf). > 0: the tied embedding is split
  // by whole rows of this many elements (d_model) instead — [wte; wpe] read as a (V + P) × C
  // matrix — so each rank owns a range of vocabulary (and position) rows
  // (VocabularyShardedEmbedding; ShardOfUnit in worker/plan/memory_plan.h).
  int64_t embedding_row_numel = 0;
  int group_rank() const { return rank % group_size; }
  int group() const { return rank / group_size; }
  int groups() const { return world_size / group_size; }
};

// Whether the job's tied embedding is sharded by vocabulary rows over its ZeRO shard group
// (issue 18; docs/memory.md, "The tied embedding at ZeRO-3"): stage 3 with tied embeddings,
// a shard group of 2 or more ranks, tensor and pipeline parallelism 1 (a TP rank's embedding is
// already its vocabulary share), no LoRA (a frozen embedding has no gradient to shard),
// offload.params NONE, on CPU or CUDA ranks (the vocabulary-parallel kernels have CUDA twins,
// kernels/cuda/tensor_parallel.h; the collectives go over the rank's device communicator). The
// embedding then never exists whole on a rank: the lookup and the head run
// vocabulary-parallel over the shard group.
bool VocabularyShardedEmbedding(const zerotrain::JobSpec& job);

struct ParallelSizes {
  int world = 1;
  int tensor = 1;
  int pipeline = 1;
  // Data-parallel members per ZeRO shard group; 0: the whole data-parallel group.
  int shard_group = 0;
};

// A rank's coordinates along the three dimensions.
struct ParallelCoordinates {
  int tensor = 0;
  int data = 0;
  int pipeline = 0;
  bool operator==(const ParallelCoordinates&) const = default;
};

class ParallelLayout {
 public:
  // InvalidArgument naming the size and the rule when world is not tensor · pipeline · (a
  // whole data-parallel size), shard_group does not divide the data-parallel size, a size is
  // below 1, or rank is outside [0, world).
  static absl::StatusOr<ParallelLayout> Create(const ParallelSizes& sizes, int rank);

  // Rank `rank` of `job` (world_size, tensor_parallel, pipeline_parallel, shard_group_size),
  // for a job ValidateJobSpec accepted. Total, because plans are also asked of candidate jobs:
  // a size that does not fit falls back to one rank on its dimension (tensor, pipeline; the
  // whole data-parallel group for the shard group), and the rank is taken modulo the world.
  static ParallelLayout ForJob(const zerotrain::JobSpec& job, int rank);

  int world_size() const { return world_; }
  int tensor_size() const { return tensor_; }
  int pipeline_size() const { return pipeline_; }
  int data_size() const { return world_ / (tensor_ * pipeline_); }
  int rank() const { return rank_; }
  const ParallelCoordinates& coordinates() const { return coords_; }

  // The rank at `c`, each coordinate within its size.
  int RankAt(const ParallelCoordinates& c) const;
  ParallelCoordinates CoordinatesOf(int rank) const;

  // Ranks of this rank's groups, ascending (each group's i-th member has coordinate i on the
  // group's dimension): TP (same data and pipeline coordinates), PP (same tensor and data),
  // DP (same tensor and pipeline), its ZeRO shard group (G consecutive DP members) and its
  // replica group (the DP members with the same place in their shard group).
  std::vector<int> TensorGroup() const;
  std::vector<int> PipelineGroup() const;
  std::vector<int> DataGroup() const;
  std::vector<int> ShardGroup() const;
  std::vector<int> ReplicaGroup() const;

  // Which group of its kind this rank's DP group is, in [0, world / data_size): the groups
  // are numbered by (pipeline, tensor) coordinates, pipeline major. Names communicators.
  int DataGroupIndex() const { return coords_.pipeline * tensor_ + coords_.tensor; }

  // ZeRO inside this rank's data-parallel group.
  const ShardGeometry& shard() const { return shard_; }

 private:
  ParallelLayout() = default;

  int world_ = 1, tensor_ = 1, pipeline_ = 1;
  int rank_ = 0;
  ParallelCoordinates coords_;
  ShardGeometry shard_;
};

}  // namespace zt
