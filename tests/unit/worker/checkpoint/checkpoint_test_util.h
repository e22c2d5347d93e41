// Helpers shared by the checkpoint tests: scratch paths, tiny model configs, seeded parameter
// buffers and the float64 reference of 16-bit rounding.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/job.pb.h"
#include "worker/model/param_layout.h"

namespace zt::testing_util {

// A fresh, empty directory for one test; removed when the object goes away.
class ScratchDir {
 public:
  ScratchDir() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           (std::string("zt_ckpt_") + info->test_suite_name() + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~ScratchDir() { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& file) const { return (dir_ / file).string(); }

 private:
  std::filesystem::path dir_;
};

// GPT-2 with every field set: 2 blocks, C = 16, 4 heads, F = 4C, V = 11, P = 7.
inline zerotrain::ModelConfig TinyGpt2(bool tied) {
  zerotrain::ModelConfig m;
  m.set_family(zerotrain::ModelConfig::GPT2);
  m.set_n_layer(2);
  m.set_n_head(4);
  m.set_n_kv_head(4);
  m.set_d_model(16);
  m.set_d_ff(64);
  m.set_vocab_size(11);
  m.set_max_seq_len(7);
  m.set_tie_embeddings(tied);
  return m;
}

// Llama with grouped KV heads: 2 blocks, C = 16, 4 query heads sharing 2 KV heads (D = 4),
// F = 24, V = 13.
inline zerotrain::ModelConfig TinyLlama(bool tied) {
  zerotrain::ModelConfig m;
  m.set_family(zerotrain::ModelConfig::LLAMA);
  m.set_n_layer(2);
  m.set_n_head(4);
  m.set_n_kv_head(2);
  m.set_d_model(16);
  m.set_d_ff(24);
  m.set_vocab_size(13);
  m.set_max_seq_len(9);
  m.set_tie_embeddings(tied);
  return m;
}

// One buffer per unit, filled with seeded values of magnitude in [0.01, 2): inside f16's
// normal range, so its rounding reference below needs no subnormal case.
struct UnitBuffers {
  std::vector<std::vector<float>> data;

  UnitBuffers(const ModelLayout& layout, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> mag(0.01f, 2.0f);
    std::bernoulli_distribution neg(0.5);
    for (const UnitLayout& u : layout.units) {
      std::vector<float>& b = data.emplace_back(u.numel);
      for (float& v : b) v = neg(rng) ? -mag(rng) : mag(rng);
    }
  }
  std::vector<float*> Mutable() {
    std::vector<float*> p;
    for (auto& b : data) p.push_back(b.data());
    return p;
  }
  std::vector<const float*> Const() const {
    std::vector<const float*> p;
    for (const auto& b : data) p.push_back(b.data());
    return p;
  }
};

// x rounded to `bits` significant bits, to nearest with ties to even, computed in float64
// (exact: the scaled value has at most 53 bits). 8 bits is bf16, 11 bits an f16 normal.
inline double RoundToSignificantBits(double x, int bits) {
  if (x == 0.0) return x;
  int e;
  std::frexp(x, &e);  // |x| = m·2^e, m in [0.5, 1)
  const double scale = std::ldexp(1.0, bits - e);
  return std::nearbyint(x * scale) / scale;
}

}  // namespace zt::testing_util
