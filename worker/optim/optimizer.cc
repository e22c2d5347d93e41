#include "worker/optim/optimizer.h"

#include "absl/strings/str_cat.h"
#include "kernels/adafactor.h"
#include "kernels/adam8bit.h"
#include "kernels/optimizer.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

Tensor Range(const Tensor& flat, int64_t offset, int64_t numel) {
  return Tensor(static_cast<char*>(flat.raw()) + offset * DTypeSize(flat.dtype()), flat.dtype(),
                {numel}, flat.device());
}

}  // namespace

absl::StatusOr<Optimizer> Optimizer::Create(const zerotrain::OptimizerConfig& config,
                                            const zerotrain::PrecisionConfig& precision,
                                            const ModelLayout& layout, const Arenas& state,
                                            std::vector<FlatRange> ranges,
                                            std::optional<ShardGroup> shard_group) {
  return Build(config, precision, layout, &state, std::move(ranges), std::move(shard_group));
}

absl::StatusOr<Optimizer> Optimizer::CreateUnbound(const zerotrain::OptimizerConfig& config,
                                                   const zerotrain::PrecisionConfig& precision,
                                                   const ModelLayout& layout,
                                                   std::vector<FlatRange> ranges,
                                                   std::optional<ShardGroup> shard_group) {
  return Build(config, precision, layout, nullptr, std::move(ranges), std::move(shard_group));
}

absl::StatusOr<Optimizer> Optimizer::Build(const zerotrain::OptimizerConfig& config,
                                           const zerotrain::PrecisionConfig& precision,
                                           const ModelLayout& layout, const Arenas* state,
                                           std::vector<FlatRange> ranges,
                                           std::optional<ShardGroup> shard_group) {
  Optimizer opt;
  opt.has_master_ = precision.master_weights();
  opt.split_ = precision.split_master_weights();
  opt.bound_ = state != nullptr;
  opt.shard_group_ = std::move(shard_group);
  opt.config_ = config;
  opt.stochastic_rounding_ = precision.stochastic_rounding();
  opt.layout_ = layout;
  if (ranges.empty()) ranges.resize(layout.units.size());
  if (ranges.size() != layout.units.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", ranges.size(), " ranges for ", layout.units.size(), " units"));
  }
  for (size_t i = 0; i < layout.units.size(); ++i) {
    const UnitLayout& u = layout.units[i];
    FlatRange& range = ranges[i];
    if (range.end < 0) range.end = u.numel;
    if (range.begin < 0 || range.begin > range.end || range.end > u.numel) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer: range [", range.begin, ", ",
                                                     range.end, ") is outside unit ", u.name,
                                                     " of ", u.numel, " elements"));
    }
    if (precision.master_weights() && state != nullptr) {
      ZT_ASSIGN_OR_RETURN(
          Tensor master,
          state->Get(u.name + (precision.split_master_weights() ? ".master_low" : ".master")));
      opt.master_.push_back(master);
    }
    Unit unit;
    unit.state = OptimizerStateFor(config, u, range);
    for (const UnitOptimizerState::Buffer& b : unit.state.buffers) {
      if (state == nullptr) break;
      ZT_ASSIGN_OR_RETURN(Tensor t, state->Get(u.name + "." + b.name));
      unit.buffers.push_back(t);
    }
    opt.units_.push_back(std::move(unit));
  }
  opt.ranges_ = std::move(ranges);
  return opt;
}

std::function<absl::Status(float* data, int64_t n)> Optimizer::TensorSplitSums(
    int64_t rows, int64_t cols, const TensorSplit& split) const {
  // The kernel's shard path sums [Σ_j g² per row | Σ_i g² per column | Σ param²] (a matrix's
  // first call, rows + cols + 1 floats), then single floats (a vector's Σ param², and Σ U²).
  // Over the ZeRO shard group every float is partial; over the tensor-parallel group only what
  // the split cuts: with the rows split each rank's row sums are whole (its own rows), with
  // the columns split its column sums are.
  const auto zero = shard_group_->sum, tensor = shard_group_->tensor_sum;
  const bool rows_split = split.logical_rows > 0;
  return [zero, tensor, rows, cols, rows_split](float* data, int64_t n) -> absl::Status {
    if (zero) ZT_RETURN_IF_ERROR(zero(data, n));
    if (rows == 0 || n != rows + cols + 1) return tensor(data, n);
    if (rows_split) return tensor(data + rows, cols + 1);  // column sums, Σ param²
    ZT_RETURN_IF_ERROR(tensor(data, rows));                // row sums
    return tensor(data + rows + cols, 1);                  // Σ param²
  };
}

Optimizer::TensorSplit Optimizer::SplitOf(int u, size_t i) const {
  if (!shard_group_ || shard_group_->splits.empty()) return {};
  return shard_group_->splits[u][i];
}

absl::Status Optimizer::StepTensor(const DeviceContext& ctx, const std::vector<Tensor>& buffers,
                                   const ParamSpec& p, const TensorState& t,
                                   const TensorStep& s) const {
  const Tensor& param = s.param;
  const Tensor& grad = s.grad;
  const float lr = s.lr, grad_scale = s.grad_scale;
  const int64_t step = s.step;
  auto slice = [&](int i) {
    const TensorState::Slice& s = t.slices[i];
    return Range(buffers[s.buffer], s.offset, s.numel);
  };
  const float wd = config_.decay_all_parameters() || p.is_matrix ? config_.weight_decay() : 0.0f;
  switch (t.kind) {
    case TensorState::Kind::kFp32Moments:
      return AdamWUpdate(ctx, {.param = param,
                               .grad = grad,
                               .m = slice(0),
                               .v = slice(1),
                               .lr = lr,
                               .beta1 = config_.beta1(),
                               .beta2 = config_.beta2(),
                               .eps = config_.eps(),
                               .weight_decay = wd,
                               .step = step,
                               .grad_scale = grad_scale,
                               .param_copy = s.param_copy,
                               .stochastic_rounding = stochastic_rounding_,
                               .seed = s.seed});
    case TensorState::Kind::kQuantizedMoments:
      return AdamW8bitUpdate(ctx, {.param = param,
                                   .grad = grad,
                                   .m_codes = slice(0),
                                   .m_absmax = slice(2),
                                   .v_codes = slice(1),
                                   .v_absmax = slice(3),
                                   .block = config_.quant_block_size(),
                                   .lr = lr,
                                   .beta1 = config_.beta1(),
                                   .beta2 = config_.beta2(),
                                   .eps = config_.eps(),
                                   .weight_decay = wd,
                                   .step = step,
                                   .grad_scale = grad_scale,
                                   .param_copy = s.param_copy,
                                   .stochastic_rounding = stochastic_rounding_,
                                   .seed = s.seed});
    case TensorState::Kind::kFactored:
    case TensorState::Kind::kFull: {
      const auto& a = config_.adafactor();
      const bool matrix = p.shape.size() == 2;
      const bool factored = t.kind == TensorState::Kind::kFactored;
      const bool has_m = a.beta1() > 0;
      // Sharded (possibly empty) tensors pass 1-D views of their elements; whole matrices
      // their 2-D shape.
      const bool empty = t.begin == t.end;
      const bool zero_sharded = shard_group_ && shard_group_->sum;
      const bool tensor_split = s.split.logical_rows > 0 || s.split.logical_cols > 0;
      const bool shard_path = zero_sharded || tensor_split;
      const bool reshape = factored && !shard_path;
      auto shaped = [&](const Tensor& x) {
        return reshape && !x.empty() ? x.Reshape({p.shape[0], p.shape[1]}) : x;
      };
      AdafactorArgs args{.param = shaped(param),
                         .grad = shaped(grad),
                         .row_state = factored ? slice(0) : Tensor(),
                         .col_state = factored ? slice(1) : Tensor(),
                         .full_state = !empty && !factored ? slice(0) : Tensor(),
                         .m = has_m && !empty ? slice(factored ? 2 : 1) : Tensor(),
                         // The relative step replaces the learning rate; the kernel refuses both.
                         .lr = a.relative_step() ? 0.0f : lr,
                         .beta1 = a.beta1(),
                         .decay_rate = a.decay_rate(),
                         .eps1 = a.eps1(),
                         .eps2 = a.eps2(),
                         .clip_threshold = a.clip_threshold(),
                         .relative_step = a.relative_step(),
                         .scale_parameter = a.scale_parameter(),
                         .warmup_init = a.warmup_init(),
                         .weight_decay = wd,
                         .step = step,
                         .grad_scale = grad_scale,
                         .param_copy = shaped(s.param_copy),
                         .stochastic_rounding = stochastic_rounding_,
                         .seed = s.seed};
      if (shard_path) {
        // The whole tensor's statistics, kept identical across the group by the kernel's sums.
        const int64_t rows = matrix ? p.shape[0] : 0, cols = matrix ? p.shape[1] : p.numel;
        args.shard = AdafactorArgs::Shard{.rows = rows,
                                          .cols = cols,
                                          .begin = t.begin,
                                          .end = t.end,
                                          .sum_across_shards = shard_group_->sum,
                                          .logical_rows = s.split.logical_rows,
                                          .logical_cols = s.split.logical_cols,
                                          .uncounted_rows = s.split.uncounted_rows};
        if (tensor_split) {
          args.shard->sum_across_shards = TensorSplitSums(rows, cols, s.split);
          args.shard->sum_row_states = shard_group_->tensor_sum;
        }
        args.reduce_scratch = shard_group_->reduce_scratch;
      }
      return AdafactorUpdate(ctx, args);
    }
    case TensorState::Kind::kNone:
      // Sharded Adafactor still takes part in the group's sums for a tensor it holds none of.
      if (shard_group_ && shard_group_->sum &&
          config_.type() == zerotrain::OptimizerConfig::ADAFACTOR) {
        TensorState none = t;
        none.kind = TensorState::Kind::kFull;
        return StepTensor(ctx, buffers, p, none, s);
      }
      return absl::OkStatus();
    case TensorState::Kind::kMomentum:
    case TensorState::Kind::kStateless:
      return SgdUpdate(ctx,
                       {.param = param,
                        .grad = grad,
                        .momentum = t.kind == TensorState::Kind::kMomentum ? slice(0) : Tensor(),
                        .lr = lr,
                        .momentum_factor = config_.momentum(),
                        .weight_decay = wd,
                        .grad_scale = grad_scale,
                        .param_copy = s.param_copy,
                        .stochastic_rounding = stochastic_rounding_,
                        .seed = s.seed});
  }
  return absl::InternalError("optimizer: unknown state kind");
}

absl::Status Optimizer::StepUnit(const DeviceContext& ctx, int u, const Tensor& params,
                                 const Tensor& grads, float lr, float grad_scale,
                                 uint64_t seed) const {
  if (!bound_) {
    return absl::FailedPreconditionError(
        "optimizer: its states are not bound (CreateUnbound): step with the unit's views");
  }
  return StepUnit(ctx, u, params, grads, lr, grad_scale, seed,
                  {.master = has_master_ ? master_[u] : Tensor(), .buffers = units_[u].buffers});
}

absl::Status Optimizer::StepUnit(const DeviceContext& ctx, int u, const Tensor& params,
                                 const Tensor& grads, float lr, float grad_scale, uint64_t seed,
                                 const UnitStateViews& state) const {
  if (state.buffers.size() != units_[u].state.buffers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: unit ", layout_.units[u].name,
                                                   " takes ", units_[u].state.buffers.size(),
                                                   " state buffers, given ", state.buffers.size()));
  }
  const int64_t step = steps_taken_ + 1;
  const UnitLayout& layout = layout_.units[u];
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamSpec& p = layout.params[i];
    const TensorState& t = units_[u].state.tensors[i];
    // Offset of the tensor's stepped elements in the views, which start at the range.
    const int64_t begin = p.offset + t.begin - ranges_[u].begin, n = t.end - t.begin;
    const bool has_master = has_master_;
    // Each tensor draws its own rounding stream: the kernel hashes (seed, element index).
    const uint64_t tensor_seed = seed ^ (0x9E3779B97F4A7C15ull * (u * 1024 + i + 1));
    ZT_RETURN_IF_ERROR(
        StepTensor(ctx, state.buffers, p, t,
                   {.param = has_master ? Range(state.master, begin, n) : Range(params, begin, n),
                    .param_copy = has_master ? Range(params, begin, n) : Tensor(),
                    .grad = Range(grads, begin, n),
                    .lr = lr,
                    .grad_scale = grad_scale,
                    .step = step,
                    .seed = tensor_seed,
                    .split = SplitOf(u, i)}));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::Step(const DeviceContext& ctx, const std::vector<Tensor>& params,
                             const std::vector<Tensor>& grads, float lr, float grad_scale,
                             uint64_t seed) {
  for (size_t u = 0; u < units_.size(); ++u) {
    ZT_RETURN_IF_ERROR(
        StepUnit(ctx, static_cast<int>(u), params[u], grads[u], lr, grad_scale, seed));
  }
  CountStep();
  return absl::OkStatus();
}

}  // namespace zt
