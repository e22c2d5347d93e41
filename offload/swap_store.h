// The NVMe swap store: extents of bytes in preallocated swap files under one directory,
// written and read with io_uring (O_DIRECT where the filesystem takes it), indexed by RocksDB.
//
// On disk (docs in offload/README.md): `<path>/swap-NNN.zts` (file_count files of file_size
// bytes each, fallocate'd at open) and `<path>/index/` (the RocksDB index). The index maps a
// SwapKey (job, unit, rank range, role, generation) to an extent (file, offset, length, CRC32C),
// names each job's committed generation, and records whether the store was closed cleanly.
//
// Generations: a step writes its extents under a new generation (staged: on disk, not yet in
// the index), then Commit makes them durable (fdatasync of every file written) and only then
// switches the index to the new generation in one synced WriteBatch, which also drops the old
// generation's entries and carries forward the (unit, range, role) slots the step did not
// rewrite. A crash before that batch leaves the old generation whole; after it, the new one.
// Committed extents are never overwritten: new ones come from free space.
//
// Open verifies a store that was not closed cleanly: it reads every committed extent and checks
// its CRC32C; if any fails, the store is discarded (or, with RecoveryPolicy::kFail, refused)
// with a message naming the extent and file. The free list is rebuilt from the index, so the
// space of extents staged by a killed process comes back.
//
// One store per node: RocksDB admits one process per database, so a second process opening the
// same path is refused (FailedPrecondition); the node's ranks share the one store.
//
// Thread-safe: every method may be called from any thread. The index and the free space are
// kept under one lock, held only to look up, allocate and switch; the transfers themselves run
// outside it on one of `io_lanes` lanes (each its own io_uring, queue_depth deep, and its own
// staging blocks), so a read and a write — a copy queue's read-ahead and write-behind — move at
// once. An extent being read is pinned: freed meanwhile (a commit replacing it, a rewrite of
// its staged key, a dropped job), its space is reused only once the read ends. A commit waits
// for its job's writes in flight, syncs the files and writes the index outside the lock, one
// commit at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "offload/io_engine.h"
#include "offload/pinned_pool.h"
#include "offload/swap_env.h"

namespace rocksdb {
class DB;
}

namespace zt::offload {

// What a swapped range holds. The values are stored in the index: never renumber.
enum class SwapRole : uint8_t {
  kMaster = 1,          // fp32 master weights
  kMomentum = 2,        // optimizer first moment (m)
  kVariance = 3,        // optimizer second moment (v)
  kQuantScales = 4,     // block scales of quantized states (the first moment's, when both are)
  kParameters = 5,      // the (16-bit) parameters, at ZeRO stage 3
  kMomentumCodes = 6,   // 8-bit codes of the first moment
  kVarianceCodes = 7,   // 8-bit codes of the second moment
  kVarianceScales = 8,  // block scales of the second moment's codes
  kFactorRow = 9,       // Adafactor's row statistics of factored matrices
  kFactorCol = 10,      // ... its column statistics
  kFactorFull = 11,     // ... its full second moment of vectors
  kQuantizedBase = 12,  // a LoRA block's NF4 / INT8 base bytes ("<unit>.qbase"), at ZeRO stage 3
};
absl::string_view SwapRoleName(SwapRole role);

struct SwapKey {
  std::string job;           // non-empty, at most 65535 bytes
  uint32_t unit = 0;         // the model unit
  uint64_t range_begin = 0;  // the rank range [begin, end) of the unit's flat buffer, elements
  uint64_t range_end = 0;
  SwapRole role = SwapRole::kMaster;
  uint64_t generation = 0;  // the step's generation, > 0
};
// "job 'j' unit 3 range [0, 1024) role m generation 7": how errors name a key.
std::string SwapKeyText(const SwapKey& key);

enum class RecoveryPolicy {
  kVerifyOrDiscard,  // a store that fails verification is emptied (swap is scratch)
  kFail,             // ... or refused with DataLoss, for an operator to look at
};

struct SwapStoreOptions {
  std::string path;                         // an existing, writable directory
  uint64_t file_size = uint64_t{64} << 20;  // bytes of each swap file, a multiple of 4096
  uint32_t file_count = 1;
  uint32_t queue_depth = 32;       // I/Os in flight per call, 1..4096
  uint32_t block_size = 1u << 20;  // bytes per I/O, a multiple of 4096
  // Transfers that run at once, 1..64: each lane is an io_uring of queue_depth entries and
  // queue_depth staging blocks (mapped, touched only for unaligned data). Two: a copy queue's
  // read lane and write lane.
  uint32_t io_lanes = 2;
  bool direct_io = true;           // O_DIRECT; buffered with a warning where refused
  RecoveryPolicy recovery = RecoveryPolicy::kVerifyOrDiscard;
  bool verify_clean_stores = false;  // verify at open even after a clean close
  // The destructor deletes the swap files and the index (and the directory, when that leaves it
  // empty): swap is scratch, and a store that outlives its jobs holds their preallocated bytes
  // (two generations of every rank's states) on a disk that checkpoints and other jobs share.
  // A killed process runs no destructor: its store stays, to be verified or discarded at the
  // next open.
  bool remove_when_closed = false;
  SwapEnv* env = nullptr;            // not owned; nullptr: DefaultSwapEnv()
  WarningSink warn = WarnToStderr;
};

// What Open found.
struct SwapOpenReport {
  bool created = false;         // no index was there
  bool unclean = false;         // the previous process did not close the store
  size_t extents_verified = 0;  // committed extents whose CRC32C was checked
  bool discarded = false;       // the previous content was dropped
  std::string discard_reason;   // why, naming the extent and file
  bool direct_io = false;       // the swap files are open with O_DIRECT
  bool io_uring = false;        // I/O goes through io_uring (else pread/pwrite)
};

struct SwapStoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  size_t committed_extents = 0;
  size_t staged_extents = 0;
};

class SwapStore {
 public:
  // Opens or creates the store at options.path. Refuses, naming the path: a missing directory
  // (NotFound), a non-directory (InvalidArgument), an unwritable one (PermissionDenied), one
  // another process holds (FailedPrecondition), geometry differing from the store's
  // (FailedPrecondition), and a full filesystem (ResourceExhausted with the bytes needed).
  static absl::StatusOr<std::unique_ptr<SwapStore>> Open(SwapStoreOptions options);
  // Marks the store cleanly closed (unless a commit failed part-way: then the next open
  // verifies it).
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // Writes `data` as the extent of `key` in generation key.generation, staged until Commit.
  // The generation must be newer than the job's committed one, and equal to any generation
  // already staged for the job. Rewriting a staged key replaces its extent. ResourceExhausted
  // naming the path and the bytes needed when no free extent is large enough.
  absl::Status Write(const SwapKey& key, absl::Span<const std::byte> data);

  // Makes `generation` the job's committed one (see the file comment for the order). Slots not
  // rewritten in it are carried forward. On failure the store refuses every further call.
  absl::Status Commit(absl::string_view job, uint64_t generation);

  // Reads the extent of `key` (committed, or staged in the same generation) into `out`, which
  // must hold its length; returns the length. NotFound for a key not stored in that generation;
  // DataLoss naming the key and file when its CRC32C does not match (a torn or stale extent).
  absl::StatusOr<size_t> Read(const SwapKey& key, absl::Span<std::byte> out);
  // The length of the extent of `key`, as Read finds it.
  absl::StatusOr<size_t> Length(const SwapKey& key);

  // The file whose free space `job`'s new extents are taken from first (then the next ones,
  // wrapping): jobs that write at the same time (a node's ranks, each its own job key) kept
  // in files of their own do not interleave their extents, so each job's generations take
  // turns in the same space instead of fragmenting it. Default 0; InvalidArgument for a file
  // the store does not have.
  absl::Status SetPlacement(absl::string_view job, uint32_t first_file);
  uint32_t file_count() const { return options_.file_count; }

  // The job's committed generation, 0 when none.
  uint64_t CommittedGeneration(absl::string_view job);
  // Forgets the job (committed and staged) and frees its space, durably.
  absl::Status DropJob(absl::string_view job);

  const SwapOpenReport& open_report() const { return report_; }
  SwapStoreStats stats();
  const std::string& path() const { return options_.path; }

 private:
  struct Extent {
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t length = 0;  // logical bytes; the space taken is rounded up to 4096
    uint32_t crc = 0;
  };
  // (unit, range_begin, range_end, role) within a job.
  using Slot = std::tuple<uint32_t, uint64_t, uint64_t, uint8_t>;
  struct JobState {
    uint64_t committed = 0;
    std::map<Slot, Extent> extents;  // of the committed generation
    uint64_t staged = 0;             // 0: nothing staged (or being written)
    std::map<Slot, Extent> staged_extents;
    int writes_in_flight = 0;  // Writes between their allocation and their staging
    bool committing = false;   // a Commit is between its checks and its switch
  };
  struct File {
    std::string path;
    int fd = -1;
    bool direct = false;
  };
  // One transfer's engine and its staging blocks for the unaligned parts of callers' data.
  struct IoLane {
    std::unique_ptr<IoEngine> engine;
    std::byte* bounce = nullptr;  // queue_depth blocks, mmap'd
  };

  explicit SwapStore(SwapStoreOptions options);
  absl::Status OpenLocked(SwapOpenReport& report) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status LoadIndexLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status VerifyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DiscardLocked(std::string reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RebuildFreeListLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Extent> AllocateLocked(uint64_t length, const SwapKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeLocked(const Extent& extent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes what the store made on disk (remove_when_closed); the files must be closed.
  void RemoveFilesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transfers, on `lane` (held by the caller), without the lock.
  absl::Status WriteExtent(IoLane& lane, const Extent& extent, absl::Span<const std::byte> data);
  absl::Status ReadExtent(IoLane& lane, const Extent& extent, const std::string& what,
                          absl::Span<std::byte> out);
  // A free lane, waiting for one; handed back with ReleaseLaneLocked.
  size_t AcquireLaneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLaneLocked(size_t lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PinLocked(const Extent& extent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnpinLocked(const Extent& extent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a failed commit: the store refuses every further call.
  absl::Status BreakCommit(absl::string_view job, uint64_t generation, const absl::Status& s)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<const Extent*> FindLocked(const SwapKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckUsableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitDataAndIndex(absl::string_view job_name, uint64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(commit_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status PutStateLocked(absl::string_view state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SwapStoreOptions options_;
  SwapEnv* const env_;
  SwapOpenReport report_;
  // One commit at a time: its syncs and index write run outside mu_ (taken after this one).
  absl::Mutex commit_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  // Both fixed once Open returned (RocksDB is thread-safe; the lanes are handed out under mu_).
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<IoLane> lanes_;
  std::vector<bool> lane_busy_ ABSL_GUARDED_BY(mu_);
  std::vector<File> files_;                       // fixed once Open returned
  std::vector<bool> dirty_ ABSL_GUARDED_BY(mu_);  // per file: written since its last sync
  // Per file: free ranges, offset -> length, merged with their neighbours.
  std::vector<std::map<uint64_t, uint64_t>> free_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, JobState, std::less<>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t, std::less<>> placement_ ABSL_GUARDED_BY(mu_);
  size_t bounce_size_ = 0;  // bytes of each lane's staging blocks
  // Extents being read: (file, offset) -> readers; and those freed meanwhile, freed when the
  // last reader ends.
  std::map<std::pair<uint32_t, uint64_t>, int> pins_ ABSL_GUARDED_BY(mu_);
  std::vector<Extent> freed_while_pinned_ ABSL_GUARDED_BY(mu_);
  bool opened_ ABSL_GUARDED_BY(mu_) = false;  // Open finished: the store was judged sound
  // What an open that failed made on disk, deleted with the store: the swap files it created
  // (a full disk stops the preallocation part-way, and the files before it would hold the space
  // the checkpoints need) and the index when it created it. Only set when Open fails.
  std::vector<std::string> made_by_failed_open_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> made_by_this_open_ ABSL_GUARDED_BY(mu_);
  absl::Status broken_ ABSL_GUARDED_BY(mu_);  // a failed commit: the store refuses all calls
  uint64_t bytes_written_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_read_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zt::offload
