// The bytes of a memory plan that hold whole units gathered from their ZeRO-3 shards: what a
// stage (or one rank) spends on gathered parameters, and what reshard_after_forward saves.
#pragma once

#include <cstdint>

#include "worker/plan/memory_plan.h"

namespace zt {

// The share of the plan's kParameters held by gathered units: the pool "gather.<k>" and
// "gather.embedding" (reshard_after_forward), every "<u>.gathered" (without it), and their
// quantized twins ("qbase.gather.<k>", "<u>.qbase.gathered"). 0 below ZeRO stage 3.
int64_t GatheredUnitBytes(const MemoryPlan& plan);

}  // namespace zt
