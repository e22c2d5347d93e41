// Text the CLI reads and writes for people and scripts: byte sizes, ages, and messages as
// JSON. Pure functions, thread-safe; no gRPC, so the tests link them without a daemon.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace zt::cli {

// "17179869184", "16GiB", "16 GiB", "1.5TiB", "512MB": binary units KiB MiB GiB TiB (and K M
// G T, read as binary too), decimal units KB MB GB TB, B or none for bytes; case-insensitive.
// InvalidArgument naming `flag` for anything else, for a size ≤ 0 and for one over 2^62.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text, std::string_view flag);

// "512 B", "3.2 KiB", "1.50 GiB": three significant digits, binary units.
std::string FormatBytes(int64_t bytes);

// "45s", "12m", "3h05m", "2d04h" for a duration in milliseconds (negative: "-").
std::string FormatAge(int64_t ms);

// `message` through protobuf's JSON mapping with the .proto field names (as job files use
// them) and every field printed, zeros included, so scripts find each key. `indent`: pretty
// printed over several lines; else one line (for streams of one object a line).
// Internal when protobuf cannot print it.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool indent = true);

}  // namespace zt::cli
