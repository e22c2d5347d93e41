// Where an op runs and with what. Ops take a DeviceContext and never synchronize on their
// own: on CUDA they enqueue on `stream`; the step loop is the only place that waits.
#pragma once

#include <string>

namespace zt {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  bool operator==(const Device&) const = default;
};

std::string DeviceName(const Device& d);

// The CPU GEMM implementation. oneDNN picks its ISA from the CPU (AVX-512 here); OpenBLAS
// follows OPENBLAS_CORETYPE. Both are BLAS-style sgemm; benchmarks report which ran.
enum class CpuGemm : uint8_t { kOneDnn, kOpenBlas };

struct DeviceContext {
  Device device;
  // CPU: OpenMP threads every op of this context uses (one team per rank thread). ≥ 1.
  int num_threads = 1;
  CpuGemm cpu_gemm = CpuGemm::kOneDnn;
  // CUDA: the cudaStream_t ops enqueue on (null on the CPU).
  void* stream = nullptr;
};

// A CPU context with every core of the machine (or `threads` when > 0).
DeviceContext CpuContext(int threads = 0);

}  // namespace zt
