// Argument checks shared by the op entry points of embedding, norm, activation,
// cross-entropy, element-wise, reduction and optimizer ops (kernels/<op>.cc). Each error is
// InvalidArgument (or Unimplemented for a missing backend) and names the op, the argument and
// the rule, so a caller can tell which buffer of which layer was wrong.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "kernels/tensor.h"

namespace zt::internal {

// The context is usable: at least one CPU thread.
inline absl::Status CheckContext(const char* op, const DeviceContext& ctx) {
  if (ctx.num_threads >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ctx.num_threads is ", ctx.num_threads, ", must be at least 1"));
}

// The tensor has memory and lives on the context's device.
inline absl::Status CheckOnDevice(const char* op, const char* arg, const Tensor& t,
                                  const DeviceContext& ctx) {
  // A default-constructed Tensor has numel() 1 and no data; a zero-element one may be null.
  if (t.empty() && t.numel() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is empty (no data)"));
  }
  if (t.device() == ctx.device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " is on ", DeviceName(t.device()),
                                                 ", the context runs on ", DeviceName(ctx.device)));
}

// CheckOnDevice, then dtype and shape.
inline absl::Status CheckTensor(const char* op, const char* arg, const Tensor& t,
                                const DeviceContext& ctx, DType dtype,
                                std::initializer_list<int64_t> shape) {
  if (absl::Status s = CheckOnDevice(op, arg, t, ctx); !s.ok()) return s;
  if (absl::Status s = CheckDType(op, arg, t, dtype); !s.ok()) return s;
  return CheckShape(op, arg, t, shape);
}

// The tensor has `rank` dimensions (their sizes are checked by the caller against the others').
inline absl::Status CheckRank(const char* op, const char* arg, const Tensor& t, int rank) {
  if (t.ndim() == rank) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " has shape ", t.DebugString(),
                                                 ", expected ", rank, " dimensions"));
}

// Flat ops: the same element count as a reference argument.
inline absl::Status CheckSameNumel(const char* op, const char* arg, const Tensor& t,
                                   const char* ref_arg, const Tensor& ref) {
  if (t.numel() == ref.numel()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": ", arg, " ", t.DebugString(), " has ", t.numel(), " elements, ", ref_arg,
                   " ", ref.DebugString(), " has ", ref.numel(), "; they must be equal"));
}

// Pointwise ops: exactly the shape of a reference argument.
inline absl::Status CheckSameShape(const char* op, const char* arg, const Tensor& t,
                                   const char* ref_arg, const Tensor& ref) {
  bool same = t.ndim() == ref.ndim();
  for (int i = 0; same && i < t.ndim(); ++i) same = t.dim(i) == ref.dim(i);
  if (same) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " has shape ", t.DebugString(),
                                                 ", ", ref_arg, " has ", ref.DebugString(),
                                                 "; they must be equal"));
}

// Data tensors of the mixed-precision ops may be stored as f32, bf16 or f16.
inline absl::Status CheckFloatDType(const char* op, const char* arg, const Tensor& t) {
  if (t.dtype() == DType::kF32 || t.dtype() == DType::kBF16 || t.dtype() == DType::kF16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", arg, " has dtype ", DTypeName(t.dtype()),
                                                 ", expected one of f32, bf16, f16"));
}

// CheckOnDevice, then a float dtype (f32, bf16, f16) and the shape.
inline absl::Status CheckFloatTensor(const char* op, const char* arg, const Tensor& t,
                                     const DeviceContext& ctx,
                                     std::initializer_list<int64_t> shape) {
  if (absl::Status s = CheckOnDevice(op, arg, t, ctx); !s.ok()) return s;
  if (absl::Status s = CheckFloatDType(op, arg, t); !s.ok()) return s;
  return CheckShape(op, arg, t, shape);
}

// An optimizer gradient: f32, bf16 or f16 with param's element count.
inline absl::Status CheckGrad(const char* op, const Tensor& grad, const Tensor& param,
                              const DeviceContext& ctx) {
  if (absl::Status s = CheckOnDevice(op, "grad", grad, ctx); !s.ok()) return s;
  if (absl::Status s = CheckFloatDType(op, "grad", grad); !s.ok()) return s;
  return CheckSameNumel(op, "grad", grad, "param", param);
}

// The optional 16-bit parameter copy and its rounding options.
inline absl::Status CheckParamCopy(const char* op, const Tensor& copy, bool stochastic,
                                   const Tensor& param, const DeviceContext& ctx) {
  if (copy.empty()) {
    if (!stochastic) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": stochastic_rounding is set but param_copy is empty; it rounds param_copy"));
  }
  if (absl::Status s = CheckOnDevice(op, "param_copy", copy, ctx); !s.ok()) return s;
  if (copy.dtype() != DType::kBF16 && copy.dtype() != DType::kF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": param_copy has dtype ", DTypeName(copy.dtype()), ", expected bf16 or f16"));
  }
  if (stochastic && copy.dtype() != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": stochastic_rounding needs a bf16 param_copy, it is ", DTypeName(copy.dtype())));
  }
  return CheckSameNumel(op, "param_copy", copy, "param", param);
}

// The master parameters an optimizer updates: f32, or i16 when the master is split
// (SplitMaster in kernels/dtype.h) and its high halves are the bf16 param_copy, which is then
// rounded to nearest only (a stochastic copy could not be the high half of the master).
inline absl::Status CheckMaster(const char* op, const Tensor& param, const Tensor& copy,
                                bool stochastic, const DeviceContext& ctx) {
  if (absl::Status s = CheckOnDevice(op, "param", param, ctx); !s.ok()) return s;
  if (param.dtype() == DType::kF32) return absl::OkStatus();
  if (param.dtype() != DType::kI16) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": param has dtype ",
                                                   DTypeName(param.dtype()),
                                                   ", expected f32 (or i16: a split master)"));
  }
  if (copy.empty() || copy.dtype() != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": param is i16 (the low halves of a split master) but param_copy is ",
        copy.empty() ? std::string("empty") : DTypeName(copy.dtype()),
        "; the split needs the bf16 high halves in param_copy"));
  }
  if (stochastic) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": stochastic_rounding with a split master (i16 param): the bf16 copy must be the "
            "master's high half, rounded to nearest"));
  }
  return absl::OkStatus();
}

inline absl::Status NoCudaKernel(const char* op) {
  return absl::UnimplementedError(absl::StrCat(op, ": no CUDA kernel in this build"));
}

}  // namespace zt::internal

// An op's entry point hands a CUDA context's call to its kernels/cuda/ twin: `return
// ZT_CUDA_OP(kOp, cuda::LayerNormForward(ctx, args));`. In a build without nvcc the twin is not
// compiled (nor named), and the op says so.
#if ZT_HAVE_CUDA
#define ZT_CUDA_OP(op, call) (call)
#else
#define ZT_CUDA_OP(op, call) (::zt::internal::NoCudaKernel(op))
#endif

namespace zt::internal {

// Adam's hyperparameters, shared by AdamWUpdate and AdamW8bitUpdate: β1, β2 in [0, 1),
// ε > 0, a 1-based step. The error names the op and the argument.
inline absl::Status CheckAdamHyperparameters(const char* op, float beta1, float beta2, float eps,
                                             int64_t step) {
  for (const auto& [name, beta] : {std::pair<const char*, float>{"beta1", beta1},
                                   std::pair<const char*, float>{"beta2", beta2}}) {
    if (!(beta >= 0.0f && beta < 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " is ", beta, ", must be in [0, 1)"));
    }
  }
  if (step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": step is ", step, ", must be at least 1 (it is 1-based)"));
  }
  if (!(eps > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps is ", eps, ", must be > 0"));
  }
  return absl::OkStatus();
}

}  // namespace zt::internal
