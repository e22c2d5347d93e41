#include "worker/plan/optimizer_state_layout.h"

#include <algorithm>

#include "kernels/quantization.h"

namespace zt {
namespace {

class StateBuilder {
 public:
  // The slice of `numel` elements of buffer `name` (created on first use).
  TensorState::Slice Take(const std::string& name, DType dtype, int64_t numel) {
    int index = -1;
    for (size_t i = 0; i < state_.buffers.size(); ++i) {
      if (state_.buffers[i].name == name) index = static_cast<int>(i);
    }
    if (index < 0) {
      state_.buffers.push_back({name, dtype, 0});
      index = static_cast<int>(state_.buffers.size()) - 1;
    }
    TensorState::Slice s{index, state_.buffers[index].numel, numel};
    state_.buffers[index].numel += numel;
    return s;
  }
  UnitOptimizerState& state() { return state_; }

 private:
  UnitOptimizerState state_;
};

}  // namespace

UnitOptimizerState OptimizerStateFor(const zerotrain::OptimizerConfig& config,
                                     const UnitLayout& unit, FlatRange range) {
  using Opt = zerotrain::OptimizerConfig;
  const int64_t range_end = range.end < 0 ? unit.numel : range.end;
  StateBuilder b;
  for (const ParamSpec& p : unit.params) {
    TensorState t;
    t.begin = std::clamp(range.begin - p.offset, int64_t{0}, p.numel);
    t.end = std::clamp(range_end - p.offset, int64_t{0}, p.numel);
    const int64_t n = t.end - t.begin;
    if (n == 0) {
      b.state().tensors.push_back(std::move(t));
      continue;
    }
    switch (config.type()) {
      case Opt::SGD:
        t.kind = TensorState::Kind::kStateless;
        if (config.momentum() > 0) {
          t.kind = TensorState::Kind::kMomentum;
          t.slices = {b.Take("momentum", DType::kF32, n)};
        }
        break;
      case Opt::ADAMW_8BIT:
        // The rule looks at the whole tensor, so every shard of it agrees.
        if (p.numel >= config.min_quantized_numel()) {
          const int64_t blocks = NumQuantBlocks(n, config.quant_block_size());
          t.kind = TensorState::Kind::kQuantizedMoments;
          t.slices = {b.Take("adam8_m_codes", DType::kU8, n),
                      b.Take("adam8_v_codes", DType::kU8, n),
                      b.Take("adam8_m_absmax", DType::kF32, blocks),
                      b.Take("adam8_v_absmax", DType::kF32, blocks)};
        } else {
          t.kind = TensorState::Kind::kFp32Moments;
          t.slices = {b.Take("adam_m", DType::kF32, n), b.Take("adam_v", DType::kF32, n)};
        }
        break;
      case Opt::ADAFACTOR: {
        const bool matrix = p.shape.size() == 2;
        if (matrix) {
          // The whole tensor's statistics on every rank that holds part of it: the kernel
          // keeps the copies identical by summing each shard's partial sums across the group.
          t.kind = TensorState::Kind::kFactored;
          t.slices = {b.Take("adafactor_row", DType::kF32, p.shape[0]),
                      b.Take("adafactor_col", DType::kF32, p.shape[1])};
        } else {
          t.kind = TensorState::Kind::kFull;
          t.slices = {b.Take("adafactor_full", DType::kF32, n)};
        }
        if (config.adafactor().beta1() > 0) {
          t.slices.push_back(b.Take("adafactor_m", DType::kF32, n));
        }
        break;
      }
      default:  // ADAMW
        t.kind = TensorState::Kind::kFp32Moments;
        t.slices = {b.Take("adam_m", DType::kF32, n), b.Take("adam_v", DType::kF32, n)};
        break;
    }
    b.state().tensors.push_back(std::move(t));
  }
  return std::move(b.state());
}

}  // namespace zt
