#include "worker/shard/host_step_sums.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

absl::StatusOr<std::shared_ptr<Communicator>> Connect(const zerotrain::JobSpec& job, Store* store,
                                                      const std::string& prefix, int rank,
                                                      int size) {
  // f32 sums only: no 16-bit conversion buffers.
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                      GlooCommunicator::Create({.rank = rank,
                                                .size = size,
                                                .store = store,
                                                .prefix = prefix,
                                                .timeout_seconds = job.parallel().comm_timeout_s(),
                                                .max_16bit_elements = 0}));
  return std::shared_ptr<Communicator>(std::move(comm));
}

std::function<absl::Status(float*, int64_t)> SumOver(std::shared_ptr<Communicator> comm,
                                                     std::string label) {
  return
      [comm = std::move(comm), label = std::move(label)](float* data, int64_t n) -> absl::Status {
        ZT_ASSIGN_OR_RETURN(CommHandle h,
                            comm->AllReduce(Tensor(data, DType::kF32, {n}), ReduceOp::kSum, label));
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
  std::shared_ptr<Communicator> shard_comm;
  std::shared_ptr<Communicator> tensor_comm;
  const ShardGeometry& g = layout.shard();
  const std::string data_group = layout.data_size() == layout.world_size()
                                     ? ""
                                     : absl::StrCat("data.", layout.DataGroupIndex(), ".");
  if (ShardedAdafactor(job, layout)) {
    const std::string group = g.group_size != g.world_size
                                  ? absl::StrCat(data_group, "shard.", g.group())
                                  : data_group + "world";
    ZT_ASSIGN_OR_RETURN(shard_comm,
                        Connect(job, store, group + ".host_step", g.group_rank(), g.group_size));
    sums.shard_group = SumOver(shard_comm, "optimizer statistics all-reduce (host step)");
  }
  if (TensorParallelAdafactor(job, layout)) {
    const int t = layout.tensor_size();
    ZT_ASSIGN_OR_RETURN(
        tensor_comm, Connect(job, store, absl::StrCat("tensor.", layout.rank() / t, ".host_step"),
                             layout.coordinates().tensor, t));
    sums.tensor =
        SumOver(tensor_comm, "optimizer statistics all-reduce (tensor-parallel, host step)");
  }
  sums.stats = [shard_comm, tensor_comm] {
    CommStats total;
    if (shard_comm) total += shard_comm->stats();
    if (tensor_comm) total += tensor_comm->stats();
    return total;
  };
  return sums;
}

}  // namespace zt
