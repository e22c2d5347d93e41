// Host storage for one NF4 tensor (kernels/nf4.h), sized by Nf4LayoutFor, for the NF4 and
// NF4-linear tests.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/nf4.h"

namespace zt::testing {

class Nf4Buffers {
 public:
  Nf4Buffers(int64_t numel, Nf4Absmax format) : numel_(numel), format_(format) {
    const Nf4Layout l = Nf4LayoutFor(numel, format);
    codes_.assign(l.code_bytes, 0xAB);
    if (format == Nf4Absmax::kF32) {
      absmax_f32_.assign(l.blocks, -1.0f);
    } else {
      absmax_u8_.assign(l.blocks, 0xCD);
      scale_.assign(l.absmax_groups, -1.0f);
      offset_.assign(1, -1.0f);
    }
  }

  Nf4Tensor View() {
    Nf4Tensor t{.numel = numel_, .format = format_};
    t.codes = Tensor(codes_.data(), DType::kU8, {static_cast<int64_t>(codes_.size())});
    if (format_ == Nf4Absmax::kF32) {
      t.absmax =
          Tensor(absmax_f32_.data(), DType::kF32, {static_cast<int64_t>(absmax_f32_.size())});
    } else {
      t.absmax = Tensor(absmax_u8_.data(), DType::kU8, {static_cast<int64_t>(absmax_u8_.size())});
      t.absmax_scale = Tensor(scale_.data(), DType::kF32, {static_cast<int64_t>(scale_.size())});
      t.absmax_offset = Tensor(offset_.data(), DType::kF32, {1});
    }
    return t;
  }

  const std::vector<uint8_t>& codes() const { return codes_; }
  const std::vector<uint8_t>& absmax_codes() const { return absmax_u8_; }
  const std::vector<float>& absmax_f32() const { return absmax_f32_; }
  const std::vector<float>& scale() const { return scale_; }
  float offset() const { return offset_.at(0); }

 private:
  int64_t numel_;
  Nf4Absmax format_;
  std::vector<uint8_t> codes_;
  std::vector<uint8_t> absmax_u8_;
  std::vector<float> absmax_f32_;
  std::vector<float> scale_;
  std::vector<float> offset_;
};

}  // namespace zt::testing
