// The files a job's data.train / data.val entries name. An entry is a path or a glob(3)
// pattern over file names (llm.c's `/data/fineweb/shard_*.bin`: `*`, `?`, `[...]`; no braces),
// so a corpus of 100,000 shards is one entry. Every reader of data paths — validation, the
// node's pre-start check, the trainer's token streams — expands through this one function, so
// they all see the same files in the same order.
//
// Order: a pattern's matches sorted by their bytes (not by the locale's collation), entries
// in the job's order. The same files give the same order on every rank and every resume; the
// data position a checkpoint records is a token index into that order, so the set of files a
// pattern matches must not change between a run and its resumes.
//
// Patterns are expanded where the data is (on the node, or in `zt train`), never at submit:
// the coordinator may not see the node's files. Wildcards are allowed in the file name only:
// the directory part is what the allowed-roots check resolves (worker/job/allowed_roots.h),
// and a wildcard there would let one entry reach directories the check never saw.
// Stateless and thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace zt {

// Whether `entry` is a pattern: it holds `*`, `?` or `[`. A file whose name holds one of them
// is named with a backslash before it, as glob(3) reads it.
bool IsDataPattern(absl::string_view entry);

// The directory part of a pattern (everything before its last '/'; "." when there is none).
std::string DataPatternDirectory(absl::string_view entry);

// Expands one entry; `label` names it in errors ("data.train[3]"). As ExpandDataPaths.
absl::StatusOr<std::vector<std::string>> ExpandDataEntry(const std::string& entry,
                                                         absl::string_view label);

// Expands the entries of one field. `field` names it in errors ("data.train"). A plain path is
// returned as written, unchecked: opening it reports a missing file by name. A pattern gives
// its matching non-directory entries, sorted. Errors, naming the field, its index and the
// pattern: NotFound when a pattern matches nothing; InvalidArgument for a wildcard in the
// directory part; the operating system's error when a directory cannot be read.
absl::StatusOr<std::vector<std::string>> ExpandDataPaths(
    const google::protobuf::RepeatedPtrField<std::string>& entries, absl::string_view field);
absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::vector<std::string>& entries,
                                                         absl::string_view field);

}  // namespace zt
