// The residency of each unit's parameters on one rank under ZeRO-3 / FSDP, and the gathers
// in flight.
//
// A unit is kSharded (only the rank's shard exists), kGathering (an all-gather into a full
// buffer was issued and has not been waited for) or kGathered (the full parameters are in
// that buffer and may be computed with). The only legal moves are
//   kSharded → kGathering (BeginGather) → kGathered (AwaitGathered) → kSharded (Release);
// anything else is a bug in the caller's ordering, refused with FailedPrecondition naming the
// unit and both states, so it fails loudly instead of computing with half-written weights or
// overwriting a buffer a gather is still writing.
//
// Not thread-safe: the rank's compute thread owns it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"

namespace zt {

enum class Residency : uint8_t { kSharded, kGathering, kGathered };
const char* ResidencyName(Residency r);

class UnitRegistry {
 public:
  explicit UnitRegistry(std::vector<std::string> unit_names);

  // kSharded → kGathering: `handle` completes the all-gather of unit u into `buffer`.
  absl::Status BeginGather(int u, Tensor buffer, CommHandle handle);
  // kGathering → kGathered, waiting for the gather (its error, if any, comes back here);
  // kGathered stays. Returns the full parameters.
  absl::StatusOr<Tensor> AwaitGathered(int u);
  // kGathered → kSharded: the buffer may be reused.
  absl::Status Release(int u);

  Residency state(int u) const { return units_[u].state; }
  // The buffer unit u is gathering or gathered into (empty when sharded).
  const Tensor& buffer(int u) const { return units_[u].buffer; }
  // Gathers issued and not yet waited for.
  int in_flight() const;
  // Waits for every gather in flight and releases every unit (end of a pass, or after an
  // error, so that no buffer is left being written). Returns the first error.
  absl::Status ReleaseAll();

 private:
  struct Unit {
    std::string name;
    Residency state = Residency::kSharded;
    Tensor buffer;
    CommHandle handle;
  };
  absl::Status Illegal(int u, const char* move, Residency expected) const;

  std::vector<Unit> units_;
};

}  // namespace zt
