// The coordinator's bearer token: every RPC of the control plane carries
// `authorization: Bearer <token>` (proto/control.proto).
//
// The token is 32 random bytes as 64 lowercase hex digits in <state-dir>/token, created on
// the first start with mode 0600 and reused afterwards, so clients on the same machine read it
// from there and nobody else can.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace zt {

inline constexpr char kTokenFileName[] = "token";

// The token of `state_dir`: read from <state_dir>/token when it exists, else created there
// (O_EXCL, mode 0600, fsync'd together with the directory). FailedPrecondition naming the
// file and its mode when the file is readable or writable by group or others (a token others
// can read authenticates them); DataLoss naming the file when its content is not a token;
// errno-derived statuses naming the path otherwise.
absl::StatusOr<std::string> EnsureToken(const std::string& state_dir);

// OK when `context` carries `authorization: Bearer <token>`; UNAUTHENTICATED "missing
// authorization metadata" without it, "wrong token" with another value. The comparison takes
// the same time whichever byte differs.
grpc::Status Authorize(const grpc::ServerContext& context, const std::string& token);

}  // namespace zt
