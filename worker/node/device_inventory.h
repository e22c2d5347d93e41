// What a node daemon announces about its machine (NodeInfo): hostname, cores, host memory,
// its devices, and the NVMe swap path with its free bytes.
//
// Devices. CUDA GPUs when the build has CUDA (cudart; the driver library is loaded by cudart at
// run time, never linked) and cudaGetDeviceCount counts any: each with its name, its global
// memory, its compute capability ("9.0"), and a peak dense bf16 FLOP/s from its SM count,
// clock and architecture. Otherwise
// `cpu_devices` CPU devices sharing the cores: device k is named "cpu (c of n cores)" with
// c = the cores it computes with (n / cpu_devices, at least 1), its memory is
// `device_memory_bytes` when given, else MemAvailable · 0.9 / cpu_devices (the 10% is left to
// the daemon, the page cache and the other processes), and its peak FLOP/s is
//   c · (FLOP per cycle per core) · clock
// where FLOP per cycle is 64 with AVX-512 (2 FMA units × 16 fp32 lanes × 2 FLOP per FMA), 32
// with AVX2+FMA, else 8, and the clock is /proc/cpuinfo's "cpu MHz" (2 GHz when absent). This
// is the fp32 peak; MFU against it is the fraction of the SIMD units' capacity a step used.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/control.pb.h"

namespace zt {

struct InventoryOptions {
  // NodeInfo.id; empty: the hostname.
  std::string node_id;
  // CPU devices to announce when there is no GPU, ≥ 1.
  int cpu_devices = 1;
  // Memory of each CPU device; 0: a share of MemAvailable (see above).
  int64_t device_memory_bytes = 0;
  // The NVMe swap directory; empty: none. Must exist.
  std::string nvme_path;
  // Where this node's Prometheus endpoint listens (NodeInfo.metrics_addr).
  std::string metrics_addr;
  // Announce CPU devices even when GPUs are present (tests; `ztd --dev` on a GPU machine).
  bool force_cpu = false;
};

// InvalidArgument naming the option for cpu_devices < 1 or a negative device memory; the
// errno of statvfs naming nvme_path; Unavailable naming /proc/meminfo when it cannot be read.
absl::StatusOr<zerotrain::NodeInfo> DetectNodeInfo(const InventoryOptions& options);

// Dense fp32 FLOP/s of `cores` cores of this CPU (the formula above).
double CpuPeakFlops(int cores);

// Cores this process may run on (its affinity mask; the hardware count when unavailable).
int AvailableCores();

}  // namespace zt
