#include "worker/job/parallel_validation.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace zt {
namespace {

using zerotrain::ParallelConfig;

class Lines {
 public:
  explicit Lines(std::vector<std::string>& out) : out_(out) {}
  void Add(std::string line) { out_.push_back(std::move(line)); }
  // Optional fields are completed by ApplyJobDefaults; one still unset means it did not run.
  bool Set(absl::string_view field, bool has) {
    if (!has) Add(absl::StrCat(field, ": not set (ApplyJobDefaults must run before validation)"));
    return has;
  }
  // Whether `value` >= `min`; adds the line when not.
  bool AtLeast(absl::string_view field, int64_t value, int64_t min) {
    if (value >= min) return true;
    Add(absl::StrCat(field, ": must be >= ", min, " (got ", value, ")"));
    return false;
  }

 private:
  std::vector<std::string>& out_;
};

// ZeRO and the data-parallel settings the layout does not touch.
void ValidateZero(const ParallelConfig& p, Lines& v) {
  if (p.zero_stage() < 0 || p.zero_stage() > 3) {
    v.Add(absl::StrCat("parallel.zero_stage: must be in 0..3 (got ", p.zero_stage(), ")"));
  }
  v.Set("parallel.reshard_after_forward", p.has_reshard_after_forward());
  if (v.Set("parallel.prefetch_units", p.has_prefetch_units())) {
    v.AtLeast("parallel.prefetch_units", p.prefetch_units(), 0);
    // Each prefetched unit holds a gather buffer; a huge count hung the planner (issue 20 fuzz).
    if (p.prefetch_units() > 64) {
      v.Add(absl::StrCat("parallel.prefetch_units: at most 64, got ", p.prefetch_units()));
    }
  }
  if (v.Set("parallel.bucket_bytes", p.has_bucket_bytes())) {
    v.AtLeast("parallel.bucket_bytes", p.bucket_bytes(), 0);
  }
  if (v.Set("parallel.comm_timeout_s", p.has_comm_timeout_s()) && !(p.comm_timeout_s() > 0)) {
    v.Add(absl::StrCat("parallel.comm_timeout_s: must be > 0 (got ", p.comm_timeout_s(), ")"));
  }
}

// Tensor parallelism splits attention by heads and the MLP by its hidden width (Shoeybi et al.
// 2019): each rank must get whole heads and an equal slice of d_ff.
void ValidateTensorParallel(const zerotrain::JobSpec& spec, int tp, Lines& v) {
  const zerotrain::ModelConfig& m = spec.model();
  if (m.n_head() >= 1 && m.n_head() % tp != 0) {
    v.Add(absl::StrCat("parallel.tensor_parallel: ", tp, " does not divide model.n_head ",
                       m.n_head(), " (attention is split by heads: each rank needs whole heads)"));
  }
  const int kv = m.n_kv_head();
  if (kv >= 1 && kv >= tp && kv % tp != 0) {
    v.Add(absl::StrCat("parallel.tensor_parallel: ", tp, " does not divide model.n_kv_head ", kv,
                       " (with n_kv_head >= tensor_parallel the KV heads are split)"));
  }
  if (kv >= 1 && kv < tp && tp % kv != 0) {
    v.Add(absl::StrCat("parallel.tensor_parallel: ", tp, " is not a multiple of model.n_kv_head ",
                       kv,
                       " (with n_kv_head < tensor_parallel each KV head is replicated on "
                       "tensor_parallel / n_kv_head ranks)"));
  }
  if (m.d_ff() >= 1 && m.d_ff() % tp != 0) {
    v.Add(absl::StrCat("parallel.tensor_parallel: ", tp, " does not divide model.d_ff ", m.d_ff(),
                       " (the MLP is split column- then row-parallel by its hidden width)"));
  }
  if (spec.parallel().sequence_parallel() && tp < 2) {
    v.Add(absl::StrCat("parallel.sequence_parallel: needs parallel.tensor_parallel > 1 (got ", tp,
                       "): the sequence is split across the tensor-parallel group"));
  }
  if (spec.parallel().sequence_parallel() && tp >= 2 && spec.data().seq_len() % tp != 0) {
    v.Add(absl::StrCat("data.seq_len: ", spec.data().seq_len(),
                       " is not divisible by parallel.tensor_parallel ", tp,
                       " (parallel.sequence_parallel splits the sequence's tokens evenly over "
                       "the tensor-parallel group)"));
  }
}

void ValidatePipeline(const zerotrain::JobSpec& spec, int pp, Lines& v) {
  const ParallelConfig& p = spec.parallel();
  const int n_layer = spec.model().n_layer();
  // Units: the embedding, n_layer blocks, the final norm + head (DESIGN.md, "Unit").
  const int64_t units = int64_t{n_layer} + 2;
  if (n_layer >= 1 && pp > units) {
    v.Add(absl::StrCat("parallel.pipeline_parallel: ", pp, " stages exceed the model's ", units,
                       " units (model.n_layer ", n_layer,
                       " blocks + embedding + head): every stage needs at least one unit"));
  }
  const ParallelConfig::PipelineSchedule schedule = p.pipeline_schedule();
  if (schedule != ParallelConfig::GPIPE && schedule != ParallelConfig::ONE_F_ONE_B &&
      schedule != ParallelConfig::INTERLEAVED) {
    const std::string name = ParallelConfig::PipelineSchedule_Name(schedule);
    v.Add(
        absl::StrCat("parallel.pipeline_schedule: must be GPIPE, ONE_F_ONE_B or INTERLEAVED (got ",
                     name.empty() ? absl::StrCat(static_cast<int>(schedule)) : name, ")"));
  }
  const int vs = p.virtual_stages();
  if (v.Set("parallel.virtual_stages", p.has_virtual_stages()) &&
      v.AtLeast("parallel.virtual_stages", vs, 1)) {
    if (schedule != ParallelConfig::INTERLEAVED && vs > 1) {
      v.Add(absl::StrCat("parallel.virtual_stages: ", vs,
                         " needs parallel.pipeline_schedule INTERLEAVED (got ",
                         ParallelConfig::PipelineSchedule_Name(schedule), ")"));
    }
    if (schedule == ParallelConfig::INTERLEAVED) {
      if (vs < 2) {
        v.Add(
            absl::StrCat("parallel.virtual_stages: INTERLEAVED needs >= 2 model chunks per rank "
                         "(got ",
                         vs, "; 1 is ONE_F_ONE_B)"));
      }
      if (pp < 2) {
        v.Add(
            absl::StrCat("parallel.pipeline_schedule: INTERLEAVED needs "
                         "parallel.pipeline_parallel >= 2 (got ",
                         pp, ")"));
      }
      if (n_layer >= 1 && n_layer % (int64_t{pp} * vs) != 0) {
        v.Add(absl::StrCat("parallel.virtual_stages: model.n_layer ", n_layer,
                           " is not divisible by parallel.pipeline_parallel ", pp,
                           " × parallel.virtual_stages ", vs,
                           " (each of the pp · virtual_stages chunks holds as many blocks)"));
      }
    }
  }
  if (!v.Set("parallel.micro_batches", p.has_micro_batches()) ||
      !v.AtLeast("parallel.micro_batches", p.micro_batches(), 1)) {
    return;
  }
  const int m = p.micro_batches();
  // An invalid grad_accum_steps has its own line.
  if (spec.train().grad_accum_steps() >= 1 && m != spec.train().grad_accum_steps()) {
    v.Add(absl::StrCat("parallel.micro_batches: ", m, " differs from train.grad_accum_steps ",
                       spec.train().grad_accum_steps(),
                       "; the pipeline's micro-batches are the step's accumulation micro-batches "
                       "(set one of them, or both alike)"));
  }
  if (pp > 1 && schedule != ParallelConfig::GPIPE && m < pp) {
    v.Add(absl::StrCat("parallel.micro_batches: ", m, " is fewer than parallel.pipeline_parallel ",
                       pp, "; ", ParallelConfig::PipelineSchedule_Name(schedule),
                       " needs at least one micro-batch per stage to fill the pipeline"));
  }
  if (schedule == ParallelConfig::INTERLEAVED && pp > 1 && m % pp != 0) {
    v.Add(absl::StrCat("parallel.micro_batches: ", m,
                       " is not a multiple of parallel.pipeline_parallel ", pp,
                       " (the INTERLEAVED schedule sends micro-batches through the chunks in "
                       "groups of pipeline_parallel)"));
  }
}

}  // namespace

std::vector<std::string> ParallelViolations(const zerotrain::JobSpec& spec) {
  std::vector<std::string> out;
  Lines v(out);
  const ParallelConfig& p = spec.parallel();
  const bool world_ok = v.Set("parallel.world_size", p.has_world_size()) &&
                        v.AtLeast("parallel.world_size", p.world_size(), 1);
  ValidateZero(p, v);
  const bool tp_ok = v.Set("parallel.tensor_parallel", p.has_tensor_parallel()) &&
                     v.AtLeast("parallel.tensor_parallel", p.tensor_parallel(), 1);
  const bool pp_ok = v.Set("parallel.pipeline_parallel", p.has_pipeline_parallel()) &&
                     v.AtLeast("parallel.pipeline_parallel", p.pipeline_parallel(), 1);
  if (tp_ok) ValidateTensorParallel(spec, p.tensor_parallel(), v);
  if (pp_ok) ValidatePipeline(spec, p.pipeline_parallel(), v);
  if (!world_ok || !tp_ok || !pp_ok) return out;
  const int64_t model_parallel = int64_t{p.tensor_parallel()} * p.pipeline_parallel();
  if (p.world_size() % model_parallel != 0) {
    v.Add(absl::StrCat("parallel.world_size: ", p.world_size(),
                       " is not divisible by parallel.tensor_parallel ", p.tensor_parallel(),
                       " × parallel.pipeline_parallel ", p.pipeline_parallel(), " = ",
                       model_parallel,
                       " (the data-parallel size is world_size / (tensor_parallel · "
                       "pipeline_parallel))"));
    return out;
  }
  const int64_t data_parallel = p.world_size() / model_parallel;
  if (v.Set("parallel.shard_group_size", p.has_shard_group_size()) &&
      v.AtLeast("parallel.shard_group_size", p.shard_group_size(), 1) &&
      data_parallel % p.shard_group_size() != 0) {
    v.Add(absl::StrCat("parallel.shard_group_size: ", p.shard_group_size(),
                       " does not divide the data-parallel size ", data_parallel,
                       " (parallel.world_size ", p.world_size(), " / (tensor_parallel ",
                       p.tensor_parallel(), " · pipeline_parallel ", p.pipeline_parallel(),
                       ")): ZeRO shards inside the data-parallel group"));
  }
  return out;
}

}  // namespace zt
