// Autoregressive sampling from a model: the demo's proof that training learned something.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "proto/job.pb.h"
#include "worker/plan/arena.h"

namespace zt {

struct GenerationOptions {
  int64_t new_tokens = 200;
  float temperature = 0.8f;  // > 0; lower is greedier
  int top_k = 40;            // sample among the k most likely tokens; 0: all
  uint64_t seed = 1;
};

// Continues `prompt` (non-empty) with new tokens sampled from the model whose parameters are
// the "<unit>.params" buffers of `state`. Plans and allocates its own forward-only buffers
// for one sequence of data.seq_len tokens; the window slides once the text is longer.
absl::StatusOr<std::vector<int32_t>> GenerateTokens(const DeviceContext& ctx,
                                                    const zerotrain::JobSpec& job,
                                                    const Arenas& state,
                                                    const std::vector<int32_t>& prompt,
                                                    const GenerationOptions& options);

}  // namespace zt
