// The job the sharding and checkpoint tests train: a small GPT-2 on the pattern corpus whose
// units do not divide evenly into shards (the head, 64 elements, lies wholly in rank 0's
// shard at N = 4, so other ranks own empty ranges of it), 20 steps, one thread per rank.
#pragma once

#include <string>

#include "proto/job.pb.h"

namespace zt::testing {

inline zerotrain::JobSpec SmallShardedJob(const std::string& train_path, int world, int stage,
                                          int micro_batch, int accum = 1) {
  zerotrain::JobSpec job;
  job.set_name("small-sharded");
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::GPT2);
  m->set_n_layer(2);
  m->set_n_head(4);
  m->set_d_model(32);
  m->set_vocab_size(32);
  m->set_max_seq_len(16);
  job.mutable_data()->add_train(train_path);
  job.mutable_data()->set_seq_len(16);
  job.mutable_train()->set_micro_batch_size(micro_batch);
  job.mutable_train()->set_grad_accum_steps(accum);
  job.mutable_train()->set_max_steps(20);
  job.mutable_optimizer()->set_lr(3e-3f);
  job.mutable_optimizer()->set_grad_clip(1.0f);
  job.mutable_resources()->set_cpu_threads(1);
  job.mutable_parallel()->set_world_size(world);
  job.mutable_parallel()->set_zero_stage(stage);
  job.mutable_parallel()->set_comm_timeout_s(60);
  return job;
}

// The small job's model as Llama with GQA (4 query heads, 2 KV heads: split over 2
// tensor-parallel ranks, replicated over 4), d_ff 64 and an untied head over a vocabulary of
// 34 (which 4 ranks do not divide): what the tensor- and pipeline-parallel tests train beside
// GPT-2.
inline void MakeSmallGqaLlama(zerotrain::JobSpec& job) {
  auto* m = job.mutable_model();
  m->set_family(zerotrain::ModelConfig::LLAMA);
  m->set_n_kv_head(2);
  m->set_d_ff(64);
  m->set_vocab_size(34);
  m->set_tie_embeddings(false);
}

}  // namespace zt::testing
