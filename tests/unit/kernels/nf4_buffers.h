// Host storage for one NF4 tensor (kernels/nf4.h), sized by Nf4LayoutFor, for the NF4 and
// NF4-linear tests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/nf4.h"

namespace zt::testing {

class Nf4Buffers {
 public:
  Nf4Buffers(int64_t numel, Nf4Absmax format, const Nf4ShareShape& share = {})
      : numel_(numel), format_(format), share_(share) {
    const Nf4Layout l = Nf4LayoutFor(numel, format, share);
    block_base_.assign(l.rows, -1);
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
    if (format_ == Nf4Absmax::kGroupIndexed) {
      t.share = share_;
      t.block_base =
          Tensor(block_base_.data(), DType::kI32, {static_cast<int64_t>(block_base_.size())});
    }
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

  int64_t numel() const { return numel_; }
  const std::vector<uint8_t>& codes() const { return codes_; }
  const std::vector<uint8_t>& absmax_codes() const { return absmax_u8_; }
  const std::vector<float>& absmax_f32() const { return absmax_f32_; }
  const std::vector<float>& scale() const { return scale_; }
  float offset() const { return offset_.at(0); }
  // Writable, for building a kGroupIndexed share.
  std::vector<uint8_t>& mutable_codes() { return codes_; }
  std::vector<uint8_t>& mutable_absmax_codes() { return absmax_u8_; }
  std::vector<float>& mutable_scale() { return scale_; }
  std::vector<float>& mutable_offset() { return offset_; }
  std::vector<int32_t>& mutable_block_base() { return block_base_; }

 private:
  int64_t numel_;
  Nf4Absmax format_;
  Nf4ShareShape share_;
  std::vector<uint8_t> codes_;
  std::vector<uint8_t> absmax_u8_;
  std::vector<float> absmax_f32_;
  std::vector<float> scale_;
  std::vector<float> offset_;
  std::vector<int32_t> block_base_;
};

// The kGroupIndexed share of rows [row_begin, row_begin + rows) and columns [col_begin, col_begin
// + cols) of `whole` (a kDoubleQuantized weight of `whole_cols` columns; cols, col_begin and
// whole_cols multiples of 64), sliced as worker/model/transformer_lora.cc slices it: each
// element's code, each block's whole-weight absmax code, the whole group scales and μ, and
// each share row's first whole-weight block.
inline Nf4Buffers Nf4ShareOf(const Nf4Buffers& whole, int64_t whole_cols, int64_t row_begin,
                             int64_t rows, int64_t col_begin, int64_t cols) {
  Nf4Buffers s(rows * cols, Nf4Absmax::kGroupIndexed,
               {.row_blocks = cols / kNf4Block, .whole_numel = whole.numel()});
  std::fill(s.mutable_codes().begin(), s.mutable_codes().end(), uint8_t{0});
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = (row_begin + r) * whole_cols + col_begin;
    s.mutable_block_base()[r] = static_cast<int32_t>(first / kNf4Block);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t local = r * cols + c, from = first + c;
      const uint8_t byte = whole.codes()[from / 2];
      const uint8_t code = from % 2 == 0 ? byte >> 4 : byte & 0xF;
      s.mutable_codes()[local / 2] |= local % 2 == 0 ? code << 4 : code;
      if (c % kNf4Block == 0) {
        s.mutable_absmax_codes()[local / kNf4Block] = whole.absmax_codes()[from / kNf4Block];
      }
    }
  }
  s.mutable_scale() = whole.scale();
  s.mutable_offset() = {whole.offset()};
  return s;
}

}  // namespace zt::testing
