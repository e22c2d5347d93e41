#include "worker/shard/host_step_sums.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

absl::StatusOr<std::function<absl::Status(float*, int64_t)>> Connect(const zerotrain::JobSpec& job,
                                                                     Store* store,
                                                                     const std::string& prefix,
                                                                     int rank, int size,
                                                                     const std::string& label) {
  // f32 sums only: no 16-bit conversion buffers.
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                      GlooCommunicator::Create({.rank = rank,
                                                .size = size,
                                                .store = store,
                                                .prefix = prefix,
                                                .timeout_seconds = job.parallel().comm_timeout_s(),
                                                .max_16bit_elements = 0}));
  std::shared_ptr<Communicator> own(std::move(comm));
  return [own, label](float* data, int64_t n) -> absl::Status {
    ZT_ASSIGN_OR_RETURN(CommHandle h,
                        own->AllReduce(Tensor(data, DType::kF32, {n}), ReduceOp::kSum, label));
    return h.Wait();
  };
}

}  // namespace

absl::StatusOr<HostStepSums> ConnectHostStepSums(const zerotrain::JobSpec& job,
                                                 const ParallelLayout& layout, Store* store,
                                                 bool device_memory_apart) {
  HostStepSums sums;
  using Offload = zerotrain::OffloadConfig;
  const bool host_step =
      job.offload().optimizer() == Offload::CPU || job.offload().optimizer() == Offload::NVME;
  if (!job.offload().delayed_update().enabled() && !(host_step && device_memory_apart)) {
    return sums;
  }
  // The names follow ConnectRank's groups (worker/shard/rank_communicators.h) with
  // ".host_step" after them.
  const ShardGeometry& g = layout.shard();
  const std::string data_group = layout.data_size() == layout.world_size()
                                     ? ""
                                     : absl::StrCat("data.", layout.DataGroupIndex(), ".");
  if (ShardedAdafactor(job, layout)) {
    const std::string group = g.group_size != g.world_size
                                  ? absl::StrCat(data_group, "shard.", g.group())
                                  : data_group + "world";
    ZT_ASSIGN_OR_RETURN(sums.shard_group,
                        Connect(job, store, group + ".host_step", g.group_rank(), g.group_size,
                                "optimizer statistics all-reduce (host step)"));
  }
  if (TensorParallelAdafactor(job, layout)) {
    const int t = layout.tensor_size();
    ZT_ASSIGN_OR_RETURN(
        sums.tensor, Connect(job, store, absl::StrCat("tensor.", layout.rank() / t, ".host_step"),
                             layout.coordinates().tensor, t,
                             "optimizer statistics all-reduce (tensor-parallel, host step)"));
  }
  return sums;
}

}  // namespace zt
