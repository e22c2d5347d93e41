// Whole-file reads for the data layer's inputs (text corpora, tokenizer files).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace zt {

// The bytes of the file at `path`. Errors carry the operating system's code (NotFound for a
// missing file) and name the file as "<what> '<path>'", e.g. "input text 'a.txt'".
absl::StatusOr<std::string> ReadFileToString(const std::string& path, std::string_view what);

}  // namespace zt
