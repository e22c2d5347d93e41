#include "worker/offload/node_swap_store.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/plan/memory_plan.h"

namespace zt {
namespace {

constexpr int64_t kPage = 4096;

int64_t RoundUp(int64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

}  // namespace

std::string SwapStoreDirectory(const zerotrain::JobSpec& job) {
  return (std::filesystem::path(job.offload().nvme_path()) / "zerotrain-swap").string();
}

offload::SwapStoreOptions SwapStoreOptionsFor(const zerotrain::JobSpec& job,
                                              const std::vector<int>& ranks,
                                              const std::string& directory) {
  // A file per rank (SwapStore::SetPlacement): each rank's generations take turns in its own
  // file, which then never fragments (the same extents in the same order every step).
  int64_t most = 0, largest = kPage;
  for (int r : ranks) {
    const MemoryPlan plan = PlanMemory(job, r);
    most = std::max(most, plan.CategoryBytes(MemoryCategory::kNvme));
    for (const BufferSpec& b : plan.buffers) {
      if (b.category == MemoryCategory::kNvme) largest = std::max(largest, PlacedBytes(b));
    }
  }
  offload::SwapStoreOptions options;
  options.path = directory.empty() ? SwapStoreDirectory(job) : directory;
  options.file_count = static_cast<uint32_t>(std::max<size_t>(1, ranks.size()));
  // Two generations, and room for a restore of the master weights alone (a weights-only
  // checkpoint) beside them: half a generation more, and a largest extent.
  options.file_size = static_cast<uint64_t>(RoundUp(2 * most + most / 2 + largest));
  options.queue_depth = static_cast<uint32_t>(job.offload().aio().queue_depth());
  options.block_size = static_cast<uint32_t>(job.offload().aio().block_size());
  return options;
}

absl::StatusOr<std::shared_ptr<offload::SwapStore>> OpenSwapStore(const zerotrain::JobSpec& job,
                                                                  const std::vector<int>& ranks,
                                                                  offload::SwapEnv* env,
                                                                  const std::string& directory) {
  offload::SwapStoreOptions options = SwapStoreOptionsFor(job, ranks, directory);
  options.env = env;
  // A job's swap files are as large as two generations of its states (57 GiB for a 3 B model):
  // left behind, they would hold that disk from the checkpoints and the next jobs.
  options.remove_when_closed = true;
  std::error_code ec;
  std::filesystem::create_directories(options.path, ec);
  if (ec) {
    return absl::PermissionDeniedError(absl::StrCat(
        "offload.nvme_path: cannot create the swap store '", options.path, "': ", ec.message()));
  }
  absl::StatusOr<std::unique_ptr<offload::SwapStore>> store = offload::SwapStore::Open(options);
  if (!store.ok() && store.status().code() == absl::StatusCode::kFailedPrecondition &&
      absl::StrContains(store.status().message(), "same geometry")) {
    // Another job's scratch, and no process holds it (Open checks that first).
    std::fprintf(stderr,
                 "zerotrain offload: warning: swap store '%s' was made for another job's "
                 "geometry; emptying it (swap is scratch, checkpoints are the truth)\n",
                 options.path.c_str());
    std::filesystem::remove_all(options.path, ec);
    if (!ec) std::filesystem::create_directories(options.path, ec);
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat("offload.nvme_path: cannot empty '", options.path, "': ", ec.message()));
    }
    store = offload::SwapStore::Open(options);
  }
  if (!store.ok()) return store.status();
  const offload::SwapOpenReport& report = (*store)->open_report();
  if (report.unclean && !report.discarded) {
    // An operator reading the log of a restarted job sees that the store was checked.
    std::fprintf(stderr,
                 "zerotrain offload: swap store '%s' was not closed cleanly (a killed "
                 "process): %zu committed extents verified\n",
                 options.path.c_str(), report.extents_verified);
  }
  return std::shared_ptr<offload::SwapStore>(std::move(*store));
}

absl::StatusOr<std::shared_ptr<offload::SwapStore>> NodeSwapStores::Acquire(
    const zerotrain::JobSpec& job, const std::vector<int>& ranks) {
  const std::string path = SwapStoreDirectory(job);
  std::lock_guard<std::mutex> lock(mu_);
  if (std::shared_ptr<offload::SwapStore> open = open_[path].lock()) return open;
  absl::StatusOr<std::shared_ptr<offload::SwapStore>> store = OpenSwapStore(job, ranks);
  if (store.ok()) open_[path] = *store;
  return store;
}

}  // namespace zt
