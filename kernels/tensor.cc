#include "kernels/tensor.h"

#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zt {

Tensor::Tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device)
    : data_(data), dtype_(dtype), device_(device), ndim_(static_cast<int>(shape.size())) {
  assert(shape.size() <= kMaxDims);
  int i = 0;
  for (int64_t s : shape) shape_[i++] = s;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= shape_[i];
  return n;
}

Tensor Tensor::Reshape(std::initializer_list<int64_t> shape) const {
  Tensor t(data_, dtype_, shape, device_);
  assert(t.numel() == numel());
  return t;
}

Tensor Tensor::Slice(int64_t begin, int64_t end) const {
  assert(ndim_ >= 1 && 0 <= begin && begin <= end && end <= shape_[0]);
  Tensor t = *this;
  const int64_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  t.data_ = static_cast<char*>(data_) + begin * row * DTypeSize(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

std::string Tensor::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), "[",
                      absl::StrJoin(shape_.begin(), shape_.begin() + ndim_, ", "), "]");
}

absl::Status CheckDType(const char* op, const char* arg, const Tensor& t, DType want) {
  if (t.dtype() == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " has dtype ",
                                                 DTypeName(t.dtype()), ", expected ",
                                                 DTypeName(want)));
}

absl::Status CheckShape(const char* op, const char* arg, const Tensor& t,
                        std::initializer_list<int64_t> want) {
  bool ok = t.ndim() == static_cast<int>(want.size());
  int i = 0;
  for (int64_t w : want) {
    if (ok && t.dim(i) != w) ok = false;
    ++i;
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " has shape ", t.DebugString(),
                                                 ", expected [", absl::StrJoin(want, ", "),
                                                 "]"));
}

absl::Status CheckSameDevice(const char* op, const Tensor& a, const Tensor& b) {
  if (a.device() == b.device()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": tensors on ", DeviceName(a.device()),
                                                 " and ", DeviceName(b.device())));
}

}  // namespace zt
