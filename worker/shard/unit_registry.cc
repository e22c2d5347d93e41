#include "worker/shard/unit_registry.h"

#include "absl/strings/str_cat.h"

namespace zt {

const char* ResidencyName(Residency r) {
  switch (r) {
    case Residency::kSharded:
      return "sharded";
    case Residency::kGathering:
      return "gathering";
    case Residency::kGathered:
      return "gathered";
  }
  return "?";
}

UnitRegistry::UnitRegistry(std::vector<std::string> unit_names) {
  for (std::string& name : unit_names) units_.push_back({.name = std::move(name)});
}

absl::Status UnitRegistry::Illegal(int u, const char* move, Residency expected) const {
  return absl::FailedPreconditionError(
      absl::StrCat("unit ", units_[u].name, ": ", move, " needs it ", ResidencyName(expected),
                   ", but it is ", ResidencyName(units_[u].state)));
}

absl::Status UnitRegistry::BeginGather(int u, Tensor buffer, CommHandle handle) {
  Unit& unit = units_[u];
  if (unit.state != Residency::kSharded) return Illegal(u, "gather", Residency::kSharded);
  unit.state = Residency::kGathering;
  unit.buffer = buffer;
  unit.handle = std::move(handle);
  return absl::OkStatus();
}

absl::StatusOr<Tensor> UnitRegistry::AwaitGathered(int u) {
  Unit& unit = units_[u];
  if (unit.state == Residency::kSharded) return Illegal(u, "compute", Residency::kGathered);
  if (unit.state == Residency::kGathering) {
    absl::Status s = unit.handle.Wait();
    if (!s.ok()) return s;
    unit.state = Residency::kGathered;
    unit.handle = CommHandle();
  }
  return unit.buffer;
}

absl::Status UnitRegistry::Release(int u) {
  Unit& unit = units_[u];
  if (unit.state != Residency::kGathered) return Illegal(u, "release", Residency::kGathered);
  unit.state = Residency::kSharded;
  unit.buffer = Tensor();
  return absl::OkStatus();
}

int UnitRegistry::in_flight() const {
  int n = 0;
  for (const Unit& u : units_) n += u.state == Residency::kGathering;
  return n;
}

absl::Status UnitRegistry::ReleaseAll() {
  absl::Status first;
  for (Unit& unit : units_) {
    if (unit.state == Residency::kGathering) {
      absl::Status s = unit.handle.Wait();
      if (first.ok()) first = s;
      unit.handle = CommHandle();
    }
    unit.state = Residency::kSharded;
    unit.buffer = Tensor();
  }
  return first;
}

}  // namespace zt
