#include "worker/optim/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"

namespace zt {
namespace {

zerotrain::OptimizerConfig Config(zerotrain::OptimizerConfig::Decay decay) {
  zerotrain::OptimizerConfig c;
  c.set_lr(1.0f);
  c.mutable_schedule()->set_warmup_steps(10);
  c.mutable_schedule()->set_decay(decay);
  c.mutable_schedule()->set_min_lr_ratio(0.1f);
  return c;
}

TEST(LrScheduleTest, WarmupIsLinearFromTheFirstStep) {
  const auto c = Config(zerotrain::OptimizerConfig::COSINE);
  EXPECT_FLOAT_EQ(LearningRate(c, 0, 110), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(c, 4, 110), 0.5f);
  EXPECT_FLOAT_EQ(LearningRate(c, 9, 110), 1.0f);
}

TEST(LrScheduleTest, CosineAndLinearEndAtTheFloor) {
  for (auto d : {zerotrain::OptimizerConfig::COSINE, zerotrain::OptimizerConfig::LINEAR}) {
    const auto c = Config(d);
    EXPECT_FLOAT_EQ(LearningRate(c, 10, 110), 1.0f);
    EXPECT_NEAR(LearningRate(c, 109, 110), 0.1f, 1e-6);
    EXPECT_NEAR(LearningRate(c, 500, 110), 0.1f, 1e-6);  // past the end: stays at the floor
  }
  // Step 59 is 49/99 of the way through the decay (steps 10..109).
  const double progress = 49.0 / 99.0;
  EXPECT_NEAR(LearningRate(Config(zerotrain::OptimizerConfig::COSINE), 59, 110),
              0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * progress)), 1e-6);
  EXPECT_NEAR(LearningRate(Config(zerotrain::OptimizerConfig::LINEAR), 59, 110),
              0.1 + 0.9 * (1 - progress), 1e-6);
}

TEST(LrScheduleTest, ConstantStaysAtPeak) {
  const auto c = Config(zerotrain::OptimizerConfig::CONSTANT);
  EXPECT_FLOAT_EQ(LearningRate(c, 50, 110), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(c, 109, 110), 1.0f);
}

}  // namespace
}  // namespace zt
