// A buffer on both sides for the GPU-against-CPU tests of the norms, activations, optimizers
// and quantization: host bytes (the CPU op's tensor) and a device copy (the GPU op's) of the
// same dtype and shape, so one set of inputs feeds both ops and their results compare.
#pragma once

#if ZT_HAVE_CUDA

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/tensor.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/kernels/mixed_check.h"

namespace zt::gpu_test {

class Twin {
 public:
  Twin() = default;  // an absent optional tensor on both sides
  // `bytes` laid out as `dtype` with a shape of one or two dimensions.
  Twin(std::vector<uint8_t> bytes, DType dtype, std::vector<int64_t> shape)
      : bytes_(std::move(bytes)), dtype_(dtype), shape_(std::move(shape)), present_(true) {
    mem_ = DeviceBuffer(static_cast<int64_t>(bytes_.size()));
    EXPECT_EQ(cudaMemcpy(mem_.data(), bytes_.data(), bytes_.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // f32 values stored as `dtype` (f32, bf16 or f16: rounded to nearest even).
  static Twin Floats(const std::vector<float>& values, DType dtype, std::vector<int64_t> shape) {
    const testing::Stored stored(values, dtype);
    std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
    std::memcpy(bytes.data(), stored.words().data(), bytes.size());
    return Twin(std::move(bytes), dtype, std::move(shape));
  }
  template <typename T>
  static Twin Of(const std::vector<T>& values, DType dtype, std::vector<int64_t> shape) {
    std::vector<uint8_t> bytes(values.size() * sizeof(T));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return Twin(std::move(bytes), dtype, std::move(shape));
  }

  Tensor cpu() { return View(bytes_.data(), Device{}); }
  Tensor gpu() { return View(mem_.data(), Gpu0()); }
  Tensor on(bool gpu) { return gpu ? this->gpu() : cpu(); }

  // The device copy's bytes after the stream has finished, and its elements widened to f32.
  std::vector<uint8_t> GpuBytes() { return ToHostBytes(gpu()); }
  const std::vector<uint8_t>& CpuBytes() const { return bytes_; }
  std::vector<float> GpuFloats() { return ToHostFloats(gpu()); }
  std::vector<float> CpuFloats() { return HostFloats(cpu()); }

 private:
  Tensor View(void* data, Device device) const {
    if (!present_) return Tensor();
    if (shape_.size() == 1) return Tensor(data, dtype_, {shape_[0]}, device);
    return Tensor(data, dtype_, {shape_[0], shape_[1]}, device);
  }

  std::vector<uint8_t> bytes_;
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  bool present_ = false;
  DeviceBuffer mem_;
};

}  // namespace zt::gpu_test

#endif  // ZT_HAVE_CUDA
