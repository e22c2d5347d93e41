#include "worker/checkpoint/checkpoint_writer.h"

#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/checkpoint_directory.h"
#include "worker/checkpoint/rank_state.h"

namespace zt {
namespace {

std::string RankFileName(int rank) { return absl::StrFormat("rank-%05d.safetensors", rank); }

}  // namespace

CheckpointWriter::CheckpointWriter(const zerotrain::JobSpec& job, int rank, Store* store,
                                   const MemoryPlan& plan, const Arenas& arenas,
                                   bool replace_existing, CheckpointOwner owner, bool take_over,
                                   Download download, BufferSource swapped)
    : job_(job),
      rank_(rank),
      store_(store),
      plan_(plan),
      arenas_(arenas),
      replace_existing_(replace_existing),
      owner_(std::move(owner)),
      take_over_(take_over),
      weights_only_(!job.checkpoint().save_optimizer()),
      download_(std::move(download)),
      swapped_(std::move(swapped)) {
  if (job.checkpoint().async() || download_ != nullptr) {
    absl::StatusOr<Tensor> staging = arenas.Get("checkpoint.staging");
    if (staging.ok()) staging_ = *staging;
  }
}

CheckpointWriter::~CheckpointWriter() { Finish().IgnoreError(); }

absl::Status CheckpointWriter::Finish() {
  if (!in_flight_.valid()) return absl::OkStatus();
  return in_flight_.get();
}

absl::Status CheckpointWriter::Save(int64_t step, nlohmann::json state) {
  absl::Status previous = Finish();
  if (!staging_) {
    if (download_ != nullptr) {
      return absl::FailedPreconditionError(
          "checkpoint: the rank's state is in device memory and the memory plan holds no "
          "\"checkpoint.staging\" to copy it to");
    }
    return Write(step, state, /*from_staging=*/false);
  }
  // The copy is the only part the step loop waits for; the buffers follow each other in
  // the staging area as the plan orders them, each aligned.
  auto* out = static_cast<uint8_t*>(staging_->raw());
  for (const BufferSpec* b : CheckpointedBuffers(plan_, weights_only_)) {
    if (b->category == MemoryCategory::kNvme) {
      ZT_ASSIGN_OR_RETURN(const void* bytes, Swapped(*b));
      std::memcpy(out, bytes, static_cast<size_t>(b->bytes()));
      out += AlignedBytes(b->bytes());
      continue;
    }
    ZT_ASSIGN_OR_RETURN(Tensor t, arenas_.Get(b->name));
    if (download_ != nullptr) {
      ZT_RETURN_IF_ERROR(download_(out, t));
    } else {
      std::memcpy(out, t.raw(), static_cast<size_t>(b->bytes()));
    }
    out += AlignedBytes(b->bytes());
  }
  if (!job_.checkpoint().async()) {
    ZT_RETURN_IF_ERROR(previous);
    return Write(step, state, /*from_staging=*/true);
  }
  in_flight_ = std::async(std::launch::async, [this, step, state = std::move(state)] {
    return Write(step, state, /*from_staging=*/true);
  });
  return previous;
}

absl::StatusOr<const void*> CheckpointWriter::Swapped(const BufferSpec& b) const {
  if (swapped_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: buffer ", b.name, " lives in the swap store and the writer has no reader"));
  }
  return swapped_(b);
}

absl::Status CheckpointWriter::Write(int64_t step, const nlohmann::json& state, bool from_staging) {
  const std::string& dir = job_.checkpoint().dir();
  const int ranks = job_.parallel().world_size();
  const absl::Duration timeout = absl::Seconds(job_.parallel().comm_timeout_s());
  const std::string prefix = absl::StrCat("checkpoint/", step, "/");
  std::unique_ptr<CheckpointSave> save;
  std::string path;
  if (rank_ == 0) {
    // The owner record precedes the first save: checked again here, since another job may
    // have saved into the directory since set-up.
    absl::Status claimed =
        claimed_ ? absl::OkStatus() : ClaimCheckpointDirectory(dir, owner_, take_over_);
    // The first save also clears what killed runs left behind (a pruning, a save).
    if (claimed.ok() && !claimed_) claimed = RemoveCheckpointLeftovers(dir);
    claimed_ = claimed.ok();
    absl::StatusOr<std::unique_ptr<CheckpointSave>> begun =
        claimed.ok() ? BeginSave(dir, step, {.overwrite = replace_existing_})
                     : absl::StatusOr<std::unique_ptr<CheckpointSave>>(claimed);
    ZT_RETURN_IF_ERROR(store_->Set(prefix + "path",
                                   begun.ok() ? "ok:" + (*begun)->current_path()
                                              : absl::StrCat("error:", begun.status().message())));
    if (!begun.ok()) return begun.status();
    save = std::move(*begun);
    path = save->current_path();
  } else {
    ZT_RETURN_IF_ERROR(store_->Wait({prefix + "path"}, timeout));
    ZT_ASSIGN_OR_RETURN(std::string value, store_->Get(prefix + "path"));
    if (value.starts_with("error:")) {
      return absl::AbortedError(absl::StrCat("checkpoint of step ", step,
                                             ": rank 0 could not start it: ", value.substr(6)));
    }
    path = value.substr(3);
  }

  const std::string file = (std::filesystem::path(path) / RankFileName(rank_)).string();
  absl::Status written;
  if (from_staging) {
    const auto* base = static_cast<const uint8_t*>(staging_->raw());
    int64_t offset = 0;
    absl::flat_hash_map<const BufferSpec*, int64_t> offsets;
    for (const BufferSpec* b : CheckpointedBuffers(plan_, weights_only_)) {
      offsets[b] = offset;
      offset += AlignedBytes(b->bytes());
    }
    written = WriteRankState(
        file, plan_,
        [&](const BufferSpec& b) -> absl::StatusOr<const void*> {
          return static_cast<const void*>(base + offsets.at(&b));
        },
        weights_only_);
  } else {
    written = WriteRankState(
        file, plan_,
        [&](const BufferSpec& b) -> absl::StatusOr<const void*> {
          if (b.category == MemoryCategory::kNvme) return Swapped(b);
          ZT_ASSIGN_OR_RETURN(Tensor t, arenas_.Get(b.name));
          return static_cast<const void*>(t.raw());
        },
        weights_only_);
  }
  ZT_RETURN_IF_ERROR(store_->Set(absl::StrCat(prefix, "rank/", rank_),
                                 written.ok() ? "ok" : std::string(written.message())));
  if (!written.ok()) return written;
  if (rank_ != 0) return absl::OkStatus();

  std::vector<std::string> keys;
  for (int r = 0; r < ranks; ++r) keys.push_back(absl::StrCat(prefix, "rank/", r));
  ZT_RETURN_IF_ERROR(store_->Wait(keys, timeout));
  for (int r = 0; r < ranks; ++r) {
    ZT_ASSIGN_OR_RETURN(std::string outcome, store_->Get(keys[r]));
    if (outcome != "ok") {
      return absl::AbortedError(absl::StrCat("checkpoint of step ", step, ": rank ", r,
                                             " could not write its file: ", outcome));
    }
    ZT_RETURN_IF_ERROR(save->AdoptFile(RankFileName(r)));
  }
  ZT_RETURN_IF_ERROR(save->Commit(state));
  return Prune(dir, job_.checkpoint().keep_last());
}

}  // namespace zt
