// Resharding a checkpoint's optimizer states onto another parallel layout (world size, ZeRO
// stage, shard-group size), tensor by tensor, from the saved ranks' memory-mapped files.
//
// worker/plan/optimizer_state_layout.h says where each tensor's state lies in a unit's state
// buffers for any range of the unit; the saved layout and the new one are both described by
// it, so each state is moved by its own rule:
//   fp32 moments (AdamW, and 8-bit AdamW's small tensors), SGD momentum, Adafactor's full
//     second moments of vectors and its first moments: one value per element — the overlap
//     of the new range with each saved range is copied, bit for bit;
//   Adafactor's row and column statistics of a matrix: the whole tensor's, identical on every
//     saved rank that holds part of the tensor — copied whole from one of them, bit for bit;
//   8-bit AdamW codes and absmax: blocks of quant_block_size start at the first element of
//     each range's part of the tensor, so a new range's blocks need not line up with the
//     saved ones. A new block equal to a saved block (same first and last element) takes its
//     codes and absmax bit for bit; any other is dequantized from the saved blocks it
//     overlaps and requantized with the same dynamic map (kernels/quantization.h). That is
//     lossy: each requantized value lies within one step of the map, scaled by the new
//     block's absmax, of the dequantized saved value.
// Only the bytes of the overlapping ranges are read; no more than one block is materialized.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "proto/job.pb.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/model/param_layout.h"
#include "worker/plan/arena.h"
#include "worker/plan/optimizer_state_layout.h"

namespace zt {

// The rank files of one checkpoint written by `job()`, each mapped the first time a buffer of
// it is asked for, so a loading rank opens only the files its ranges overlap. Not
// thread-safe: one per loading rank.
class SavedRankFiles {
 public:
  // `rank_file(r)` is the path of saved rank r's file, r in [0, world_size of `saved_job`).
  SavedRankFiles(const zerotrain::JobSpec& saved_job, std::function<std::string(int)> rank_file);

  const zerotrain::JobSpec& job() const { return job_; }

  // The bytes of buffer `name` of saved rank `rank`, which must hold `dtype` and at least
  // `min_numel` elements. Unaligned: copy out with memcpy. FailedPrecondition naming the file
  // and the buffer when it is missing, of another dtype or too short for the layout the
  // manifest names; the errors of SafetensorsFile::Open.
  absl::StatusOr<absl::Span<const uint8_t>> Buffer(int rank, const std::string& name, DType dtype,
                                                   int64_t min_numel);

 private:
  zerotrain::JobSpec job_;
  std::function<std::string(int)> rank_file_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
};

// The elements of `unit` whose optimizer state (and master weights) rank `rank` of `job`
// keeps: its ZeRO shard at stage ≥ 1, the whole unit at stage 0.
FlatRange OptimizerRangeOf(const zerotrain::JobSpec& job, int rank, const UnitLayout& unit);

// Fills every optimizer-state buffer "<unit>.<state>" of rank `rank` of `job` in `arenas`
// (master weights excepted: they are a plain range of the unit) from the checkpoint in
// `saved`, which was written with the same model and optimizer configuration. DataLoss
// naming the tensor when no saved rank holds some of its elements or a saved rank's state
// has another kind; FailedPrecondition from SavedRankFiles::Buffer; the quantization
// kernels' errors.
absl::Status ReshardUnitOptimizerState(SavedRankFiles& saved, const zerotrain::JobSpec& job,
                                       int rank, const UnitLayout& unit, const Arenas& arenas);

}  // namespace zt
