#include "worker/optim/optimizer.h"

#include "kernels/optimizer.h"
#include "kernels/status_macros.h"

namespace zt {
namespace {

Tensor Range(const Tensor& flat, int64_t offset, int64_t numel) {
  return Tensor(flat.data<float>() + offset, DType::kF32, {numel}, flat.device());
}

}  // namespace

absl::StatusOr<Optimizer> Optimizer::Create(const zerotrain::OptimizerConfig& config,
                                            const ModelLayout& layout, const Arenas& state) {
  Optimizer opt;
  opt.config_ = config;
  const bool sgd = config.type() == zerotrain::OptimizerConfig::SGD;
  for (const UnitLayout& u : layout.units) {
    // Consecutive tensors with the same decay merge into one segment: fewer, longer updates.
    std::vector<Segment> segs;
    for (const ParamSpec& p : u.params) {
      const bool decay = config.decay_all_parameters() || p.is_matrix;
      if (!segs.empty() && segs.back().decay == decay) {
        segs.back().numel += p.numel;
      } else {
        segs.push_back({p.offset, p.numel, decay});
      }
    }
    opt.segments_.push_back(std::move(segs));
    if (sgd) {
      if (config.momentum() > 0) {
        ZT_ASSIGN_OR_RETURN(Tensor b, state.Get(u.name + ".momentum"));
        opt.momentum_.push_back(b);
      }
    } else {
      ZT_ASSIGN_OR_RETURN(Tensor m, state.Get(u.name + ".adam_m"));
      ZT_ASSIGN_OR_RETURN(Tensor v, state.Get(u.name + ".adam_v"));
      opt.m_.push_back(m);
      opt.v_.push_back(v);
    }
  }
  return opt;
}

absl::Status Optimizer::Step(const DeviceContext& ctx, const std::vector<Tensor>& params,
                             const std::vector<Tensor>& grads, float lr, float grad_scale) {
  const bool sgd = config_.type() == zerotrain::OptimizerConfig::SGD;
  const int64_t step = steps_taken_ + 1;
  for (size_t u = 0; u < segments_.size(); ++u) {
    for (const Segment& s : segments_[u]) {
      const float wd = s.decay ? config_.weight_decay() : 0.0f;
      const Tensor p = Range(params[u], s.offset, s.numel);
      const Tensor g = Range(grads[u], s.offset, s.numel);
      if (sgd) {
        ZT_RETURN_IF_ERROR(SgdUpdate(
            ctx, {.param = p,
                  .grad = g,
                  .momentum = momentum_.empty() ? Tensor() : Range(momentum_[u], s.offset, s.numel),
                  .lr = lr,
                  .momentum_factor = config_.momentum(),
                  .weight_decay = wd,
                  .grad_scale = grad_scale}));
      } else {
        ZT_RETURN_IF_ERROR(AdamWUpdate(ctx, {.param = p,
                                             .grad = g,
                                             .m = Range(m_[u], s.offset, s.numel),
                                             .v = Range(v_[u], s.offset, s.numel),
                                             .lr = lr,
                                             .beta1 = config_.beta1(),
                                             .beta2 = config_.beta2(),
                                             .eps = config_.eps(),
                                             .weight_decay = wd,
                                             .step = step,
                                             .grad_scale = grad_scale}));
      }
    }
  }
  steps_taken_ = step;
  return absl::OkStatus();
}

}  // namespace zt
