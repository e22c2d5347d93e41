// How clients of the control plane (`zt`, node daemons, tests) reach a coordinator.
//
// Every call carries the coordinator's bearer token as `authorization: Bearer <token>`
// metadata, attached per call (gRPC refuses call credentials on plaintext channels, and
// loopback without TLS is the default). Channels never use an HTTP proxy: gRPC would honour
// http_proxy even for 127.0.0.1.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace zt {

// One connection attempt may take this long (see GRPC_ARG_MIN_RECONNECT_BACKOFF_MS in
// control_channel.cc).
inline constexpr int kConnectTimeoutMs = 10'000;
// The largest response a client accepts. Coordinator responses stay far below it: a spec is
// bounded by the coordinator's --max-spec-bytes (default 1 MiB) and ListJobs sends summaries.
inline constexpr int kMaxResponseBytes = 64 << 20;

struct ControlChannelOptions {
  // host:port of the coordinator.
  std::string address;
  // PEM files. tls_ca empty: plaintext. With tls_ca: TLS, verifying the coordinator against
  // it; tls_cert + tls_key add a client certificate (mutual TLS, for nodes).
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectControlPlane(
    const ControlChannelOptions& options);

// The token: the contents of `token_file` when given, else $ZT_TOKEN, else the file
// $ZT_STATE_DIR/token; whitespace around it is dropped. InvalidArgument naming the file or
// variable when none yields a token.
absl::StatusOr<std::string> ResolveToken(const std::string& token_file);

// The coordinator address: `flag` when given, else $ZT_COORDINATOR, else the address a
// coordinator wrote to $ZT_STATE_DIR/address, else 127.0.0.1:7070.
std::string ResolveCoordinator(const std::string& flag);

// What a call with a deadline does while the channel has no connection.
enum class CallWait {
  // Fails UNAVAILABLE at once when a connection attempt failed: for callers with their own
  // retry loop (worker/node/rpc_retry.h).
  kFailFast,
  // Waits for a connection until the deadline (gRPC's wait_for_ready): a coordinator that is
  // slow to accept, or restarting, delays the call instead of failing it.
  kWaitForReady,
};

// A context for one call: the token attached, and a deadline unless `timeout` is zero (a
// call without a deadline, a stream, always fails fast).
std::unique_ptr<grpc::ClientContext> AuthorizedContext(
    const std::string& token, std::chrono::milliseconds timeout = std::chrono::seconds(30),
    CallWait wait = CallWait::kFailFast);

// A gRPC status as an absl::Status with the same code and `what` before the message.
absl::Status FromGrpc(const grpc::Status& status, const std::string& what);

}  // namespace zt
