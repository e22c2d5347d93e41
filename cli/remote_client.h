// The connection every remote verb opens: the coordinator's address and token resolved from
// the flags and environment, a channel, and the JobService stub.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "proto/control.grpc.pb.h"

namespace zt::cli {

struct RemoteClient {
  std::string address;
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<zerotrain::JobService::Stub> jobs;
  // How long one unary call may take, waiting for a connection included (--timeout).
  std::chrono::milliseconds call_timeout = std::chrono::seconds(30);

  // A call's context with the token. With a deadline (`timeout` > 0) the call waits for a
  // connection until then (wait-for-ready); no deadline when `timeout` is zero (streams).
  std::unique_ptr<grpc::ClientContext> Context(std::chrono::milliseconds timeout) const;
  // The same with call_timeout.
  std::unique_ptr<grpc::ClientContext> Context() const { return Context(call_timeout); }
  // The call's failure with its gRPC code, naming the coordinator and the call.
  absl::Status Error(const grpc::Status& status, const std::string& call) const;
  // Sends a unary call that is safe to repeat (a read, a cancel, a delete, a submit with its
  // request_id), each try with a fresh Context(), resending while it fails UNAVAILABLE or
  // CANCELLED (the connection broke, the coordinator is restarting) for up to kRetryFor. The
  // failure as Error() words it.
  absl::Status CallIdempotent(
      const std::string& call,
      const std::function<grpc::Status(grpc::ClientContext*)>& rpc) const;
};

inline constexpr absl::Duration kRetryFor = absl::Seconds(60);

// InvalidArgument (no token, unreadable TLS files) naming the flag or variable.
absl::StatusOr<RemoteClient> ConnectRemote(const RemoteFlags& flags);

// Prints `message` to stdout through protobuf's JSON mapping (cli/output_format.h).
absl::Status PrintJson(const google::protobuf::Message& message);

int64_t NowMs();

// Streams the job's events to the terminal until the job finishes (see RunWatch): a live
// progress line on stderr when it is a TTY, else one line per event; with json one JSON
// event per line on stdout. Reconnects after the last sequence seen while the coordinator is
// UNAVAILABLE, for up to 60 s. Prints the final state on stdout; returns JobOutcome's status.
absl::Status WatchUntilDone(const RemoteClient& client, const std::string& job_id, bool json);

}  // namespace zt::cli
