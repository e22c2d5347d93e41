#include "worker/job/job_defaults.h"

#include <cstdint>
#include <limits>

#include "worker/job/lora_validation.h"

namespace zt {

using zerotrain::ModelConfig;
using zerotrain::OptimizerConfig;
using zerotrain::PrecisionConfig;
using zerotrain::ResourceConfig;

int64_t DefaultDff(ModelConfig::Family family, int64_t c) {
  int64_t d_ff = 0;
  switch (family) {
    case ModelConfig::GPT2:
      d_ff = 4 * c;
      break;
    case ModelConfig::LLAMA: {
      // SwiGLU's three matrices at 8·C/3 cost what GPT-2's two at 4·C do; a multiple of 64
      // keeps GEMM tiles full.
      const int64_t exact = (8 * c + 2) / 3;
      d_ff = (exact + 63) / 64 * 64;
      break;
    }
    default:
      return 0;
  }
  if (d_ff < 1 || d_ff > std::numeric_limits<int32_t>::max()) return 0;
  return d_ff;
}

void ApplyJobDefaults(zerotrain::JobSpec* spec) {
  ModelConfig& model = *spec->mutable_model();
  if (!model.has_n_kv_head()) model.set_n_kv_head(model.n_head());
  if (!model.has_d_ff()) {
    const int64_t d_ff = DefaultDff(model.family(), model.d_model());
    if (d_ff > 0) model.set_d_ff(static_cast<int32_t>(d_ff));
  }
  if (!model.has_tie_embeddings()) {
    if (model.family() == ModelConfig::GPT2) model.set_tie_embeddings(true);
    if (model.family() == ModelConfig::LLAMA) model.set_tie_embeddings(false);
  }
  if (!model.has_norm_eps()) model.set_norm_eps(1e-5f);
  if (!model.has_rope_theta()) model.set_rope_theta(10000.0f);
  if (!model.has_init_std()) model.set_init_std(0.02f);

  zerotrain::TrainConfig& train = *spec->mutable_train();
  // A job that names only the pipeline's micro-batches accumulates over them: they are the
  // same count (proto/job.proto, parallel.micro_batches).
  if (!train.has_grad_accum_steps()) {
    train.set_grad_accum_steps(
        spec->parallel().has_micro_batches() ? spec->parallel().micro_batches() : 1);
  }
  if (!train.has_eval_steps()) train.set_eval_steps(20);
  if (!train.has_log_interval()) train.set_log_interval(1);
  if (!train.has_seed()) train.set_seed(1337);

  // After train.seed, which it copies.
  zerotrain::DataConfig& data = *spec->mutable_data();
  if (!data.has_seed()) data.set_seed(train.seed());

  OptimizerConfig& optimizer = *spec->mutable_optimizer();
  if (optimizer.type() == OptimizerConfig::TYPE_UNSPECIFIED) {
    optimizer.set_type(OptimizerConfig::ADAMW);
  }
  if (!optimizer.has_beta1()) optimizer.set_beta1(0.9f);
  if (!optimizer.has_beta2()) optimizer.set_beta2(0.999f);
  if (!optimizer.has_eps()) optimizer.set_eps(1e-8f);
  if (!optimizer.has_weight_decay()) optimizer.set_weight_decay(0.01f);
  if (!optimizer.has_grad_clip()) optimizer.set_grad_clip(1.0f);
  OptimizerConfig::Schedule& schedule = *optimizer.mutable_schedule();
  if (schedule.decay() == OptimizerConfig::DECAY_UNSPECIFIED) {
    schedule.set_decay(OptimizerConfig::CONSTANT);
  }

  if (!optimizer.has_quant_block_size()) optimizer.set_quant_block_size(2048);
  if (!optimizer.has_min_quantized_numel()) optimizer.set_min_quantized_numel(4096);
  zerotrain::AdafactorConfig& adafactor = *optimizer.mutable_adafactor();
  if (!adafactor.has_scale_parameter()) adafactor.set_scale_parameter(true);
  if (!adafactor.has_decay_rate()) adafactor.set_decay_rate(-0.8f);
  if (!adafactor.has_clip_threshold()) adafactor.set_clip_threshold(1.0f);
  if (!adafactor.has_eps1()) adafactor.set_eps1(1e-30f);
  if (!adafactor.has_eps2()) adafactor.set_eps2(1e-3f);

  PrecisionConfig& precision = *spec->mutable_precision();
  if (precision.param_dtype() == PrecisionConfig::DTYPE_UNSPECIFIED) {
    precision.set_param_dtype(PrecisionConfig::FP32);
  }
  if (precision.compute_dtype() == PrecisionConfig::DTYPE_UNSPECIFIED) {
    precision.set_compute_dtype(precision.param_dtype());
  }
  if (precision.grad_dtype() == PrecisionConfig::DTYPE_UNSPECIFIED) {
    precision.set_grad_dtype(PrecisionConfig::FP32);
  }
  if (precision.reduce_dtype() == PrecisionConfig::DTYPE_UNSPECIFIED) {
    precision.set_reduce_dtype(precision.grad_dtype());
  }
  if (!precision.has_master_weights()) {
    precision.set_master_weights(precision.param_dtype() != PrecisionConfig::FP32);
  }
  ApplyLoraDefaults(spec);  // its base dtype follows param_dtype
  zerotrain::LossScaleConfig& loss_scale = *precision.mutable_loss_scale();
  if (!loss_scale.has_initial_power()) loss_scale.set_initial_power(16);
  if (!loss_scale.has_window()) loss_scale.set_window(1000);
  if (!loss_scale.has_hysteresis()) loss_scale.set_hysteresis(2);
  if (!loss_scale.has_min_scale()) loss_scale.set_min_scale(1.0f);
  if (!loss_scale.has_max_overflows_at_min_scale()) {
    loss_scale.set_max_overflows_at_min_scale(100);
  }

  zerotrain::MemoryConfig& memory = *spec->mutable_memory();
  if (memory.activation_checkpointing() == zerotrain::MemoryConfig::CHECKPOINTING_UNSPECIFIED) {
    memory.set_activation_checkpointing(zerotrain::MemoryConfig::NONE);
  }
  if (!memory.has_checkpoint_every_k()) memory.set_checkpoint_every_k(1);

  zerotrain::CheckpointConfig& checkpoint = *spec->mutable_checkpoint();
  if (!checkpoint.has_interval_steps()) checkpoint.set_interval_steps(1000);
  if (!checkpoint.has_keep_last()) checkpoint.set_keep_last(3);
  if (!checkpoint.has_save_optimizer()) checkpoint.set_save_optimizer(true);
  if (checkpoint.on_save_error() == zerotrain::CheckpointConfig::SAVE_ERROR_POLICY_UNSPECIFIED) {
    checkpoint.set_on_save_error(zerotrain::CheckpointConfig::FAIL);
  }

  zerotrain::SchedulingConfig& scheduling = *spec->mutable_scheduling();
  if (!scheduling.has_max_restarts()) scheduling.set_max_restarts(3);

  zerotrain::ParallelConfig& parallel = *spec->mutable_parallel();
  if (!parallel.has_world_size()) parallel.set_world_size(1);
  if (!parallel.has_zero_stage()) parallel.set_zero_stage(0);
  if (!parallel.has_tensor_parallel()) parallel.set_tensor_parallel(1);
  if (!parallel.has_pipeline_parallel()) parallel.set_pipeline_parallel(1);
  if (parallel.pipeline_schedule() == zerotrain::ParallelConfig::PIPELINE_SCHEDULE_UNSPECIFIED) {
    parallel.set_pipeline_schedule(zerotrain::ParallelConfig::ONE_F_ONE_B);
  }
  if (!parallel.has_virtual_stages()) parallel.set_virtual_stages(1);
  if (!parallel.has_micro_batches()) parallel.set_micro_batches(train.grad_accum_steps());
  if (!parallel.has_shard_group_size()) {
    // The data-parallel size; when tp · pp does not divide the world, validation names it.
    const int64_t model_parallel =
        int64_t{parallel.tensor_parallel()} * parallel.pipeline_parallel();
    const bool divides = model_parallel >= 1 && parallel.world_size() % model_parallel == 0;
    parallel.set_shard_group_size(divides
                                      ? static_cast<int32_t>(parallel.world_size() / model_parallel)
                                      : parallel.world_size());
  }
  if (!parallel.has_reshard_after_forward()) parallel.set_reshard_after_forward(true);
  if (!parallel.has_prefetch_units()) parallel.set_prefetch_units(1);
  if (!parallel.has_bucket_bytes()) parallel.set_bucket_bytes(int64_t{25} << 20);
  if (!parallel.has_comm_timeout_s()) parallel.set_comm_timeout_s(300);

  // DeepSpeed's defaults (its offload_optimizer, offload_param and aio sections).
  zerotrain::OffloadConfig& offload = *spec->mutable_offload();
  using Offload = zerotrain::OffloadConfig;
  if (offload.optimizer() == Offload::DEVICE_UNSPECIFIED) offload.set_optimizer(Offload::NONE);
  if (offload.params() == Offload::DEVICE_UNSPECIFIED) offload.set_params(Offload::NONE);
  if (!offload.has_buffer_count()) {
    offload.set_buffer_count(offload.params() != Offload::NONE ? kDeepSpeedParamBufferCount
                                                               : kDeepSpeedOptimizerBufferCount);
  }
  if (!offload.has_buffer_size()) offload.set_buffer_size(kDefaultOffloadBufferSize);
  zerotrain::AioConfig& aio = *offload.mutable_aio();
  if (!aio.has_block_size()) aio.set_block_size(kDeepSpeedAioBlockSize);
  if (!aio.has_queue_depth()) aio.set_queue_depth(kDeepSpeedAioQueueDepth);
  zerotrain::DelayedUpdateConfig& delayed = *offload.mutable_delayed_update();
  if (!delayed.has_after_steps()) delayed.set_after_steps(kDelayedUpdateAfterSteps);

  ResourceConfig& resources = *spec->mutable_resources();
  if (resources.device() == ResourceConfig::DEVICE_KIND_UNSPECIFIED) {
    resources.set_device(ResourceConfig::CPU);
  }
}

}  // namespace zt
