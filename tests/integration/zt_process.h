// A `zt` child process for integration tests that must kill, stop or time a run.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace zt::testing {

using Clock = std::chrono::steady_clock;

inline std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A `zt` (or `ztd`, or any program given by its absolute path: `binary`) child process writing
// stdout and stderr to a log file. Unlike popen,
// it exposes the pid, so a test can wait with a deadline and kill it. The destructor kills and
// reaps a child that is still running, so a failed assertion never leaves a training process
// behind.
class ZtProcess {
 public:
  ZtProcess(const std::vector<std::string>& args, std::string log_path,
            const std::string& binary = "zt")
      : log_path_(std::move(log_path)) {
    std::vector<std::string> argv_storage = {
        binary.starts_with('/') ? binary : std::string(ZT_BINARY_DIR) + "/bin/" + binary};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    if (::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~ZtProcess() {
    if (pid_ > 0 && !exit_code_) Kill();
  }
  ZtProcess(const ZtProcess&) = delete;
  ZtProcess& operator=(const ZtProcess&) = delete;

  bool started() const { return pid_ > 0; }

  // The exit code (128 + signal number when a signal ended it) once the child has ended, or
  // nullopt when it is still running at `deadline`.
  std::optional<int> WaitUntil(Clock::time_point deadline) {
    while (!exit_code_) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else if (done < 0 || Clock::now() >= deadline) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return exit_code_;
  }

  std::optional<int> Poll() { return WaitUntil(Clock::now()); }

  // 0, or the errno of kill(2).
  int Signal(int signal) { return ::kill(pid_, signal) == 0 ? 0 : errno; }

  // SIGKILL, then reap.
  void Kill() {
    if (exit_code_) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    if (::waitpid(pid_, &status, 0) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }

  std::string Output() const { return ReadText(log_path_); }

 private:
  std::string log_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// Runs `zt args` to completion; {exit code, output}.
inline std::pair<int, std::string> RunZt(const std::vector<std::string>& args,
                                         const std::string& log_path) {
  ZtProcess p(args, log_path);
  if (!p.started()) return {-1, "posix_spawn of zt failed"};
  // Generous: the longest run here is a few seconds; this only stops a hang from stalling CI.
  const std::optional<int> code = p.WaitUntil(Clock::now() + std::chrono::seconds(300));
  return {code.value_or(-1), p.Output()};
}

// What a command run to completion gave: its exit code and its stdout and stderr together.
struct RunResult {
  int exit_code = -1;
  std::string output;
};

// Runs the shell command line `cmd_line` to completion through popen: its exit code and its stdout
// and stderr together.
inline RunResult RunCommand(const std::string& cmd_line) {
  const std::string cmd = cmd_line + " 2>&1";
  RunResult r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs `zt ARGS` (a shell command line) to completion.
inline RunResult RunZtCommand(const std::string& args) {
  return RunCommand(std::string(ZT_BINARY_DIR) + "/bin/zt " + args);
}

}  // namespace zt::testing
