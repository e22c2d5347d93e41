#include "cli/remote_client.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/output_format.h"
#include "worker/node/control_channel.h"
#include "worker/node/rpc_retry.h"
#include "worker/status_macros.h"

namespace zt::cli {

std::unique_ptr<grpc::ClientContext> RemoteClient::Context(
    std::chrono::milliseconds timeout) const {
  return AuthorizedContext(token, timeout, CallWait::kWaitForReady);
}

absl::Status RemoteClient::CallIdempotent(
    const std::string& call,
    const std::function<grpc::Status(grpc::ClientContext*)>& rpc) const {
  const std::string what = absl::StrCat("coordinator ", address, ": ", call);
  absl::Status status = CallRetrying(RetryPolicy{.retry_for = kRetryFor}, what,
                                     absl::Now() + kRetryFor, [&] { return rpc(Context().get()); });
  // A wait-for-ready call to a coordinator that is not there ends at its deadline: say so.
  if (absl::IsDeadlineExceeded(status) &&
      channel->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
    return absl::DeadlineExceededError(absl::StrCat(
        status.message(), " (no connection within the call's deadline: is ztd running at ",
        address, "? --coordinator, $ZT_COORDINATOR or $ZT_STATE_DIR/address names it)"));
  }
  return status;
}

absl::Status RemoteClient::Error(const grpc::Status& status, const std::string& call) const {
  return FromGrpc(status, absl::StrCat("coordinator ", address, ": ", call));
}

absl::StatusOr<RemoteClient> ConnectRemote(const RemoteFlags& flags) {
  RemoteClient client;
  client.address = ResolveCoordinator(flags.coordinator);
  if (flags.timeout_s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout: ", flags.timeout_s, " seconds; it must be > 0"));
  }
  client.call_timeout = std::chrono::seconds(flags.timeout_s);
  ZT_ASSIGN_OR_RETURN(client.token, ResolveToken(flags.token_file));
  ZT_ASSIGN_OR_RETURN(client.channel, ConnectControlPlane({.address = client.address,
                                                           .tls_ca = flags.tls_ca,
                                                           .tls_cert = flags.tls_cert,
                                                           .tls_key = flags.tls_key}));
  client.jobs = zerotrain::JobService::NewStub(client.channel);
  return client;
}

absl::Status PrintJson(const google::protobuf::Message& message) {
  ZT_ASSIGN_OR_RETURN(const std::string text, ToJson(message));
  std::cout << text << "\n";
  return absl::OkStatus();
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace zt::cli
