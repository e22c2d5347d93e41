// The node's swap store (offload/swap_store.h) for jobs that keep optimizer states on NVMe
// (offload.optimizer NVME). RocksDB admits one process per index, so a process opens a store
// once and its ranks (threads) share it: `zt train` for the ranks it runs, the node daemon for
// the ranks of every job it runs (NodeSwapStores).
//
// The store is the directory "<offload.nvme_path>/zerotrain-swap", created when missing, with
// one swap file per rank: each rank's states go to its own file first (SwapStore::
// SetPlacement), sized for two generations (a step writes its new one beside the committed
// one) of the largest rank's plan, half a generation more and a largest extent. A store another
// process left with another geometry (another job's) holds scratch nobody reads: it is emptied and
// made anew, with a warning. One another process holds is refused (FailedPrecondition naming the
// path). One a killed process left open is verified at open (or discarded, with the store's
// warning); a verified one is said on stderr with the count of extents checked. The store is
// deleted when its last user closes it (the process or the daemon's last job on it ends): swap
// is scratch, the checkpoint is the truth.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "offload/swap_store.h"
#include "proto/job.pb.h"

namespace zt {

// The store directory of `job` (defaults applied): "<offload.nvme_path>/zerotrain-swap".
std::string SwapStoreDirectory(const zerotrain::JobSpec& job);

// The geometry and I/O of a store for `ranks` of `job` (validated, defaults applied):
// everything SwapStore::Open takes but the env. `directory`: where; empty:
// SwapStoreDirectory(job).
offload::SwapStoreOptions SwapStoreOptionsFor(const zerotrain::JobSpec& job,
                                              const std::vector<int>& ranks,
                                              const std::string& directory = "");

// Opens (or creates) the store for `ranks` of `job` in `directory` (empty:
// SwapStoreDirectory(job); a process that runs part of a job's ranks beside the job's other
// processes on the node names its own, as `zt train --ranks` does). `env`: the store's
// operating-system seam (null: the real one; tests inject faults). Errors as
// SwapStore::Open's, naming the path.
absl::StatusOr<std::shared_ptr<offload::SwapStore>> OpenSwapStore(
    const zerotrain::JobSpec& job, const std::vector<int>& ranks, offload::SwapEnv* env = nullptr,
    const std::string& directory = "");

// The node daemon's stores, one per directory, open while a job that uses it runs. A second
// job on the same directory shares the open store (its capacity is the first job's; a job
// that does not fit fails with ResourceExhausted naming the path and the bytes).
// Thread-safe.
class NodeSwapStores {
 public:
  // The store for `ranks` of `job` (the ranks this node runs), opened if none is open.
  absl::StatusOr<std::shared_ptr<offload::SwapStore>> Acquire(const zerotrain::JobSpec& job,
                                                              const std::vector<int>& ranks);

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<offload::SwapStore>> open_;
};

}  // namespace zt
