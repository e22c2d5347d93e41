#include "worker/plan/gathered_units.h"

namespace zt {

int64_t GatheredUnitBytes(const MemoryPlan& plan) {
  int64_t total = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.name.starts_with("gather.") || b.name.starts_with("qbase.gather.") ||
        b.name.ends_with(".gathered")) {
      total += PlacedBytes(b);
    }
  }
  return total;
}

}  // namespace zt
