// ztd: the ZeroTrain daemon.
//   ztd --coordinator --state-dir DIR [--listen ADDR]   the job API (daemon/)
//   ztd --node --coordinator-addr HOST:PORT             this machine's devices (worker/node/)
//   ztd --dev                                           both, on loopback, in a temporary
//                                                       state directory, 2 CPU devices
// Every role serves Prometheus metrics on --metrics-addr.
// The coordinator refuses specs over --max-spec-bytes (1 MiB) and keeps finished jobs for
// --keep-finished-for (30d) and at most the newest --keep-finished-jobs (10000) of them.
//
// Signals: SIGINT and SIGTERM stop a coordinator (jobs keep running on their nodes and
// reattach when it is back). On a node, SIGTERM and SIGUSR1 mean preemption: the ranks write
// an emergency checkpoint at the next step boundary, the coordinator requeues the job, and
// ztd exits 75 (EX_TEMPFAIL) so a batch script knows to requeue; SIGINT stops the ranks
// without a checkpoint. `ztd --dev` stops both roles on any of them.
// Exit codes: 0 stopped cleanly; 1 a runtime failure; 2 wrong flags; 75 preempted while ranks ran.
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/auth.h"
#include "daemon/control_server.h"
#include "daemon/coordinator.h"
#include "daemon/coordinator_metrics.h"
#include "daemon/metrics_server.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "worker/node/control_channel.h"
#include "worker/node/node_daemon.h"
#include "worker/node/secret_file.h"
#include "worker/status_macros.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kExitPreempted = 75;

struct Flags {
  bool coordinator = false, node = false, dev = false;
  std::string listen = "127.0.0.1:7070";
  std::string state_dir;
  std::vector<std::string> allowed_roots;
  std::string run_root;
  int heartbeat_interval_ms = 5000;
  int reattach_grace_ms = 10000;
  int64_t max_spec_bytes = int64_t{1} << 20;
  int64_t keep_finished_jobs = 10000;
  std::string keep_finished_for = "30d";
  int64_t state_reserve_mib = 16;
  std::string metrics_addr;
  std::string tls_cert, tls_key, tls_ca;
  bool insecure_listen_any = false;
  std::string token_file;
  std::string coordinator_addr;
  std::string node_id;
  int cpu_devices = 0;
  int64_t device_memory = 0;
  std::string nvme_path;
};

int Fail(const absl::Status& status, const char* what) {
  std::cerr << "ztd: " << what << ": " << status.message() << "\n";
  return absl::IsInvalidArgument(status) || absl::IsNotFound(status) ||
                 absl::IsFailedPrecondition(status)
             ? kExitUsage
             : kExitFailure;
}

// The metrics endpoint; null when --metrics-addr is "off".
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> ServeMetricsUnlessOff(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  if (address == "off") return nullptr;
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<prometheus::Exposer> exposer,
                      zt::ServeMetrics(address, registry));
  const std::vector<int> ports = exposer->GetListeningPorts();
  const std::string host = address.substr(0, address.rfind(':'));
  std::cerr << "ztd: metrics on http://" << host << ":" << (ports.empty() ? 0 : ports[0])
            << "/metrics\n";
  return exposer;
}

// "30d", "12h", "90m", "45s" or "0" (no limit): a duration in whole days, hours, minutes or
// seconds.
absl::StatusOr<absl::Duration> ParseRetention(const std::string& text) {
  if (text == "0") return absl::ZeroDuration();
  int64_t n = 0;
  const char unit = text.empty() ? '\0' : text.back();
  const absl::Duration units[] = {absl::Hours(24), absl::Hours(1), absl::Minutes(1),
                                  absl::Seconds(1)};
  const std::string letters = "dhms";
  const size_t u = letters.find(unit);
  if (u == std::string::npos || !absl::SimpleAtoi(text.substr(0, text.size() - 1), &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--keep-finished-for: '", text, "' is not a duration like 30d, 12h, 90m, 45s, or 0"));
  }
  return n * units[u];
}

// Blocks the signals ztd handles in every thread (threads created later inherit the mask),
// so that main can take them one at a time with sigwait.
sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int Run(Flags flags) {
  const sigset_t signals = HandledSignals();
  // A peer rank that dies closes its sockets: writes must fail the collective, not the daemon.
  signal(SIGPIPE, SIG_IGN);
  auto registry = std::make_shared<prometheus::Registry>();
  const bool run_coordinator = flags.coordinator || flags.dev;
  const bool run_node = flags.node || flags.dev;

  std::string temporary_state;
  if (flags.dev && flags.state_dir.empty()) {
    char pattern[] = "/tmp/ztd-dev-XXXXXX";
    if (mkdtemp(pattern) == nullptr) {
      return Fail(absl::UnavailableError("cannot create a state directory in /tmp"), "--dev");
    }
    temporary_state = flags.state_dir = pattern;
  }
  if (flags.metrics_addr.empty()) {
    flags.metrics_addr = flags.node ? "127.0.0.1:9465" : "127.0.0.1:9464";
  }

  auto exposer = ServeMetricsUnlessOff(flags.metrics_addr, registry);
  if (!exposer.ok()) return Fail(exposer.status(), "metrics");

  std::unique_ptr<zt::CoordinatorMetrics> coordinator_metrics;
  std::unique_ptr<zt::Coordinator> coordinator;
  std::unique_ptr<zt::ControlServer> server;
  std::string token;
  std::string coordinator_addr = flags.coordinator_addr;
  if (run_coordinator) {
    if (flags.state_dir.empty()) {
      return Fail(absl::InvalidArgumentError("--state-dir: required with --coordinator"), "flags");
    }
    // A state directory ztd creates is its user's alone: the job store lives there.
    std::error_code ec;
    if (std::filesystem::create_directories(flags.state_dir, ec) && !ec) {
      std::filesystem::permissions(flags.state_dir, std::filesystem::perms::owner_all, ec);
    }
    if (ec) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--state-dir ", flags.state_dir,
                                                          ": cannot create: ", ec.message())),
                  "flags");
    }
    if (!flags.token_file.empty()) {
      absl::Status mode = zt::CheckOwnerOnlyFile(flags.token_file, "token file");
      if (!mode.ok()) return Fail(mode, "token");
    }
    absl::StatusOr<std::string> t = flags.token_file.empty() ? zt::EnsureToken(flags.state_dir)
                                                             : zt::ResolveToken(flags.token_file);
    if (!t.ok()) return Fail(t.status(), "token");
    token = *t;
    absl::StatusOr<absl::Duration> keep_for = ParseRetention(flags.keep_finished_for);
    if (!keep_for.ok()) return Fail(keep_for.status(), "flags");
    coordinator_metrics = std::make_unique<zt::CoordinatorMetrics>(*registry);
    zt::CoordinatorOptions options{
        .state_dir = flags.state_dir,
        .allowed_roots = flags.allowed_roots,
        .run_root = flags.run_root,
        .heartbeat_interval = absl::Milliseconds(flags.heartbeat_interval_ms),
        .reattach_grace = absl::Milliseconds(flags.reattach_grace_ms),
        .max_spec_bytes = flags.max_spec_bytes,
        .keep_finished_jobs = flags.keep_finished_jobs,
        .keep_finished_for = *keep_for,

        .store_min_free_bytes = flags.state_reserve_mib << 20};
    auto created = zt::Coordinator::Create(options, coordinator_metrics.get());
    if (!created.ok()) return Fail(created.status(), "coordinator");
    coordinator = *std::move(created);
    auto started = zt::StartControlServer({.listen_address = flags.listen,
                                           .tls_cert = flags.tls_cert,
                                           .tls_key = flags.tls_key,
                                           .tls_ca = flags.tls_ca,
                                           .insecure_listen_any = flags.insecure_listen_any,
                                           // Room for the largest legal spec and the rest of
                                           // the request; never below gRPC's 4 MiB default.
                                           .max_request_bytes = static_cast<int>(std::max(
                                               flags.max_spec_bytes + (int64_t{1} << 20),
                                               int64_t{4} << 20))},
                                          coordinator.get(), token, coordinator_metrics.get());
    if (!started.ok()) return Fail(started.status(), "coordinator");
    server = *std::move(started);
    const std::string host = flags.listen.substr(0, flags.listen.rfind(':'));
    coordinator_addr = absl::StrCat(host, ":", server->port());
    // `zt` finds a coordinator through $ZT_STATE_DIR/address (and the token beside it).
    if (absl::Status s =
            zt::WriteOwnerOnlyFileAtomically(flags.state_dir + "/address", coordinator_addr + "\n");
        !s.ok()) {
      return Fail(s, "state directory");
    }
    std::cerr << "ztd: coordinator listening on " << coordinator_addr
              << (flags.tls_cert.empty()
                      ? (zt::IsLoopbackAddress(flags.listen)
                             ? " (plaintext, loopback only)"
                             : " (PLAINTEXT ON A NETWORK INTERFACE: --insecure-listen-any)")
                      : " (TLS)")
              << "; state in " << flags.state_dir << "; token in "
              << (flags.token_file.empty() ? flags.state_dir + "/token" : flags.token_file) << "\n";
  }

  std::unique_ptr<zt::NodeDaemon> node;
  if (run_node) {
    if (coordinator_addr.empty()) {
      return Fail(absl::InvalidArgumentError("--coordinator-addr: required with --node"), "flags");
    }
    if (!run_coordinator) {
      if (absl::Status s = zt::CheckTokenFile(flags.token_file); !s.ok()) return Fail(s, "token");
      auto t = zt::ResolveToken(flags.token_file);
      if (!t.ok()) return Fail(t.status(), "token");
      token = *t;
    }
    zt::NodeDaemonOptions options;
    options.coordinator = {.address = coordinator_addr,
                           .tls_ca = flags.tls_ca,
                           .tls_cert = run_coordinator ? "" : flags.tls_cert,
                           .tls_key = run_coordinator ? "" : flags.tls_key};
    options.token = token;
    options.inventory = {
        .node_id = flags.node_id,
        .cpu_devices = flags.cpu_devices > 0 ? flags.cpu_devices : (flags.dev ? 2 : 1),
        .device_memory_bytes = flags.device_memory,
        .nvme_path = flags.nvme_path,
        .metrics_addr = flags.metrics_addr,
        .force_cpu = flags.dev};
    options.allowed_roots = flags.allowed_roots;
    options.run_root = flags.run_root;
    options.registry = registry.get();
    auto created = zt::NodeDaemon::Create(std::move(options));
    if (!created.ok()) return Fail(created.status(), "node");
    node = *std::move(created);
    if (absl::Status s = node->Start(); !s.ok()) return Fail(s, "node");
    std::cerr << "ztd: node " << node->info().id() << " registered with "
              << node->info().devices_size() << " devices at " << coordinator_addr << "\n";
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  std::cerr << "ztd: " << strsignal(signal_number) << ", stopping\n";
  int code = 0;
  if (node) {
    const bool preempt = !flags.dev && (signal_number == SIGTERM || signal_number == SIGUSR1);
    if (preempt && node->Preempt()) {
      std::cerr << "ztd: the ranks checkpointed; exit " << kExitPreempted << " (requeue)\n";
      code = kExitPreempted;
    }
    node->Shutdown();
  }
  if (server) server->Shutdown();
  if (coordinator) coordinator->Shutdown();
  server.reset();
  coordinator.reset();
  if (!temporary_state.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temporary_state, ec);
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ztd: the ZeroTrain daemon (coordinator, node, or both with --dev)"};
  Flags flags;
  auto* roles = app.add_option_group("role");
  roles->add_flag("--coordinator", flags.coordinator, "Serve the job API");
  roles->add_flag("--node", flags.node, "Offer this machine's devices to a coordinator");
  roles->add_flag("--dev", flags.dev,
                  "Both roles on loopback, temporary state, 2 CPU devices (one machine)");
  roles->require_option(1);
  app.add_option("--listen", flags.listen, "Coordinator: host:port (default 127.0.0.1:7070)");
  app.add_option("--state-dir", flags.state_dir,
                 "Coordinator: job store, token and address (--dev: a temporary directory)");
  app.add_option("--allowed-root", flags.allowed_roots,
                 "Jobs' paths must resolve under these directories (repeatable)");
  app.add_option("--run-root", flags.run_root, "Where ranks write metrics.jsonl, per job");
  app.add_option("--heartbeat-interval-ms", flags.heartbeat_interval_ms,
                 "Coordinator: node heartbeat period; 3 missed declare a node dead")
      ->check(CLI::Range(10, 600000));
  app.add_option("--reattach-grace-ms", flags.reattach_grace_ms,
                 "Coordinator: after a restart, how long nodes have to report the ranks they "
                 "still run before those attempts end (at least 4 heartbeat periods)")
      ->check(CLI::Range(10, 3600000));
  app.add_option("--max-spec-bytes", flags.max_spec_bytes,
                 "Coordinator: refuse job specs larger than this, serialized (default 1048576)")
      ->check(CLI::Range(int64_t{1} << 10, int64_t{256} << 20));
  app.add_option("--keep-finished-jobs", flags.keep_finished_jobs,
                 "Coordinator: keep the newest N finished jobs, delete older ones "
                 "(default 10000; 0: no count limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--keep-finished-for", flags.keep_finished_for,
                 "Coordinator: delete finished jobs this long after they finished, e.g. 30d, "
                 "12h, 90m (default 30d; 0: no age limit)");
  app.add_option("--state-reserve-mib", flags.state_reserve_mib,
                 "Coordinator: MiB the job store keeps free on its disk; writes are refused (and "
                 "placement pauses) below it, and resume by themselves above it (default 16)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics-addr", flags.metrics_addr,
                 "Prometheus endpoint host:port, or off (default 127.0.0.1:9464, node 9465)");
  app.add_option("--tls-cert", flags.tls_cert, "PEM certificate (coordinator; node: client)");
  app.add_option("--tls-key", flags.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", flags.tls_ca,
                 "PEM CA: coordinator requires client certificates from it; node verifies "
                 "the coordinator with it");
  app.add_flag("--insecure-listen-any", flags.insecure_listen_any,
               "Allow plaintext on a non-loopback --listen address");
  app.add_option("--token-file", flags.token_file,
                 "Node: the coordinator's token; coordinator: use this token instead of "
                 "<state-dir>/token");
  app.add_option("--coordinator-addr", flags.coordinator_addr, "Node: the coordinator");
  app.add_option("--node-id", flags.node_id, "Node: its id (default: the hostname)");
  app.add_option("--cpu-devices", flags.cpu_devices,
                 "Node: CPU devices to offer when there is no GPU (default 1; --dev 2)")
      ->check(CLI::PositiveNumber);
  app.add_option("--device-memory", flags.device_memory,
                 "Node: bytes of memory per CPU device (default: a share of MemAvailable)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nvme-path", flags.nvme_path, "Node: the NVMe swap directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  return Run(std::move(flags));
}
