// Where each optimizer keeps its state for one unit: the buffers the memory plan reserves
// ("<unit>.<name>") and, for each tensor of the unit, its slice of them. The plan sizes the
// buffers and the optimizer steps through the slices from this one description, so they
// cannot disagree.
//
//   ADAMW       adam_m, adam_v                       f32, one value per parameter
//   SGD         momentum (only when momentum > 0)    f32, one value per parameter
//   ADAMW_8BIT  tensors of ≥ min_quantized_numel elements: m/v as u8 codes
//               (adam8_m_codes, adam8_v_codes) and one f32 absmax per block of
//               quant_block_size (adam8_m_absmax, adam8_v_absmax); blocks start at each
//               tensor's first element, so no block straddles two tensors.
//               Smaller tensors keep f32 adam_m / adam_v (bitsandbytes' rule).
//   ADAFACTOR   matrices: adafactor_row (rows) and adafactor_col (cols) f32 statistics of
//               the whole tensor; vectors: adafactor_full (n) f32; plus adafactor_m (n) f32
//               when beta1 > 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"

namespace zt {

// One tensor's state: for each of the unit's state buffers it uses, the element offset and
// count inside that buffer.
struct TensorState {
  struct Slice {
    int buffer = -1;  // index into UnitOptimizerState::buffers
    int64_t offset = 0;
    int64_t numel = 0;
  };
  enum class Kind : uint8_t {
    kFp32Moments,
    kQuantizedMoments,
    kFactored,
    kFull,
    kMomentum,
    kStateless,  // SGD without momentum
    kNone,       // the tensor has no element in the range: nothing to step
  };
  Kind kind = Kind::kNone;
  // The tensor's elements this state covers, relative to the tensor's first element.
  int64_t begin = 0;
  int64_t end = 0;
  // Per kind: kFp32Moments {m, v}; kQuantizedMoments {m_codes, v_codes, m_absmax, v_absmax};
  // kFactored {row, col[, m]}; kFull {full[, m]}; kMomentum {momentum}.
  std::vector<Slice> slices;
};

struct UnitOptimizerState {
  struct Buffer {
    std::string name;  // "adam_m", "adam8_m_codes", ... (the plan prefixes "<unit>.")
    DType dtype = DType::kF32;
    int64_t numel = 0;
  };
  std::vector<Buffer> buffers;       // only those with numel > 0
  std::vector<TensorState> tensors;  // parallel to UnitLayout::params
};

// The elements [begin, end) of a unit's flat buffer: a ZeRO shard, or the whole unit.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = -1;  // < 0: to the end of the unit
};

// The state of the part of `unit` inside `range` (the whole unit by default). Each tensor
// contributes its intersection with the range (TensorState::Kind::kNone, no slices, when it
// has none). How a shard cut affects each state (shards share no value, but for Adafactor's
// replicated statistics):
//   fp32 moments, master weights, momentum: one value per element of the intersection;
//   8-bit AdamW: blocks start at the intersection's first element, so a block never
//     straddles a shard boundary (nor a tensor boundary);
//   Adafactor, matrices: the whole tensor's row and column statistics (its full row and
//     column counts, however little of it the range covers), replicated across the shard
//     group, kept identical by summing the shards' partial statistics before use
//     (AdafactorArgs::Shard, kernels/adafactor.h); m one value per element of the
//     intersection; vectors: full state of the intersection.
UnitOptimizerState OptimizerStateFor(const zerotrain::OptimizerConfig& config,
                                     const UnitLayout& unit, FlatRange range = {});

}  // namespace zt
