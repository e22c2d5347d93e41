#include "worker/parallel/parallel_layout.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace zt {

absl::StatusOr<ParallelLayout> ParallelLayout::Create(const ParallelSizes& sizes, int rank) {
  for (const auto& [name, value] :
       {std::pair{"world", sizes.world}, std::pair{"tensor", sizes.tensor},
        std::pair{"pipeline", sizes.pipeline}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("parallel layout: the ", name, " size must be >= 1 (got ", value, ")"));
    }
  }
  const int64_t model_parallel = int64_t{sizes.tensor} * sizes.pipeline;
  if (sizes.world % model_parallel != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel layout: world size ", sizes.world, " is not divisible by tensor ",
                     sizes.tensor, " × pipeline ", sizes.pipeline, " = ", model_parallel));
  }
  const int data = static_cast<int>(sizes.world / model_parallel);
  const int shard_group = sizes.shard_group == 0 ? data : sizes.shard_group;
  if (shard_group < 1 || data % shard_group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel layout: shard group size ", shard_group,
                     " does not divide the data-parallel size ", data));
  }
  if (rank < 0 || rank >= sizes.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel layout: rank ", rank, " is outside [0, ", sizes.world, ")"));
  }
  ParallelLayout l;
  l.world_ = sizes.world;
  l.tensor_ = sizes.tensor;
  l.pipeline_ = sizes.pipeline;
  l.rank_ = rank;
  l.coords_ = l.CoordinatesOf(rank);
  l.shard_ = {.world_size = data, .group_size = shard_group, .rank = l.coords_.data};
  return l;
}

ParallelLayout ParallelLayout::ForJob(const zerotrain::JobSpec& job, int rank) {
  const zerotrain::ParallelConfig& p = job.parallel();
  ParallelSizes sizes{.world = std::max(1, p.world_size())};
  const int tensor = std::max(1, p.tensor_parallel());
  const int pipeline = std::max(1, p.pipeline_parallel());
  if (sizes.world % tensor == 0) sizes.tensor = tensor;
  if (sizes.world % (int64_t{sizes.tensor} * pipeline) == 0) sizes.pipeline = pipeline;
  const int data = sizes.world / (sizes.tensor * sizes.pipeline);
  const int g = p.shard_group_size();
  sizes.shard_group = g >= 1 && data % g == 0 ? g : data;
  const int r = ((rank % sizes.world) + sizes.world) % sizes.world;
  // Every size now fits, so Create cannot fail.
  ParallelLayout layout = *Create(sizes, r);
  if (VocabularyShardedEmbedding(job)) {
    layout.shard_.embedding_row_numel = std::max<int64_t>(1, job.model().d_model());
  }
  return layout;
}

namespace {

int64_t DTypeBytes(zerotrain::PrecisionConfig::DType d) {
  return d == zerotrain::PrecisionConfig::BF16 || d == zerotrain::PrecisionConfig::FP16 ? 2 : 4;
}

}  // namespace

bool VocabularyShardedEmbedding(const zerotrain::JobSpec& job) {
  const zerotrain::ParallelConfig& p = job.parallel();
  const zerotrain::ModelConfig& m = job.model();
  const int world = std::max(1, p.world_size());
  const int g = p.shard_group_size();
  const int64_t group = g >= 1 && world % g == 0 ? g : world;
  const bool applies = p.zero_stage() == 3 && m.tie_embeddings() &&
                       std::max(1, p.tensor_parallel()) == 1 &&
                       std::max(1, p.pipeline_parallel()) == 1 && group > 1 && !m.has_lora() &&
                       job.offload().params() != zerotrain::OffloadConfig::CPU &&
                       job.offload().params() != zerotrain::OffloadConfig::NVME && m.d_model() > 0;
  if (!applies) return false;
  if (p.has_vocab_sharded_embedding()) return p.vocab_sharded_embedding();
  // Unset: split when that holds less. Gathered, the embedding costs its whole parameters
  // twice (the gathered copy the lookup and the head read, and its slot in the gather buffer,
  // which then outgrows a block's; ModelStatesTest.ZeroStagesDivideAsThePaperSays counts both)
  // and its whole gradient: (V + P)·C·(2·param + grad bytes). Split, the group's rows in the
  // compute dtype and their gradients' f32 partials, G·B·T·C·(compute + 4) bytes, and with
  // 16-bit activations the partials' f32 sum, B·T·C·4 (the ids and row statistics are
  // smaller by a factor of C). C cancels.
  const auto& precision = job.precision();
  const int64_t rows =
      m.vocab_size() +
      (m.family() == zerotrain::ModelConfig::GPT2 ? int64_t{m.max_seq_len()} : int64_t{0});
  const int64_t whole =
      rows * (2 * DTypeBytes(precision.param_dtype()) + DTypeBytes(precision.grad_dtype()));
  const int64_t tokens = int64_t{job.train().micro_batch_size()} * job.data().seq_len();
  const int64_t compute = DTypeBytes(precision.compute_dtype());
  const int64_t split = group * tokens * (compute + 4) + (compute == 4 ? 0 : tokens * 4);
  return whole > split;
}

int ParallelLayout::RankAt(const ParallelCoordinates& c) const {
  return c.tensor + tensor_ * (c.data + data_size() * c.pipeline);
}

ParallelCoordinates ParallelLayout::CoordinatesOf(int rank) const {
  return {.tensor = rank % tensor_,
          .data = rank / tensor_ % data_size(),
          .pipeline = rank / (tensor_ * data_size())};
}

std::vector<int> ParallelLayout::TensorGroup() const {
  std::vector<int> ranks;
  for (int t = 0; t < tensor_; ++t) {
    ranks.push_back(RankAt({.tensor = t, .data = coords_.data, .pipeline = coords_.pipeline}));
  }
  return ranks;
}

std::vector<int> ParallelLayout::PipelineGroup() const {
  std::vector<int> ranks;
  for (int p = 0; p < pipeline_; ++p) {
    ranks.push_back(RankAt({.tensor = coords_.tensor, .data = coords_.data, .pipeline = p}));
  }
  return ranks;
}

std::vector<int> ParallelLayout::DataGroup() const {
  std::vector<int> ranks;
  for (int d = 0; d < data_size(); ++d) {
    ranks.push_back(RankAt({.tensor = coords_.tensor, .data = d, .pipeline = coords_.pipeline}));
  }
  return ranks;
}

std::vector<int> ParallelLayout::ShardGroup() const {
  std::vector<int> ranks;
  const int first = shard_.group() * shard_.group_size;
  for (int d = first; d < first + shard_.group_size; ++d) {
    ranks.push_back(RankAt({.tensor = coords_.tensor, .data = d, .pipeline = coords_.pipeline}));
  }
  return ranks;
}

std::vector<int> ParallelLayout::ReplicaGroup() const {
  std::vector<int> ranks;
  for (int g = 0; g < shard_.groups(); ++g) {
    const int d = g * shard_.group_size + shard_.group_rank();
    ranks.push_back(RankAt({.tensor = coords_.tensor, .data = d, .pipeline = coords_.pipeline}));
  }
  return ranks;
}

}  // namespace zt
