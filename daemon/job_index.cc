#include "daemon/job_index.h"

#include <utility>

namespace zt {
namespace {

using zerotrain::Job;

bool Unfinished(Job::State state) {
  return state != Job::SUCCEEDED && state != Job::FAILED && state != Job::CANCELLED;
}

bool Queued(Job::State state) { return state == Job::PENDING || state == Job::RESTARTING; }

}  // namespace

std::filesystem::path NormalCheckpointDir(const std::string& dir) {
  std::filesystem::path p = std::filesystem::absolute(dir).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

void JobIndex::Put(const Job& job) {
  const std::string& dir_text = job.spec().checkpoint().dir();
  Entry next{.state = job.state(), .dir_text = dir_text};
  auto [it, added] = entries_.try_emplace(job.id());
  if (!added) {
    // The normal form needs the working directory (a system call): reuse it while the spec's
    // directory is unchanged, which it is for every state change.
    if (it->second.dir_text == dir_text && !it->second.dir.empty()) next.dir = it->second.dir;
    Untrack(it->second, job.id());
  }
  if (!Unfinished(next.state) || dir_text.empty()) {
    next.dir.clear();
  } else if (next.dir.empty()) {
    next.dir = NormalCheckpointDir(dir_text).string();
  }
  ++counts_[next.state];
  if (Queued(next.state)) queued_.insert(job.id());
  if (!next.dir.empty()) checkpoint_dirs_.emplace(next.dir, job.id());
  it->second = std::move(next);
}

void JobIndex::Remove(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Untrack(it->second, id);
  entries_.erase(it);
}

void JobIndex::Untrack(const Entry& entry, const std::string& id) {
  if (auto count = counts_.find(entry.state); count != counts_.end() && --count->second == 0) {
    counts_.erase(count);
  }
  queued_.erase(id);
  if (entry.dir.empty()) return;
  auto [first, last] = checkpoint_dirs_.equal_range(entry.dir);
  for (auto d = first; d != last; ++d) {
    if (d->second == id) {
      checkpoint_dirs_.erase(d);
      return;
    }
  }
}

std::optional<JobIndex::CheckpointOverlap> JobIndex::FindCheckpointOverlap(
    const std::filesystem::path& mine) const {
  // The same directory or one of its ancestors: look each up.
  for (std::filesystem::path p = mine;; p = p.parent_path()) {
    if (auto found = checkpoint_dirs_.find(p.string()); found != checkpoint_dirs_.end()) {
      return CheckpointOverlap{
          found->second, found->first,
          p == mine ? CheckpointOverlap::Relation::kSame : CheckpointOverlap::Relation::kInside};
    }
    if (!p.has_relative_path()) break;  // the root: no parent left
  }
  // A directory inside it: its text starts with "<mine>/", and such texts sort together.
  std::string prefix = mine.string();
  if (prefix.empty() || prefix.back() != '/') prefix += '/';
  if (auto inside = checkpoint_dirs_.lower_bound(prefix);
      inside != checkpoint_dirs_.end() && inside->first.starts_with(prefix)) {
    return CheckpointOverlap{inside->second, inside->first, CheckpointOverlap::Relation::kContains};
  }
  return std::nullopt;
}

}  // namespace zt
