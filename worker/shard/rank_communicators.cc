#include "worker/shard/rank_communicators.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/staged_communicator.h"
#if ZT_HAVE_NCCL
#include "worker/comm/cuda/nccl_communicator.h"
#endif
#include "worker/plan/memory_plan.h"

namespace zt {

absl::StatusOr<RankCommunicators> ConnectRank(const zerotrain::JobSpec& job,
                                              const ParallelLayout& layout, Store* store,
                                              const Arenas& arenas, const RankCommDevice& device) {
  const ShardGeometry& g = layout.shard();
  const ConversionBufferSizes conversion = ConversionBuffers(job, layout);
  struct Conversion {
    int64_t elements = 0;
    float* buffers[2] = {nullptr, nullptr};
  };
  auto planned = [&](const char* which, int64_t elements) -> absl::StatusOr<Conversion> {
    Conversion c;
    if (elements == 0) return c;
    c.elements = elements;
    for (int k = 0; k < 2; ++k) {
      ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(absl::StrCat("comm.convert.", which, ".", k)));
      c.buffers[k] = t.data<float>();
    }
    return c;
  };
  ZT_ASSIGN_OR_RETURN(Conversion gradients, planned("gradients", conversion.gradients));
  ZT_ASSIGN_OR_RETURN(Conversion replicas, planned("replicas", conversion.replicas));
  ZT_ASSIGN_OR_RETURN(Conversion tensor_16bit, planned("tensor", conversion.tensor));
  ZT_ASSIGN_OR_RETURN(Conversion tensor_kv_16bit, planned("tensor_kv", conversion.tensor_kv));
  ZT_ASSIGN_OR_RETURN(Conversion tied_16bit, planned("tied", conversion.tied));
  auto connect = [&](const std::string& prefix, int group_rank, int size,
                     const Conversion& c) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    if (device.nccl) {
#if ZT_HAVE_NCCL
      ZT_ASSIGN_OR_RETURN(
          std::unique_ptr<NcclCommunicator> nccl,
          NcclCommunicator::Create({.rank = group_rank,
                                    .size = size,
                                    .device = device.cuda_device,
                                    .store = store,
                                    .prefix = absl::StrCat("nccl.", prefix),
                                    .timeout_seconds = job.parallel().comm_timeout_s(),
                                    .compute_stream = static_cast<cudaStream_t>(device.stream)}));
      return std::unique_ptr<Communicator>(std::move(nccl));
#else
      return absl::UnimplementedError("NCCL communicators need a build with NCCL");
#endif
    }
    ZT_ASSIGN_OR_RETURN(
        std::unique_ptr<GlooCommunicator> comm,
        GlooCommunicator::Create({.rank = group_rank,
                                  .size = size,
                                  .store = store,
                                  .prefix = prefix,
                                  .timeout_seconds = job.parallel().comm_timeout_s(),
                                  .max_16bit_elements = c.elements,
                                  .conversion_buffers = {c.buffers[0], c.buffers[1]}}));
    if (!device.make_copy_engine) return std::unique_ptr<Communicator>(std::move(comm));
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<DeviceCopyEngine> copies, device.make_copy_engine());
    ZT_ASSIGN_OR_RETURN(std::unique_ptr<StagedCommunicator> staged,
                        StagedCommunicator::Create({.host = std::move(comm),
                                                    .copies = std::move(copies),
                                                    .staging_bytes = device.staging_bytes}));
    return std::unique_ptr<Communicator>(std::move(staged));
  };
  // Stage 0 reduces gradients over the world; stages 1–3 in the shard group (the world too
  // when G = N). The world otherwise moves only f32 scalars and all-gathers, which convert
  // nothing.
  const bool world_reduces = job.parallel().zero_stage() == 0 || g.group_size == g.world_size;
  // Each data-parallel group's names are its own: "data.<i>." before them when there are
  // several (tp · pp > 1); none when the group is the world.
  const std::string group = layout.data_size() == layout.world_size()
                                ? ""
                                : absl::StrCat("data.", layout.DataGroupIndex(), ".");
  RankCommunicators comms;
  ZT_ASSIGN_OR_RETURN(comms.world, connect(group + "world", g.rank, g.world_size,
                                           world_reduces ? gradients : Conversion{}));
  if (g.group_size != g.world_size) {
    ZT_ASSIGN_OR_RETURN(comms.shard_group,
                        connect(absl::StrCat(group, "shard.", g.group()), g.group_rank(),
                                g.group_size, world_reduces ? Conversion{} : gradients));
  }
  if (g.groups() > 1) {
    ZT_ASSIGN_OR_RETURN(comms.replicas, connect(absl::StrCat(group, "replica.", g.group_rank()),
                                                g.group(), g.groups(), replicas));
  }
  const int t = layout.tensor_size();
  if (t > 1) {
    const int tp_rank = layout.coordinates().tensor;
    const std::string tensor = absl::StrCat("tensor.", layout.rank() / t);
    ZT_ASSIGN_OR_RETURN(comms.tensor, connect(tensor, tp_rank, t, tensor_16bit));
    const int kv_heads = job.model().n_kv_head();
    if (kv_heads >= 1 && kv_heads < t) {  // a validated job has n_kv_head ≥ 1
      const int share = t / kv_heads;     // ranks per KV head
      ZT_ASSIGN_OR_RETURN(comms.tensor_kv, connect(absl::StrCat(tensor, ".kv.", tp_rank / share),
                                                   tp_rank % share, share, tensor_kv_16bit));
    }
  }
  const int pp = layout.pipeline_size();
  if (pp > 1) {
    const int stage = layout.coordinates().pipeline;
    const std::string pipe = absl::StrCat("pipeline.", layout.rank() % (layout.world_size() / pp));
    ZT_ASSIGN_OR_RETURN(comms.pipeline, connect(pipe, stage, pp, Conversion{}));
    // The interleaved schedule also links the last stage to the first (model chunk c·p + p − 1
    // on the last stage feeds chunk (c + 1)·p on the first).
    const bool wrap = job.parallel().pipeline_schedule() == zerotrain::ParallelConfig::INTERLEAVED;
    for (int s = 0; s + 1 < pp || (wrap && s < pp); ++s) {
      const int next = (s + 1) % pp;
      if (stage != s && stage != next) continue;
      const int member = stage == s ? 0 : 1;  // the sending stage first
      ZT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> act,
                          connect(absl::StrCat(pipe, ".act.", s), member, 2, Conversion{}));
      ZT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> grad,
                          connect(absl::StrCat(pipe, ".grad.", s), member, 2, Conversion{}));
      if (stage == s) {
        comms.activations_out = std::move(act);
        comms.gradients_in = std::move(grad);
      } else {
        comms.activations_in = std::move(act);
        comms.gradients_out = std::move(grad);
      }
    }
    if (job.model().tie_embeddings() && (stage == 0 || stage == pp - 1)) {
      ZT_ASSIGN_OR_RETURN(
          comms.tied, connect(absl::StrCat(pipe, ".tied"), stage == 0 ? 0 : 1, 2, tied_16bit));
    }
  }
  return comms;
}

}  // namespace zt
