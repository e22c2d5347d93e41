// Helpers for the GPU tests (tests/gpu/): the skip rule, a stream, device buffers and the
// copies that put an op's inputs on the GPU and bring its results back, and the normalized
// error every CUDA op is compared with its CPU twin by.
//
// Without a usable GPU every test calls ZT_SKIP_WITHOUT_GPU() first and is reported skipped
// with the reason (ctest's SKIP_REGULAR_EXPRESSION), never passed.
#pragma once

#if ZT_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/dtype.h"
#include "kernels/tensor.h"

namespace zt::gpu_test {

// Why a test cannot run here, or nothing when `gpus` devices are visible.
inline std::optional<std::string> SkipReason(int gpus = 1) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("no usable CUDA device: cudaGetDeviceCount failed with error ",
                        static_cast<int>(e), ": ", cudaGetErrorString(e));
  }
  if (count < gpus) return absl::StrCat("needs ", gpus, " CUDA devices, found ", count);
  return std::nullopt;
}

#define ZT_SKIP_WITHOUT_GPU()                                                     \
  do {                                                                            \
    if (const auto zt_skip_reason_ = ::zt::gpu_test::SkipReason()) {             \
      GTEST_SKIP() << *zt_skip_reason_;                                          \
    }                                                                             \
  } while (0)

#define ZT_ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

// A stream on device 0, destroyed with the object.
class GpuStream {
 public:
  GpuStream() {
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  ~GpuStream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  GpuStream(const GpuStream&) = delete;
  GpuStream& operator=(const GpuStream&) = delete;

  cudaStream_t get() const { return stream_; }
  // Waits for everything enqueued; a kernel's fault shows here.
  cudaError_t Sync() const { return cudaStreamSynchronize(stream_); }

 private:
  cudaStream_t stream_ = nullptr;
};

inline Device Gpu0() { return Device{.kind = DeviceKind::kCuda, .index = 0}; }

// A CUDA context on `stream` with `workspace` (empty unless the op needs scratch).
inline DeviceContext CudaContext(const GpuStream& stream, Workspace workspace = {}) {
  DeviceContext ctx;
  ctx.device = Gpu0();
  ctx.num_threads = 1;
  ctx.stream = stream.get();
  ctx.workspace = workspace;
  return ctx;
}

// Device memory owned by the object (cudaMalloc/cudaFree), for one tensor or a workspace.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(int64_t bytes) {
    EXPECT_EQ(cudaMalloc(&data_, static_cast<size_t>(bytes > 0 ? bytes : 1)), cudaSuccess);
    bytes_ = bytes;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Workspace AsWorkspace() const { return Workspace{.data = data_, .bytes = bytes_}; }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

// A tensor of `like`'s dtype and shape over `data` on `device`.
inline Tensor SameShapeAt(const Tensor& like, void* data, Device device) {
  switch (like.ndim()) {
    case 0: return Tensor(data, like.dtype(), {}, device);
    case 1: return Tensor(data, like.dtype(), {like.dim(0)}, device);
    case 2: return Tensor(data, like.dtype(), {like.dim(0), like.dim(1)}, device);
    case 3: return Tensor(data, like.dtype(), {like.dim(0), like.dim(1), like.dim(2)}, device);
    default:
      return Tensor(data, like.dtype(), {like.dim(0), like.dim(1), like.dim(2), like.dim(3)},
                    device);
  }
}

// A device tensor with the host tensor's dtype, shape and contents; `storage` keeps the
// memory. A host tensor with no data gives an empty device tensor (optional arguments).
inline Tensor ToDevice(const Tensor& host, DeviceBuffer& storage) {
  if (host.empty()) return Tensor();
  storage = DeviceBuffer(host.size_bytes());
  EXPECT_EQ(cudaMemcpy(storage.data(), host.raw(), static_cast<size_t>(host.size_bytes()),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  // From pageable memory, cudaMemcpy may return once the bytes are staged, before they land;
  // and the tests' streams are non-blocking, not ordered after the legacy stream it used.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return SameShapeAt(host, storage.data(), Gpu0());
}

// `bytes` of a device tensor, after the stream has finished.
inline std::vector<uint8_t> ToHostBytes(const Tensor& device) {
  std::vector<uint8_t> bytes(static_cast<size_t>(device.size_bytes()));
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(bytes.data(), device.raw(), bytes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return bytes;
}

// A device float tensor's elements (f32, bf16 or f16) widened to f32.
inline std::vector<float> ToHostFloats(const Tensor& device) {
  const std::vector<uint8_t> bytes = ToHostBytes(device);
  std::vector<float> out(static_cast<size_t>(device.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (device.dtype() == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = device.dtype() == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
    }
  }
  return out;
}

// A host float tensor's elements widened to f32.
inline std::vector<float> HostFloats(const Tensor& host) {
  std::vector<float> out(static_cast<size_t>(host.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (host.dtype() == DType::kF32) {
      out[i] = host.data<float>()[i];
    } else {
      const uint16_t h = host.data<uint16_t>()[i];
      out[i] = host.dtype() == DType::kBF16 ? Bf16ToFloat(h) : HalfToFloat(h);
    }
  }
  return out;
}

// ‖gpu − cpu‖₂ / ‖cpu‖₂ (or the absolute norm where the reference is all zeros): the
// normalized error ggml's backend harness compares backends by. One number per buffer, so
// a few elements near a cancellation cannot dominate it, while a wrong index or a missing
// term (errors of the buffer's own magnitude) still show as O(1).
inline double NormalizedError(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  EXPECT_EQ(gpu.size(), cpu.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < gpu.size() && i < cpu.size(); ++i) {
    const double d = static_cast<double>(gpu[i]) - cpu[i];
    diff += d * d;
    ref += static_cast<double>(cpu[i]) * cpu[i];
  }
  if (!std::isfinite(diff)) return INFINITY;
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

}  // namespace zt::gpu_test

#endif  // ZT_HAVE_CUDA
