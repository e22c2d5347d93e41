// The coordinator's gRPC server: JobService, NodeService and RendezvousService
// (daemon/control_services.h) with the bearer token, plus
//   - the standard health service (grpc.health.v1.Health), open without the token: load
//     balancers and Kubernetes probes cannot carry it, and it reveals only "SERVING";
//   - server reflection (grpc.reflection.v1alpha), open without the token: it serves the
//     .proto schema, which is public, so grpcurl can list the services before it has a token.
// Without TLS the server refuses a non-loopback listen address unless insecure_listen_any.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/control_services.h"
#include "daemon/coordinator.h"
#include "daemon/coordinator_metrics.h"
#include "grpcpp/grpcpp.h"

namespace zt {

struct ControlServerOptions {
  // host:port; port 0 picks a free one (ControlServer::port() tells which).
  std::string listen_address = "127.0.0.1:7070";
  // PEM files. tls_cert + tls_key: TLS. tls_ca as well: mutual TLS (clients must present a
  // certificate signed by it).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  // Allow a plaintext listener on a non-loopback address (--insecure-listen-any).
  bool insecure_listen_any = false;
  // Larger requests are refused with RESOURCE_EXHAUSTED.
  int max_request_bytes = 4 << 20;
};

// A running server and the services it serves. Shutdown() and the destructor are called from
// one thread.
class ControlServer {
 public:
  // Ends every in-flight call (streams within kServiceWaitSlice) and stops the server.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  int port() const { return port_; }
  grpc::Server* server() { return server_.get(); }
  // Stops accepting calls and ends the running ones; idempotent.
  void Shutdown();

 private:
  friend absl::StatusOr<std::unique_ptr<ControlServer>> StartControlServer(
      const ControlServerOptions&, Coordinator*, const std::string&, CoordinatorMetrics*);
  ControlServer() = default;

  std::unique_ptr<ServiceShared> shared_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<NodeServiceImpl> node_service_;
  std::unique_ptr<RendezvousServiceImpl> rendezvous_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

// Starts the server. `coordinator` (and `metrics`, which may be null) outlive it. Errors:
// InvalidArgument naming --listen for a plaintext non-loopback address without
// insecure_listen_any, or naming --tls-cert/--tls-key when only one is given; NotFound naming
// a TLS file that cannot be read; Unavailable naming the address when it cannot be bound.
absl::StatusOr<std::unique_ptr<ControlServer>> StartControlServer(
    const ControlServerOptions& options, Coordinator* coordinator, const std::string& token,
    CoordinatorMetrics* metrics = nullptr);

// Whether `listen_address`'s host is loopback (127.0.0.0/8, ::1, localhost).
bool IsLoopbackAddress(const std::string& listen_address);

}  // namespace zt
