#include "worker/node/control_channel.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace zt {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::Channel>> ConnectControlPlane(
    const ControlChannelOptions& options) {
  if (options.address.empty()) {
    return absl::InvalidArgumentError("coordinator address: empty (expected host:port)");
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  // Watch streams stay open for hours: keepalives notice a coordinator that vanished.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC's reconnect backoff grows to 120 s by default: after a coordinator restart, ranks
  // retrying their store calls would rejoin minutes late. A refused connection (the
  // coordinator is restarting) fails at once, so the first retry comes after 100 ms.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Despite its name, gRPC uses this as the connect timeout: how long one attempt may take
  // from connect(2) to the server's SETTINGS frame. A busy coordinator (64 clients connecting
  // at once on two cores) takes longer than 100 ms for that, and those clients failed.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, kConnectTimeoutMs);
  args.SetMaxReceiveMessageSize(kMaxResponseBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls_ca.empty()) {
    credentials = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadPem(options.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!options.tls_cert.empty() || !options.tls_key.empty()) {
      auto cert = ReadPem(options.tls_cert, "--tls-cert");
      if (!cert.ok()) return cert.status();
      auto key = ReadPem(options.tls_key, "--tls-key");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(ssl);
  }
  return grpc::CreateCustomChannel(options.address, credentials, args);
}

absl::StatusOr<std::string> ResolveToken(const std::string& token_file) {
  auto read = [](const std::string& path,
                 const std::string& source) -> absl::StatusOr<std::string> {
    std::ifstream in(path);
    if (!in) return absl::InvalidArgumentError(absl::StrCat(source, ": cannot read ", path));
    std::ostringstream text;
    text << in.rdbuf();
    std::string token(absl::StripAsciiWhitespace(text.str()));
    if (token.empty())
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", path, " is empty"));
    return token;
  };
  if (!token_file.empty()) return read(token_file, "--token-file");
  if (const char* env = std::getenv("ZT_TOKEN"); env != nullptr && *env != '\0') {
    return std::string(absl::StripAsciiWhitespace(env));
  }
  if (const char* dir = std::getenv("ZT_STATE_DIR"); dir != nullptr && *dir != '\0') {
    return read(absl::StrCat(dir, "/token"), "$ZT_STATE_DIR/token");
  }
  return absl::InvalidArgumentError(
      "no token: pass --token-file (the coordinator's <state-dir>/token), or set ZT_TOKEN or "
      "ZT_STATE_DIR");
}

std::string ResolveCoordinator(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("ZT_COORDINATOR"); env != nullptr && *env != '\0') return env;
  if (const char* dir = std::getenv("ZT_STATE_DIR"); dir != nullptr && *dir != '\0') {
    std::ifstream in(absl::StrCat(dir, "/address"));
    std::string address;
    if (in >> address) return address;
  }
  return "127.0.0.1:7070";
}

std::unique_ptr<grpc::ClientContext> AuthorizedContext(const std::string& token,
                                                       std::chrono::milliseconds timeout,
                                                       CallWait wait) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  if (timeout.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + timeout);
    context->set_wait_for_ready(wait == CallWait::kWaitForReady);
  }
  return context;
}

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

}  // namespace zt
