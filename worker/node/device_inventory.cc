#include "worker/node/device_inventory.h"

#include <sched.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

#if defined(ZT_HAVE_NCCL)
#include <cuda_runtime_api.h>
#endif

namespace zt {
namespace {

// The value in bytes of a "Name:   123 kB" line of /proc/meminfo.
absl::StatusOr<int64_t> MemInfoBytes(const std::string& name) {
  std::ifstream in("/proc/meminfo");
  if (!in) return absl::UnavailableError("cannot read /proc/meminfo");
  std::string line;
  const std::string prefix = name + ":";
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, prefix)) continue;
    std::vector<std::string> fields =
        absl::StrSplit(line.substr(prefix.size()), ' ', absl::SkipEmpty());
    int64_t kib = 0;
    if (fields.empty() || !absl::SimpleAtoi(fields[0], &kib)) break;
    return kib * 1024;
  }
  return absl::UnavailableError(absl::StrCat("/proc/meminfo has no readable ", name, " line"));
}

// "cpu MHz" of the first processor, and whether its flags list avx512f / avx2+fma.
struct CpuFeatures {
  double hz = 2.0e9;
  int flop_per_cycle = 8;
};

CpuFeatures ReadCpuFeatures() {
  CpuFeatures features;
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  bool have_mhz = false, have_flags = false;
  while ((!have_mhz || !have_flags) && std::getline(in, line)) {
    std::vector<std::string> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (kv.size() != 2) continue;
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    if (key == "cpu MHz" && !have_mhz) {
      double mhz = 0;
      if (absl::SimpleAtod(absl::StripAsciiWhitespace(kv[1]), &mhz) && mhz > 0) {
        features.hz = mhz * 1e6;
      }
      have_mhz = true;
    } else if (key == "flags" && !have_flags) {
      const std::string flags = absl::StrCat(" ", kv[1], " ");
      if (flags.find(" avx512f ") != std::string::npos) {
        features.flop_per_cycle = 64;
      } else if (flags.find(" avx2 ") != std::string::npos &&
                 flags.find(" fma ") != std::string::npos) {
        features.flop_per_cycle = 32;
      }
      have_flags = true;
    }
  }
  return features;
}

#if defined(ZT_HAVE_NCCL)
// Dense bf16 tensor-core FLOP per cycle per SM by compute capability: the vendors' datasheet
// peaks divided by SMs × boost clock (V100 1024 fp16, A100 2048, GA10x/AD10x 1024, H100 4096,
// B200 8192); 512 for anything older or unknown.
double TensorFlopPerCyclePerSm(int major, int minor) {
  if (major >= 10) return 8192;
  if (major == 9) return 4096;
  if (major == 8) return minor == 0 ? 2048 : 1024;
  if (major == 7) return 1024;
  return 512;
}

void AddCudaDevices(zerotrain::NodeInfo& info) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error, announce CPUs
    return;
  }
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    int clock_khz = 0;
    if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, d) != cudaSuccess) {
      cudaGetLastError();
    }
    zerotrain::DeviceInfo* device = info.add_devices();
    device->set_index(d);
    device->set_kind(zerotrain::ResourceConfig::CUDA);
    device->set_name(prop.name);
    device->set_memory_bytes(static_cast<int64_t>(prop.totalGlobalMem));
    device->set_compute_capability(absl::StrCat(prop.major, ".", prop.minor));
    device->set_peak_flops(static_cast<double>(prop.multiProcessorCount) * clock_khz * 1e3 *
                           TensorFlopPerCyclePerSm(prop.major, prop.minor));
  }
}
#endif

}  // namespace

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

double CpuPeakFlops(int cores) {
  static const CpuFeatures features = ReadCpuFeatures();
  return static_cast<double>(cores) * features.flop_per_cycle * features.hz;
}

absl::StatusOr<zerotrain::NodeInfo> DetectNodeInfo(const InventoryOptions& options) {
  if (options.cpu_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-devices: ", options.cpu_devices, " (must be at least 1)"));
  }
  if (options.device_memory_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--device-memory: ", options.device_memory_bytes,
                                                   " bytes (must not be negative)"));
  }
  zerotrain::NodeInfo info;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  info.set_hostname(host);
  info.set_id(options.node_id.empty() ? info.hostname() : options.node_id);
  const int cores = AvailableCores();
  info.set_cpu_cores(cores);
  absl::StatusOr<int64_t> total = MemInfoBytes("MemTotal");
  if (!total.ok()) return total.status();
  info.set_host_memory_bytes(*total);
  info.set_metrics_addr(options.metrics_addr);

#if defined(ZT_HAVE_NCCL)
  if (!options.force_cpu) AddCudaDevices(info);
#endif
  if (info.devices_size() == 0) {
    int64_t memory = options.device_memory_bytes;
    if (memory == 0) {
      absl::StatusOr<int64_t> available = MemInfoBytes("MemAvailable");
      if (!available.ok()) return available.status();
      memory = static_cast<int64_t>(static_cast<double>(*available) * 0.9) / options.cpu_devices;
    }
    const int per_device = std::max(1, cores / options.cpu_devices);
    for (int d = 0; d < options.cpu_devices; ++d) {
      zerotrain::DeviceInfo* device = info.add_devices();
      device->set_index(d);
      device->set_kind(zerotrain::ResourceConfig::CPU);
      device->set_name(absl::StrCat("cpu (", per_device, " of ", cores, " cores)"));
      device->set_memory_bytes(memory);
      device->set_peak_flops(CpuPeakFlops(per_device));
    }
  }

  if (!options.nvme_path.empty()) {
    struct statvfs fs {};
    if (statvfs(options.nvme_path.c_str(), &fs) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nvme-path ", options.nvme_path, ": ", std::strerror(errno)));
    }
    info.set_nvme_path(options.nvme_path);
    info.set_nvme_free_bytes(static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize));
  }
  return info;
}

}  // namespace zt
