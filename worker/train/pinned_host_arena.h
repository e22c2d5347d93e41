// The pinned_host category of a rank's memory plan taken from the offload tier's pinned host
// pool (offload/pinned_pool.h), apart from the device's arenas: where the fp32 master weights
// and optimizer states of offload.optimizer CPU live (ZeRO-Offload), with the offload ring and
// the asynchronous checkpoint's staging. On a CPU rank the "device" categories are host memory
// too, but a separate allocation: an offloaded state crosses between the two only through the
// rank's copy engine, exactly as it crosses PCIe on a GPU rank.
//
// The pool's region is page-locked when `pin_memory` (offload.pin_memory) asks for it, and
// where RLIMIT_MEMLOCK refuses, pageable with one warning naming the limit (the pool's rule);
// pageable without a warning otherwise. PinnedHostUse says what the pool got.
//
// Thread-safety: like any ArenaAllocator (Arenas calls it from one thread); PinnedHostUse's
// counters may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "worker/plan/arena.h"

namespace zt {

// What the pinned host pool of one rank holds, for metrics and tests.
struct PinnedHostUse {
  std::atomic<int64_t> bytes{0};        // the pool's region (the category's bytes, page-rounded)
  std::atomic<bool> pinned{false};      // whether that region is page-locked
  std::atomic<int64_t> allocations{0};  // pool regions made (one per Arenas)
};

struct PinnedHostArenaOptions {
  bool pin_memory = false;
  // Not owned; may be null. Updated as the pool is made and freed.
  PinnedHostUse* use = nullptr;
};

// Every category but kPinnedHost from `device` (owned); kPinnedHost from a pinned host pool of
// one buffer the size of the category, zero-filled, on the host (Device{}). ResourceExhausted
// naming the bytes when the host memory is not there.
std::unique_ptr<ArenaAllocator> MakePinnedHostArenaAllocator(std::unique_ptr<ArenaAllocator> device,
                                                             PinnedHostArenaOptions options);

}  // namespace zt
