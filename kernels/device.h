// Where an op runs and with what. Ops take a DeviceContext and never synchronize on their
// own: on CUDA they enqueue on `stream`; the step loop is the only place that waits.
#pragma once

#include <cstdint>
#include <string>

namespace zt {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;

  bool operator==(const Device&) const = default;
};

std::string DeviceName(const Device& d);

// The CPU GEMM implementation. oneDNN's matmul primitive picks its ISA from the CPU (AVX-512
// here) and takes its scratch from the context's workspace; OpenBLAS follows
// OPENBLAS_CORETYPE and needs none. Benchmarks report which ran.
enum class CpuGemm : uint8_t { kOneDnn, kOpenBlas };

// Scratch bytes on the context's device, owned by the caller. A byte range rather than a
// Tensor because kernels/tensor.h includes this header.
struct Workspace {
  void* data = nullptr;
  int64_t bytes = 0;
};

struct DeviceContext {
  Device device;
  // CPU: OpenMP threads every op of this context uses (one team per rank thread). ≥ 1.
  int num_threads = 1;
  CpuGemm cpu_gemm = CpuGemm::kOneDnn;
  // CUDA: the cudaStream_t ops enqueue on (null on the CPU).
  void* stream = nullptr;
  // Ops that need scratch (the oneDNN GEMM, later cuBLASLt) take it from here instead of
  // allocating inside the step loop; the memory plan sizes it ("gemm_workspace", see
  // GemmWorkspaceBytes in kernels/linear.h). May be empty for ops that need none. One
  // context's ops run one after another, so they share it; concurrent ranks need their own.
  Workspace workspace;
  // CUDA: let f32 GEMMs multiply in TF32 (CUBLAS_COMPUTE_32F_FAST_TF32: inputs rounded to a
  // 10-bit mantissa, ~1e-3 relative error, several times faster). Off by default because the
  // CPU backend is the reference and f32 there means full f32 products; a job option turns it
  // on for speed. bf16/f16 GEMMs are unaffected (they always accumulate in f32).
  bool allow_tf32 = false;
};

// A CPU context with every core of the machine (or `threads` when > 0).
DeviceContext CpuContext(int threads = 0);

}  // namespace zt
