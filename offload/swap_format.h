// The swap store's on-disk format: file names, the RocksDB index's keys and values. Every value
// starts with a magic number and a version. offload/README.md documents it; change both
// together, and bump the version for any change of layout.
//
// Index keys (integers big-endian, so RocksDB's byte order sorts them numerically):
//   "m"                                         -> meta: magic "ZTSM", version, file_size,
//   file_count "s"                                         -> "open" while a process has the store,
//   "clean" after "c" job_len:u16 job                         -> the job's committed generation:
//   u64 "x" job_len:u16 job unit:u32 begin:u64 end:u64 role:u8 generation:u64
//                                               -> extent: magic "ZTSX", version, file:u32,
//                                                  offset:u64, length:u64, crc32c:u32
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "offload/swap_store.h"

namespace zt::offload::swap_format {

inline constexpr uint64_t kExtentAlignment = 4096;  // O_DIRECT's unit; extents start and pad to it
inline constexpr uint32_t kMetaMagic = 0x5A54534D;  // "ZTSM"
inline constexpr uint32_t kExtentMagic = 0x5A545358;  // "ZTSX"
inline constexpr uint8_t kVersion = 1;

inline constexpr char kMetaKey[] = "m";
inline constexpr char kStateKey[] = "s";
inline constexpr char kCommittedPrefix[] = "c";
inline constexpr char kExtentPrefix[] = "x";
inline constexpr char kStateOpen[] = "open";
inline constexpr char kStateClean[] = "clean";

// "<dir>/swap-007.zts" and "<dir>/index".
std::string SwapFilePath(const std::string& dir, uint32_t index);
std::string IndexPath(const std::string& dir);

struct Meta {
  uint64_t file_size = 0;
  uint32_t file_count = 0;
};
std::string EncodeMeta(uint64_t file_size, uint32_t file_count);
// DataLoss naming `where` for a wrong magic, size or version.
absl::StatusOr<Meta> DecodeMeta(absl::string_view value, const std::string& where);

struct ExtentRecord {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t crc = 0;
};
std::string EncodeExtentKey(const SwapKey& key);
absl::StatusOr<SwapKey> DecodeExtentKey(absl::string_view encoded);
std::string EncodeExtentValue(const ExtentRecord& record);
absl::StatusOr<ExtentRecord> DecodeExtentValue(absl::string_view value, const std::string& what);

std::string EncodeCommittedKey(absl::string_view job);
std::string EncodeGeneration(uint64_t generation);
// (job, generation) of a "c" entry.
absl::StatusOr<std::pair<std::string, uint64_t>> DecodeCommitted(absl::string_view key,
                                                                 absl::string_view value);

}  // namespace zt::offload::swap_format
