// CPU LLM.int8() linear layer. Every output element is computed by one thread in a fixed
// order (the int32 sum is exact anyway; the outlier sum runs over the outlier columns in
// increasing k), so results do not depend on the thread count.
#include "kernels/cpu/int8_linear.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/load_store.h"

namespace zt::cpu {
namespace {

constexpr int64_t kAlign = 64;
int64_t AlignUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

int8_t QuantizeTo127(float x, float inv_scale) {
  return static_cast<int8_t>(std::nearbyint(std::clamp(x * inv_scale, -127.0f, 127.0f)));
}

}  // namespace

absl::Status Int8QuantizeWeight(const DeviceContext& ctx, const Int8QuantizeWeightArgs& args) {
  const int64_t n = args.src.dim(0), k = args.src.dim(1);
  const float* w = args.src.data<float>();
  for (int64_t i = 0; i < n * k; ++i) {
    if (!std::isfinite(w[i])) {
      return absl::InvalidArgumentError(absl::StrCat("Int8QuantizeWeight: src[", i / k, ", ", i % k,
                                                     "] is ", w[i],
                                                     ", int8 quantizes finite values only"));
    }
  }
  auto* codes = reinterpret_cast<int8_t*>(args.dst.codes.data<uint8_t>());
  float* scales = args.dst.scales.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float* row = w + r * k;
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(row[c]));
    scales[r] = amax;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t c = 0; c < k; ++c) codes[r * k + c] = QuantizeTo127(row[c], inv);
  }
  return absl::OkStatus();
}

void Int8DequantizeWeight(const DeviceContext& ctx, const Int8DequantizeWeightArgs& args) {
  const int64_t n = args.dst.dim(0), k = args.dst.dim(1);
  const auto* codes = reinterpret_cast<const int8_t*>(args.src.codes.data<uint8_t>());
  const float* scales = args.src.scales.data<float>();
  float* w = args.dst.data<float>();
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t r = 0; r < n; ++r) {
    const float w_read = scales[r] / 127.0f;  // as the forward's outlier term and the backward
    for (int64_t c = 0; c < k; ++c) w[r * k + c] = static_cast<float>(codes[r * k + c]) * w_read;
  }
}

void Int8LinearForward(const DeviceContext& ctx, const Int8LinearDims& d,
                       const Int8LinearForwardArgs& args) {
  // Workspace: [Xq (M·K) int8][x_m (M) f32][outlier columns, ascending (≤ K) i32]
  auto* base = static_cast<uint8_t*>(ctx.workspace.data);
  auto* xq = reinterpret_cast<int8_t*>(base);
  auto* x_scale = reinterpret_cast<float*>(base + AlignUp(d.m * d.k));
  auto* outlier_cols = reinterpret_cast<int32_t*>(base + AlignUp(d.m * d.k) + AlignUp(4 * d.m));
  const DType inp_t = args.inp.dtype();
  const float threshold = args.outlier_threshold;

  // Flag the outlier columns scanning row by row (memory order), then compact the flags into
  // the ascending list in place (the list's i-th entry is never past column i).
  std::fill(outlier_cols, outlier_cols + d.k, 0);
  for (int64_t m = 0; m < d.m; ++m) {
    for (int64_t c = 0; c < d.k; ++c) {
      if (std::abs(Load(args.inp.raw(), inp_t, m * d.k + c)) >= threshold) outlier_cols[c] = 1;
    }
  }
  int64_t n_outliers = 0;
  for (int64_t c = 0; c < d.k; ++c) {
    if (outlier_cols[c] != 0) outlier_cols[n_outliers++] = static_cast<int32_t>(c);
  }
  const auto is_outlier = [&](int64_t c) {
    return std::binary_search(outlier_cols, outlier_cols + n_outliers, static_cast<int32_t>(c));
  };

#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t m = 0; m < d.m; ++m) {
    float amax = 0.0f;
    for (int64_t c = 0; c < d.k; ++c) {
      if (n_outliers == 0 || !is_outlier(c)) {
        amax = std::max(amax, std::abs(Load(args.inp.raw(), inp_t, m * d.k + c)));
      }
    }
    x_scale[m] = amax;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t c = 0; c < d.k; ++c) {
      xq[m * d.k + c] = QuantizeTo127(Load(args.inp.raw(), inp_t, m * d.k + c), inv);
    }
    // Outlier columns are 0 in Xq, so the int32 sum skips them without a branch.
    for (int64_t o = 0; o < n_outliers; ++o) xq[m * d.k + outlier_cols[o]] = 0;
  }

  const auto* wq = reinterpret_cast<const int8_t*>(args.weight.codes.data<uint8_t>());
  const float* w_scale = args.weight.scales.data<float>();
  const DType out_t = args.out.dtype();
  constexpr float kInv127Squared = 1.0f / (127.0f * 127.0f);
#pragma omp parallel for collapse(2) num_threads(ctx.num_threads) schedule(static)
  for (int64_t m = 0; m < d.m; ++m) {
    for (int64_t n = 0; n < d.n; ++n) {
      const int8_t* a = xq + m * d.k;
      const int8_t* b = wq + n * d.k;
      int32_t acc = 0;
      for (int64_t c = 0; c < d.k; ++c) acc += int32_t{a[c]} * int32_t{b[c]};
      float y = static_cast<float>(acc) * (x_scale[m] * w_scale[n] * kInv127Squared);
      const float w_read = w_scale[n] / 127.0f;
      for (int64_t o = 0; o < n_outliers; ++o) {
        const int64_t c = outlier_cols[o];
        y += Load(args.inp.raw(), inp_t, m * d.k + c) * (static_cast<float>(b[c]) * w_read);
      }
      if (!args.bias.empty()) {
        float bias = Load(args.bias.raw(), args.bias.dtype(), n);
        // The bias as its value in out's dtype, as LinearForward adds it.
        if (out_t == DType::kBF16) bias = FromBf16(ToBf16(bias));
        if (out_t == DType::kF16) bias = FromHalf(ToHalf(bias));
        y += bias;
      }
      Store(args.out.raw(), out_t, m * d.n + n, y);
    }
  }
}

void Int8LinearBackward(const DeviceContext& ctx, const Int8LinearDims& d,
                        const Int8LinearBackwardArgs& args) {
  const auto* wq = reinterpret_cast<const int8_t*>(args.weight.codes.data<uint8_t>());
  const float* w_scale = args.weight.scales.data<float>();
  const DType dout_t = args.dout.dtype(), dinp_t = args.dinp.dtype();
  const bool add = args.dinp_mode == Accumulate::kAdd;
#pragma omp parallel for num_threads(ctx.num_threads) schedule(static)
  for (int64_t m = 0; m < d.m; ++m) {
    // dinp row m = Σ_n dout[m, n] · (w_n / 127) · Wq[n, :], summed over n in order.
    float* acc = ScratchRow(0, d.k);
    std::fill(acc, acc + d.k, 0.0f);
    for (int64_t n = 0; n < d.n; ++n) {
      const float g = Load(args.dout.raw(), dout_t, m * d.n + n) * (w_scale[n] / 127.0f);
      const int8_t* row = wq + n * d.k;
      for (int64_t c = 0; c < d.k; ++c) acc[c] += g * static_cast<float>(row[c]);
    }
    for (int64_t c = 0; c < d.k; ++c) {
      const int64_t at = m * d.k + c;
      Store(args.dinp.raw(), dinp_t, at, add ? Load(args.dinp.raw(), dinp_t, at) + acc[c] : acc[c]);
    }
  }
}

}  // namespace zt::cpu
