// The activation and workspace tables: every buffer the forward saves for the backward, and
// the scratch the step reuses, as named specs (see worker/plan/memory_plan.h for the naming).
// The plan sums them; the model looks its tensors up by the same names.
#pragma once

#include <cstdint>
#include <vector>

#include "proto/job.pb.h"
#include "worker/plan/memory_plan.h"

namespace zt {

// Activations of a forward over `batch` sequences of `seq_len` tokens.
std::vector<BufferSpec> ActivationTable(const zerotrain::ModelConfig& m, int64_t batch,
                                        int64_t seq_len);

// Workspace of a micro-batch: token ids, targets, logits. With `backward`, also the
// gradient scratch the backward reuses from unit to unit.
std::vector<BufferSpec> WorkspaceTable(const zerotrain::ModelConfig& m, int64_t batch,
                                       int64_t seq_len, bool backward);

}  // namespace zt
