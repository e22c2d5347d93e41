// Files that hold secrets (the coordinator's bearer token) and files ztd writes for its own
// user only: read only when no one but the owner can read them, as ssh treats a private key,
// and written with mode 0600 from the first byte.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"

namespace zt {

// FailedPrecondition naming `path`, its mode and the fix (chmod 600) when the open file `fd`
// is readable, writable or executable by group or others; `what` says what the file is
// ("token file"). Errno-derived statuses naming the path when fstat fails.
absl::Status CheckOwnerOnlyMode(int fd, const std::string& path, const std::string& what);

// The same check by path. OK when the file does not exist (its reader reports that).
absl::Status CheckOwnerOnlyFile(const std::string& path, const std::string& what);

// The token file a client would read given its --token-file flag (empty: not given): the
// flag, else none when $ZT_TOKEN is set, else $ZT_STATE_DIR/token, else none. The same order
// as ResolveToken (worker/node/control_channel.h).
std::optional<std::string> TokenFileFor(const std::string& token_file_flag);

// CheckOwnerOnlyFile of TokenFileFor(token_file_flag), when there is one.
absl::Status CheckTokenFile(const std::string& token_file_flag);

// Writes `text` to `path` through a temporary file created with mode 0600, synced, then
// renamed over `path` (readers never see half of it) and the directory synced. The result
// has mode 0600 whatever the umask or an older file's mode.
absl::Status WriteOwnerOnlyFileAtomically(const std::string& path, const std::string& text);

}  // namespace zt
