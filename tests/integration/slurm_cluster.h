// A one-machine Slurm for the batch-recipe tests: munged, slurmctld and slurmd from Debian's
// slurm-wlm and munge, configured in a temporary directory of its own (key, socket, state,
// spool, pid and log files all inside it, ports chosen free), started by Start() and stopped by
// the destructor on every exit path: jobs cancelled, then the daemons, then the directory
// removed, so nothing is left running. The directory's name is short on purpose: slurmstepd's
// sockets in the spool directory must fit a Unix socket path (108 bytes).
//
// Slurm's daemons run as root here (SlurmUser=root); cgroups are not assumed (proctrack
// linuxproc, task/none), so it also runs in a chroot without systemd. The one node is named
// `localhost` (NodeHostname: this machine's short name), so a job's node list resolves
// everywhere. $SLURM_CONF points the client commands (sbatch, scontrol, ...) at it while it
// lives. Not thread-safe.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/loopback_http.h"
#include "tests/integration/zt_process.h"

namespace zt::testing {

class SlurmCluster {
 public:
  // The reason a Slurm cannot be started on this machine, or empty when it can.
  static std::string Unavailable() {
    if (::geteuid() != 0) return "Slurm's daemons need root (SlurmUser=root); not root";
    for (const char* program :
         {"munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue", "sinfo"}) {
      if (Find(program).empty()) {
        return std::string(program) +
               " not found (apt-get install slurm-wlm munge: scripts/install-deps.sh --test)";
      }
    }
    return "";
  }

  SlurmCluster() {
    std::string name = (std::filesystem::temp_directory_path() / "zt-slurm-XXXXXX").string();
    if (::mkdtemp(name.data()) != nullptr) dir_ = name;
  }
  ~SlurmCluster() {
    Stop();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // Writes the configuration, starts the three daemons and waits until the node is idle; an
  // error message, or empty on success.
  std::string Start() {
    if (dir_.empty()) return "mkdtemp failed";
    std::filesystem::create_directories(dir_ / "state");
    std::filesystem::create_directories(dir_ / "spool");
    std::filesystem::create_directories(dir_ / "munge");
    const std::string key = (dir_ / "munge" / "munge.key").string();
    {
      std::random_device random;
      std::ofstream f(key, std::ios::binary);
      for (int i = 0; i < 1024; ++i) f.put(static_cast<char>(random()));
    }
    ::chmod(key.c_str(), 0400);
    const std::string socket = (dir_ / "munge" / "munge.socket").string();
    munged_ = std::make_unique<ZtProcess>(
        std::vector<std::string>{"--foreground", "--force", "--socket=" + socket,
                                 "--key-file=" + key, "--pid-file=" + Path("munge/munged.pid"),
                                 "--seed-file=" + Path("munge/munged.seed"),
                                 "--log-file=" + Path("munge/munged.log")},
        Path("munged.out"), Find("munged"));
    if (!WaitForFile(socket, *munged_)) return "munged did not start: " + munged_->Output();

    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string short_host(host);
    short_host = short_host.substr(0, short_host.find('.'));
    const std::string conf = Path("slurm.conf");
    {
      std::ofstream f(conf);
      f << "ClusterName=zttest\n"
        << "SlurmctldHost=" << short_host << "(127.0.0.1)\n"
        << "SlurmctldPort=" << FreePort() << "\n"
        << "SlurmdPort=" << FreePort() << "\n"
        << "SlurmUser=root\nSlurmdUser=root\n"
        << "AuthType=auth/munge\nCredType=cred/munge\n"
        << "AuthInfo=socket=" << socket << "\n"
        << "StateSaveLocation=" << Path("state") << "\n"
        << "SlurmdSpoolDir=" << Path("spool") << "\n"
        << "SlurmctldPidFile=" << Path("slurmctld.pid") << "\n"
        << "SlurmdPidFile=" << Path("slurmd.pid") << "\n"
        << "SlurmctldLogFile=" << Path("slurmctld.log") << "\n"
        << "SlurmdLogFile=" << Path("slurmd.log")
        << "\n"
        // No cgroups: a chroot without systemd has none to manage.
        << "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        << "JobAcctGatherType=jobacct_gather/none\n"
        << "AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n"
        << "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
        << "MpiDefault=none\nMailProg=/bin/true\nReturnToService=2\nInactiveLimit=0\nKillWait=5\n"
        // Finished jobs stay visible to `scontrol show job` for the test's checks.
        << "MinJobAge=600\nJobRequeue=1\n"
        << "NodeName=localhost NodeHostname=" << short_host
        << " NodeAddr=127.0.0.1 CPUs=" << std::thread::hardware_concurrency()
        << " RealMemory=1000 State=UNKNOWN\n"
        << "PartitionName=zt Nodes=localhost Default=YES MaxTime=INFINITE State=UP "
           "OverSubscribe=YES\n";
    }
    {
      // slurmd 22.05 loads a cgroup plugin even with proctrack/linuxproc and task/none, and
      // autodetection fails where /sys/fs/cgroup is not mounted (a chroot that bind-mounts
      // /sys alone); the v1 plugin loads without touching it. Read from beside slurm.conf.
      std::ofstream f(Path("cgroup.conf"));
      f << "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n";
    }
    ::setenv("SLURM_CONF", conf.c_str(), 1);
    slurmctld_ = std::make_unique<ZtProcess>(std::vector<std::string>{"-D", "-i"},
                                             Path("slurmctld.out"), Find("slurmctld"));
    slurmd_ = std::make_unique<ZtProcess>(std::vector<std::string>{"-D", "-N", "localhost"},
                                          Path("slurmd.out"), Find("slurmd"));
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Run("sinfo -h -o %t").output.find("idle") == std::string::npos) {
      if (slurmctld_->Poll() || slurmd_->Poll() || Clock::now() > deadline) {
        return "Slurm did not come up:\n" + slurmctld_->Output() + slurmd_->Output() +
               ReadText(Path("slurmctld.log")) + ReadText(Path("slurmd.log"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return "";
  }

  // Cancels every job and waits until none is left, then stops the daemons (SIGTERM, then
  // SIGKILL after a grace period).
  void Stop() {
    if (slurmctld_ && !slurmctld_->Poll()) {
      Run("scancel --user=root");
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (Clock::now() < deadline) {
        const RunResult q = Run("squeue -h -o %i");
        if (q.exit_code != 0 || q.output.find_first_not_of(" \n") == std::string::npos) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        Run("scancel --user=root");
      }
    }
    for (std::unique_ptr<ZtProcess>* p : {&slurmd_, &slurmctld_, &munged_}) {
      if (!*p) continue;
      (*p)->Signal(SIGTERM);
      (*p)->WaitUntil(Clock::now() + std::chrono::seconds(10));
      p->reset();
    }
    ::unsetenv("SLURM_CONF");
  }

  // A Slurm command line (sbatch, scontrol, ...) run against this cluster.
  static RunResult Run(const std::string& command) { return RunCommand(command); }

  // `scontrol show job ID`'s field `name` (JobState, Restarts, ExitCode, ...); empty if absent.
  static std::string JobField(const std::string& job_id, const std::string& name) {
    const std::string out = Run("scontrol show job " + job_id).output;
    const std::regex field("(^|\\s)" + name + "=(\\S*)");
    std::smatch m;
    return std::regex_search(out, m, field) ? m[2].str() : "";
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  // The absolute path of `program` in the sbin folders or on $PATH; empty when absent.
  static std::string Find(const std::string& program) {
    std::string dirs = "/usr/sbin:/sbin:/usr/bin:/bin";
    if (const char* path = std::getenv("PATH")) dirs = dirs + ":" + path;
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = std::min(dirs.find(':', start), dirs.size());
      const std::string candidate = dirs.substr(start, end - start) + "/" + program;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      start = end + 1;
    }
    return "";
  }

  static bool WaitForFile(const std::string& path, ZtProcess& process) {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!std::filesystem::exists(path)) {
      if (process.Poll() || Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return true;
  }

  std::filesystem::path dir_;
  std::unique_ptr<ZtProcess> munged_;
  std::unique_ptr<ZtProcess> slurmctld_;
  std::unique_ptr<ZtProcess> slurmd_;
};

}  // namespace zt::testing
