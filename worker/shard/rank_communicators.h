// The communicators one rank of a job needs, connected through the job's rendezvous store.
//
// The data-parallel side of the rank's ParallelLayout (ZeRO's communicators): "world" spans the
// N ranks of its data-parallel group (the job's world when tp = pp = 1); "shard.<g>" the G
// ranks of shard group g (that group itself when G = N); "replica.<m>" the N/G ranks that are
// member m of their group (none when there is one group). With several data-parallel groups
// (tp · pp > 1) each name starts "data.<i>." (i = layout.DataGroupIndex()). Every rank connects
// them in that order, so ranks never wait on a group whose members are still connecting to
// another.
// With tensor_parallel t > 1 the rank also joins "tensor.<j>", the t consecutive ranks of its
// TP group (j = rank / t: TP is innermost), and when n_kv_head < t "tensor.<j>.kv.<k>", the
// t / n_kv_head ranks of that group that share KV head k (Megatron-LM's layout).
// With pipeline_parallel p > 1, after those: "pipeline.<j>" (j = rank mod (world / p), the
// p ranks with this rank's tensor and data coordinates), then for each stage s < p − 1 that
// the rank is s or s + 1 of, "pipeline.<j>.act.<s>" and "pipeline.<j>.grad.<s>" (two ranks,
// stage s first; under INTERLEAVED also s = p − 1, linking the last stage to the first), and
// with tied embeddings "pipeline.<j>.tied" (the first and last stage).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/device_copy_engine.h"
#include "worker/comm/store.h"
#include "worker/parallel/parallel_layout.h"
#include "worker/plan/arena.h"
#include "worker/shard/sharding_engine.h"

namespace zt {

struct RankCommunicators {
  std::unique_ptr<Communicator> world, shard_group, replicas;
  std::unique_ptr<Communicator> tensor, tensor_kv;  // tensor_parallel > 1 only
  // pipeline_parallel > 1 only: the rank's pipeline group (stage s is its rank s); the
  // two-rank links to the previous and the next stage, one per direction (activations forward,
  // their gradients back: each link's worker runs its transfers in order, independently of
  // the other direction's); and with tied embeddings the first and last stage's pair.
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> activations_in, activations_out, gradients_in, gradients_out;
  std::unique_ptr<Communicator> tied;

  // The counters of the communicators the sharding engine does not drive: the replicated KV
  // heads' group and the pipeline's (its group, the stage links, the tied pair). A rank's
  // total is these plus ShardingEngine::stats().
  CommStats OutsideEngineStats() const {
    CommStats total;
    for (const auto* c : {&tensor_kv, &pipeline, &activations_in, &activations_out, &gradients_in,
                          &gradients_out, &tied}) {
      if (*c != nullptr) total += (*c)->stats();
    }
    return total;
  }

  ShardComms view() const {
    return {.world = world.get(),
            .shard_group = shard_group ? shard_group.get() : world.get(),
            .replicas = replicas.get(),
            .tensor = tensor.get()};
  }
};

// How a rank's communicators reach its memory. Default: the buffers are host memory and Gloo
// moves them directly (CPU devices).
struct RankCommDevice {
  // Set for device memory the host cannot address (CUDA): each communicator is a
  // StagedCommunicator over Gloo with a copy engine of its own from here.
  std::function<absl::StatusOr<std::unique_ptr<DeviceCopyEngine>>()> make_copy_engine;
  // Bytes of each of a staged communicator's two staging regions.
  int64_t staging_bytes = int64_t{16} << 20;
  // Every rank has a GPU of its own: NCCL instead of staging, in a build with NCCL (NCCL
  // refuses two ranks on one GPU). Each NCCL communicator runs on a communication stream of
  // its own; `stream` is the rank's compute stream (a cudaStream_t): every operation waits on
  // the device, through an event, for the kernels issued before it, and overlaps those
  // issued after it.
  bool nccl = false;
  int cuda_device = 0;
  void* stream = nullptr;
};

// Blocks until every peer of each group has connected, or parallel.comm_timeout_s passes
// (DeadlineExceeded naming the ranks that never arrived). `store` must outlive the result.
// The communicators that reduce 16-bit gradients convert through the plan's
// "comm.convert.*" buffers, taken from `arenas` (which must outlive the result).
// GPU ranks (`device` set) get NCCL or staged communicators as RankCommDevice says; a GPU
// rank's 16-bit conversion buffers are pinned host memory (the plan puts them there).
absl::StatusOr<RankCommunicators> ConnectRank(const zerotrain::JobSpec& job,
                                              const ParallelLayout& layout, Store* store,
                                              const Arenas& arenas,
                                              const RankCommDevice& device = {});

}  // namespace zt
