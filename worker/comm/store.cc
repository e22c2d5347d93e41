#include "worker/comm/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

absl::Status MissingKeys(const std::vector<std::string>& missing, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat("store wait: keys [",
                                                  absl::StrJoin(missing, ", "), "] not set within ",
                                                  absl::FormatDuration(timeout)));
}

absl::StatusOr<int64_t> ParseCounter(const std::string& key, const std::string& text) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("store add: key '", key, "' holds '", text, "', not a decimal counter"));
  }
  return v;
}

}  // namespace

// ---- InProcessStore ----

absl::Status InProcessStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InProcessStore::Get(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it == values_.end()) {
    return absl::NotFoundError(absl::StrCat("store get: key '", key, "' is not set"));
  }
  return it->second;
}

absl::StatusOr<bool> InProcessStore::Contains(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.contains(key);
}

absl::Status InProcessStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  auto all_set = [&] {
    for (const auto& k : keys) {
      if (!values_.contains(k)) return false;
    }
    return true;
  };
  if (changed_.wait_until(lock, deadline, all_set)) return absl::OkStatus();
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!values_.contains(k)) missing.push_back(k);
  }
  return MissingKeys(missing, timeout);
}

absl::StatusOr<int64_t> InProcessStore::Add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      ZT_ASSIGN_OR_RETURN(v, ParseCounter(key, it->second));
    }
    v += delta;
    values_[key] = absl::StrCat(v);
  }
  changed_.notify_all();
  return v;
}

// ---- FileStore ----

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Create(const std::string& directory,
                                                             absl::Duration poll_interval) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("FileStore: cannot create directory '", directory, "': ", ec.message()));
  }
  return std::unique_ptr<FileStore>(new FileStore(directory, poll_interval));
}

std::string FileStore::PathOf(const std::string& key) const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string name = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_') {
      name.push_back(static_cast<char>(c));
    } else {
      name.push_back('%');
      name.push_back(kHex[c >> 4]);
      name.push_back(kHex[c & 15]);
    }
  }
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  // Unique per process and call, so concurrent writers never share a temporary file.
  const std::string tmp = absl::StrCat(directory_, "/.tmp.", getpid(), ".", counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("FileStore set: cannot write '", tmp, "' for key '", key, "'"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::UnavailableError(absl::StrCat("FileStore set: rename to '", path, "' for key '",
                                               key, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key) {
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("store get: key '", key, "' is not set"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<bool> FileStore::Contains(const std::string& key) {
  struct stat st;
  return ::stat(PathOf(key).c_str(), &st) == 0;
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      ZT_ASSIGN_OR_RETURN(bool present, Contains(k));
      if (!present) missing.push_back(k);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) return MissingKeys(missing, timeout);
    absl::SleepFor(poll_interval_);
  }
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  const std::string lock_path = absl::StrCat(directory_, "/.add.lock");
  const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("FileStore add: cannot open '", lock_path, "': ", std::strerror(errno)));
  }
  // flock locks belong to the open file description, so threads of one process that each
  // open the lock file exclude each other too.
  if (::flock(fd, LOCK_EX) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("FileStore add: flock '", lock_path, "': ", std::strerror(err)));
  }
  auto result = [&]() -> absl::StatusOr<int64_t> {
    int64_t v = 0;
    absl::StatusOr<std::string> old = Get(key);
    if (old.ok()) {
      ZT_ASSIGN_OR_RETURN(v, ParseCounter(key, *old));
    } else if (!absl::IsNotFound(old.status())) {
      return old.status();
    }
    v += delta;
    ZT_RETURN_IF_ERROR(Set(key, absl::StrCat(v)));
    return v;
  }();
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return result;
}

// ---- GlooStoreAdapter ----

std::vector<std::string> GlooStoreAdapter::Prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(absl::StrCat(prefix_, k));
  return out;
}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  absl::Status s = store_->Set(absl::StrCat(prefix_, key), std::string(data.begin(), data.end()));
  if (!s.ok()) throw ::gloo::IoException(std::string(s.message()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  wait({key}, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
  absl::StatusOr<std::string> v = store_->Get(absl::StrCat(prefix_, key));
  if (!v.ok()) throw ::gloo::IoException(std::string(v.status().message()));
  return std::vector<char>(v->begin(), v->end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  absl::Status s = store_->Wait(Prefixed(keys), absl::FromChrono(timeout));
  if (!s.ok()) throw ::gloo::IoException(std::string(s.message()));
}

}  // namespace zt
