#include "worker/model/text_generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/status_macros.h"
#include "worker/model/transformer.h"

namespace zt {

absl::StatusOr<std::vector<int32_t>> GenerateTokens(const DeviceContext& caller_ctx,
                                                    const zerotrain::JobSpec& job,
                                                    const Arenas& state,
                                                    const std::vector<int32_t>& prompt,
                                                    const GenerationOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("generation: the prompt is empty");
  if (!(options.temperature > 0)) {
    return absl::InvalidArgumentError("generation: temperature must be > 0");
  }
  const int64_t T = job.data().seq_len();
  const int64_t V = job.model().vocab_size();
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<Arenas> work,
                      Arenas::Create(PlanInference(job, caller_ctx, 1, T)));
  // The GEMMs run on this plan's scratch, sized for the caller's context.
  DeviceContext ctx = caller_ctx;
  ZT_ASSIGN_OR_RETURN(Tensor gemm_workspace, work->Get("gemm_workspace"));
  ctx.workspace = {.data = gemm_workspace.raw(), .bytes = gemm_workspace.size_bytes()};
  ZT_ASSIGN_OR_RETURN(Transformer model, Transformer::Bind(job.model(), state, *work, 1, T));

  std::vector<int32_t> text = prompt;
  std::mt19937_64 rng(options.seed);
  std::vector<float> probs(V), row(V);
  std::vector<int32_t> order(V);
  int32_t* tokens = model.tokens().data<int32_t>();
  for (int64_t n = 0; n < options.new_tokens; ++n) {
    // Causal attention: the logits at position p depend only on tokens ≤ p, so the unused
    // tail of the window may hold anything.
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(text.size()), T);
    std::fill(tokens, tokens + T, 0);
    std::copy(text.end() - len, text.end(), tokens);
    ZT_RETURN_IF_ERROR(model.ForwardLogits(ctx));
    // The logits are in the compute dtype: widen the last position's row to f32.
    const Tensor& all = model.logits();
    for (int64_t v = 0; v < V; ++v) {
      const int64_t i = (len - 1) * V + v;
      switch (all.dtype()) {
        case DType::kBF16:
          row[v] = Bf16ToFloat(all.data<uint16_t>()[i]);
          break;
        case DType::kF16:
          row[v] = HalfToFloat(all.data<uint16_t>()[i]);
          break;
        default:
          row[v] = all.data<float>()[i];
          break;
      }
    }
    const float* logits = row.data();

    std::iota(order.begin(), order.end(), 0);
    const int k = options.top_k > 0 ? std::min<int>(options.top_k, V) : static_cast<int>(V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    const float max_logit = logits[order[0]];
    double total = 0;
    for (int i = 0; i < k; ++i) {
      probs[i] = std::exp((logits[order[i]] - max_logit) / options.temperature);
      total += probs[i];
    }
    double u = std::uniform_real_distribution<double>(0.0, total)(rng);
    int pick = k - 1;
    for (int i = 0; i < k; ++i) {
      u -= probs[i];
      if (u <= 0) {
        pick = i;
        break;
      }
    }
    text.push_back(order[pick]);
  }
  return std::vector<int32_t>(text.begin() + static_cast<int64_t>(prompt.size()), text.end());
}

}  // namespace zt
