#include "worker/job/allowed_roots.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/job/data_paths.h"
#include "worker/job/offload_validation.h"

namespace zt {
namespace {

namespace fs = std::filesystem;

// `path` with symlinks resolved; a missing tail is appended to its nearest existing ancestor.
// Empty when the missing tail holds "..".
std::string Resolve(const std::string& path) {
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  if (ec) return "";
  fs::path existing = absolute;
  std::vector<fs::path> missing;
  while (!fs::exists(existing, ec) && existing.has_relative_path()) {
    missing.push_back(existing.filename());
    existing = existing.parent_path();
  }
  fs::path resolved = fs::canonical(existing, ec);
  if (ec) return "";
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (*it == "..") return "";
    if (it->empty() || *it == ".") continue;
    resolved /= *it;
  }
  return resolved.string();
}

bool Beneath(const std::string& path, const std::string& root) {
  if (path == root) return true;
  const std::string prefix = root.back() == '/' ? root : root + "/";
  return path.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

absl::StatusOr<AllowedRoots> AllowedRoots::Create(const std::vector<std::string>& roots) {
  std::vector<std::string> resolved;
  for (const std::string& root : roots) {
    std::error_code ec;
    fs::path canonical = fs::canonical(root, ec);
    if (ec) {
      return absl::NotFoundError(
          absl::StrCat("--allowed-root ", root, ": ", ec.message(), " (roots must exist)"));
    }
    resolved.push_back(canonical.string());
  }
  return AllowedRoots(std::move(resolved));
}

absl::Status AllowedRoots::Check(const std::string& field, const std::string& path) const {
  if (roots_.empty()) return absl::OkStatus();
  const std::string resolved = Resolve(path);
  if (!resolved.empty()) {
    for (const std::string& root : roots_) {
      if (Beneath(resolved, root)) return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      field, " ", path,
      resolved.empty() || resolved == path ? "" : absl::StrCat(" (resolves to ", resolved, ")"),
      " is outside the allowed roots (", absl::StrJoin(roots_, ", "), ")"));
}

absl::Status AllowedRoots::CheckJob(const zerotrain::JobSpec& job) const {
  std::vector<std::string> violations;
  auto check = [&](const std::string& field, const std::string& path) {
    if (path.empty()) return;
    absl::Status s = Check(field, path);
    if (!s.ok()) violations.emplace_back(s.message());
  };
  // A pattern's matches are not known here (the coordinator may not see the node's files):
  // its directory is checked, which holds every match, since wildcards are refused in the
  // directory part. A match that is a symlink out of the roots is caught on the node, which
  // checks every expanded file (worker/node/job_inputs_check.h).
  auto check_data = [&](const std::string& field, const std::string& entry) {
    if (IsDataPattern(entry)) {
      check(absl::StrCat(field, " (the directory of pattern '", entry, "')"),
            DataPatternDirectory(entry));
    } else {
      check(field, entry);
    }
  };
  for (int i = 0; i < job.data().train_size(); ++i) {
    check_data(absl::StrCat("data.train[", i, "]"), job.data().train(i));
  }
  for (int i = 0; i < job.data().val_size(); ++i) {
    check_data(absl::StrCat("data.val[", i, "]"), job.data().val(i));
  }
  check("model.init_from", job.model().init_from());
  check("checkpoint.dir", job.checkpoint().dir());
  // The swap store writes there: only when the job keeps something on NVMe (else ignored).
  if (UsesNvme(job.offload())) check("offload.nvme_path", job.offload().nvme_path());
  if (violations.empty()) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrJoin(violations, "\n"));
}

}  // namespace zt
