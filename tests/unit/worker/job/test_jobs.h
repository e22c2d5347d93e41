// Job texts shared by the worker/job tests.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/job/job_defaults.h"
#include "worker/job/job_file.h"

namespace zt::testing {

// A complete job touching every section, so format comparisons cover every field kind:
// enums, int32, uint64, float, bool, repeated strings and nested messages.
inline constexpr char kFullYaml[] = R"(
name: full-job.1
model:
  family: LLAMA
  n_layer: 2
  n_head: 4
  n_kv_head: 2
  d_model: 64
  d_ff: 192
  vocab_size: 300
  max_seq_len: 128
  tie_embeddings: true
  norm_eps: 1.0e-6
  rope_theta: 500000
  init_from: base.safetensors
  init_std: 0.01
data:
  train: [a.bin, b.bin]
  val: c.bin
  seq_len: 64
  shuffle: true
  seed: 18446744073709551615
train:
  micro_batch_size: 4
  grad_accum_steps: 2
  max_steps: 10
  eval_interval: 5
  eval_steps: 3
  log_interval: 2
  seed: 42
optimizer:
  type: SGD
  lr: 0.1
  beta1: 0.8
  beta2: 0.95
  eps: 1.0e-7
  weight_decay: 0
  grad_clip: 0.5
  momentum: 0.9
  schedule:
    warmup_steps: 3
    decay: LINEAR
    min_lr_ratio: 0.25
  decay_all_parameters: true
  quant_block_size: 1024
  min_quantized_numel: 0
  adafactor:
    relative_step: true
    scale_parameter: false
    warmup_init: true
    decay_rate: -0.5
    clip_threshold: 2
    beta1: 0.9
    eps1: 1.0e-20
    eps2: 1.0e-2
precision:
  param_dtype: BF16
  compute_dtype: FP16
  grad_dtype: FP32
  reduce_dtype: BF16
  master_weights: true
  stochastic_rounding: true
  loss_scale:
    initial_power: 12
    window: 500
    hysteresis: 3
    min_scale: 0.5
    static_scale: 256
    max_overflows_at_min_scale: 7
    consecutive_hysteresis: true
memory:
  activation_checkpointing: EVERY_K
  checkpoint_every_k: 2
scheduling:
  priority: 5
  max_restarts: 2
parallel:
  world_size: 2
  zero_stage: 3
  shard_group_size: 2
  reshard_after_forward: true
  prefetch_units: 1
  bucket_bytes: 26214400
  comm_timeout_s: 300
  tensor_parallel: 1
  pipeline_parallel: 1
  sequence_parallel: false
  pipeline_schedule: GPIPE
  virtual_stages: 1
  micro_batches: 2
checkpoint:
  dir: ckpt
  interval_steps: 1000
  keep_last: 3
  on_save_error: FAIL
  save_optimizer: true
resources:
  device: CUDA
  cpu_threads: 3
  device_memory_bytes: 1073741824
offload:
  optimizer: CPU
  params: NVME
  nvme_path: /nvme
  pin_memory: true
  buffer_count: 6
  buffer_size: 8388608
  aio:
    block_size: 262144
    queue_depth: 16
  delayed_update:
    enabled: true
    after_steps: 10
)";

// The same job in JSON; 64-bit integers are strings, as protobuf's JSON mapping writes them.
inline constexpr char kFullJson[] = R"({
  "name": "full-job.1",
  "model": {"family": "LLAMA", "n_layer": 2, "n_head": 4, "n_kv_head": 2, "d_model": 64,
            "d_ff": 192, "vocab_size": 300, "max_seq_len": 128, "tie_embeddings": true,
            "norm_eps": 1e-6, "rope_theta": 500000, "init_from": "base.safetensors",
            "init_std": 0.01},
  "data": {"train": ["a.bin", "b.bin"], "val": ["c.bin"], "seq_len": 64, "shuffle": true,
           "seed": "18446744073709551615"},
  "train": {"micro_batch_size": 4, "grad_accum_steps": 2, "max_steps": 10, "eval_interval": 5,
            "eval_steps": 3, "log_interval": 2, "seed": "42"},
  "optimizer": {"type": "SGD", "lr": 0.1, "beta1": 0.8, "beta2": 0.95, "eps": 1e-7,
                "weight_decay": 0, "grad_clip": 0.5, "momentum": 0.9,
                "schedule": {"warmup_steps": 3, "decay": "LINEAR", "min_lr_ratio": 0.25},
                "decay_all_parameters": true, "quant_block_size": 1024,
                "min_quantized_numel": "0",
                "adafactor": {"relative_step": true, "scale_parameter": false,
                              "warmup_init": true, "decay_rate": -0.5, "clip_threshold": 2,
                              "beta1": 0.9, "eps1": 1e-20, "eps2": 1e-2}},
  "precision": {"param_dtype": "BF16", "compute_dtype": "FP16", "grad_dtype": "FP32",
                "reduce_dtype": "BF16", "master_weights": true, "stochastic_rounding": true,
                "loss_scale": {"initial_power": 12, "window": "500", "hysteresis": 3,
                               "min_scale": 0.5, "static_scale": 256,
                               "max_overflows_at_min_scale": "7",
                               "consecutive_hysteresis": true}},
  "memory": {"activation_checkpointing": "EVERY_K", "checkpoint_every_k": 2},
  "scheduling": {"priority": 5, "max_restarts": 2},
  "parallel": {"world_size": 2, "zero_stage": 3, "shard_group_size": 2,
               "reshard_after_forward": true, "prefetch_units": 1, "bucket_bytes": 26214400,
               "comm_timeout_s": 300, "tensor_parallel": 1, "pipeline_parallel": 1,
               "sequence_parallel": false, "pipeline_schedule": "GPIPE", "virtual_stages": 1,
               "micro_batches": 2},
  "checkpoint": {"dir": "ckpt", "interval_steps": 1000, "keep_last": 3, "on_save_error": "FAIL", "save_optimizer": true},
  "resources": {"device": "CUDA", "cpu_threads": 3, "device_memory_bytes": "1073741824"},
  "offload": {"optimizer": "CPU", "params": "NVME", "nvme_path": "/nvme", "pin_memory": true,
              "buffer_count": 6, "buffer_size": "8388608",
              "aio": {"block_size": "262144", "queue_depth": 16},
              "delayed_update": {"enabled": true, "after_steps": 10}}
})";

// The smallest job that validates once defaults are applied.
inline constexpr char kMinimalYaml[] = R"(
name: minimal
model: {family: GPT2, n_layer: 2, n_head: 4, d_model: 64, vocab_size: 256, max_seq_len: 64}
data: {train: [train.bin], seq_len: 32}
train: {micro_batch_size: 2, max_steps: 5}
optimizer: {lr: 1.0e-3}
)";

// Parses `yaml` (which must be valid) and applies the defaults.
inline zerotrain::JobSpec JobWithDefaults(const char* yaml) {
  absl::StatusOr<zerotrain::JobSpec> spec = ParseJobText(yaml, JobFormat::kYaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  zerotrain::JobSpec out = spec.ok() ? *spec : zerotrain::JobSpec();
  ApplyJobDefaults(&out);
  return out;
}

inline std::vector<std::string> Lines(const absl::Status& status) {
  return absl::StrSplit(std::string(status.message()), '\n');
}

}  // namespace zt::testing
