// Tensor: a non-owning view of a dense, row-major array on one device.
//
// A view holds a pointer, a dtype, a shape (up to 4 dimensions) and the device the memory
// lives on; it never allocates or frees. Buffers are owned by the memory plan's arenas
// (worker/plan/), so a view is cheap to copy and valid as long as its arena is. Not
// thread-safe to mutate; views of disjoint memory may be used from different threads.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "kernels/device.h"
#include "kernels/dtype.h"

namespace zt {

class Tensor {
 public:
  static constexpr int kMaxDims = 4;

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});

  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  void* raw() const { return data_; }
  DType dtype() const { return dtype_; }
  const Device& device() const { return device_; }
  int ndim() const { return ndim_; }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const { return shape_[i < 0 ? ndim_ + i : i]; }
  int64_t numel() const;
  int64_t size_bytes() const { return numel() * DTypeSize(dtype_); }
  bool empty() const { return data_ == nullptr; }

  // The same memory with another shape of the same element count.
  Tensor Reshape(std::initializer_list<int64_t> shape) const;
  // Rows [begin, end) of dimension 0.
  Tensor Slice(int64_t begin, int64_t end) const;

  // "f32[8, 256]".
  std::string DebugString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Device device_;
  int ndim_ = 0;
  std::array<int64_t, kMaxDims> shape_{};
};

// Checks used by every op entry point. Each error names the op, the argument and the rule.
absl::Status CheckDType(const char* op, const char* arg, const Tensor& t, DType want);
absl::Status CheckShape(const char* op, const char* arg, const Tensor& t,
                        std::initializer_list<int64_t> want);
absl::Status CheckSameDevice(const char* op, const Tensor& a, const Tensor& b);

}  // namespace zt
