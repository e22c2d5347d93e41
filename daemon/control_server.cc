#include "daemon/control_server.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, " '", path, "' cannot be read"));
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const ControlServerOptions& options) {
  const bool tls = !options.tls_cert.empty() || !options.tls_key.empty();
  if (!tls) {
    if (!options.tls_ca.empty()) {
      return absl::InvalidArgumentError("--tls-ca needs --tls-cert and --tls-key");
    }
    if (!options.insecure_listen_any && !IsLoopbackAddress(options.listen_address)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--listen ", options.listen_address,
          ": without TLS (--tls-cert/--tls-key) the coordinator listens on loopback only "
          "(127.0.0.1, ::1, localhost); pass --insecure-listen-any to accept plaintext "
          "connections from the network"));
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ZT_ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("--tls-cert", options.tls_cert));
  ZT_ASSIGN_OR_RETURN(pair.private_key, ReadPem("--tls-key", options.tls_key));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!options.tls_ca.empty()) {
    ZT_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem("--tls-ca", options.tls_ca));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

bool IsLoopbackAddress(const std::string& listen_address) {
  std::string host = listen_address;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(1, host.find(']') == std::string::npos ? host.size() : host.find(']') - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::StatusOr<std::unique_ptr<ControlServer>> StartControlServer(
    const ControlServerOptions& options, Coordinator* coordinator, const std::string& token,
    CoordinatorMetrics* metrics) {
  if (options.max_request_bytes <= 0) {
    return absl::InvalidArgumentError("max_request_bytes must be > 0");
  }
  ZT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials, Credentials(options));
  std::unique_ptr<ControlServer> server(new ControlServer());
  server->shared_ = std::make_unique<ServiceShared>();
  server->shared_->coordinator = coordinator;
  server->shared_->token = token;
  server->shared_->metrics = metrics;
  server->job_service_ = std::make_unique<JobServiceImpl>(server->shared_.get());
  server->node_service_ = std::make_unique<NodeServiceImpl>(server->shared_.get());
  server->rendezvous_service_ = std::make_unique<RendezvousServiceImpl>(server->shared_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen_address, credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(options.max_request_bytes);
  builder.RegisterService(server->job_service_.get());
  builder.RegisterService(server->node_service_.get());
  builder.RegisterService(server->rendezvous_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen ", options.listen_address, ": cannot listen there"));
  }
  return server;
}

void ControlServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  shared_->stopping.store(true);
  // Handlers notice `stopping` within one wait slice; the deadline cancels anything left.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

ControlServer::~ControlServer() {
  if (server_ != nullptr) Shutdown();
}

}  // namespace zt
