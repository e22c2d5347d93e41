#include "worker/optim/loss_scaler.h"

#include "gtest/gtest.h"

namespace zt {
namespace {

TEST(LossScalerTest, StartsAtTwoToTheInitialPower) {
  LossScaler s({.initial_power = 16});
  EXPECT_EQ(s.scale(), 65536.0);
}

TEST(LossScalerTest, HysteresisDelaysTheBackOff) {
  LossScaler s({.initial_power = 10, .window = 1000, .hysteresis = 2});
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 1024.0);  // first overflow spends hysteresis
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 512.0);  // second in a row halves
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 256.0);  // hysteresis stays spent until a clean step
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 128.0);  // DeepSpeed's default: one clean step does not restore it
  EXPECT_EQ(s.skipped_steps(), 4);
}

TEST(LossScalerTest, ConsecutiveHysteresisRestoresOnACleanStep) {
  LossScaler s({.initial_power = 10, .hysteresis = 2, .consecutive_hysteresis = true});
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 512.0);
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 512.0);  // restored by the clean step: this overflow spends it
}

TEST(LossScalerTest, GrowingRestoresHysteresis) {
  LossScaler s({.initial_power = 10, .window = 2, .hysteresis = 2});
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 512.0);
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 1024.0);
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 1024.0);  // hysteresis was restored with the growth
}

TEST(LossScalerTest, GrowsAfterACleanWindow) {
  LossScaler s({.initial_power = 4, .window = 3, .hysteresis = 1});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 16.0);
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 32.0);
  ASSERT_TRUE(s.Update(true).ok());  // overflow resets the window
  EXPECT_EQ(s.scale(), 16.0);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 16.0);
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 32.0);
}

TEST(LossScalerTest, NeverBelowMinScale) {
  LossScaler s({.initial_power = 2, .hysteresis = 1, .min_scale = 2});
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 2.0);
  ASSERT_TRUE(s.Update(true).ok());
  EXPECT_EQ(s.scale(), 2.0);
}

TEST(LossScalerTest, FailsInsteadOfLoopingAtMinScale) {
  LossScaler s({.initial_power = 0, .hysteresis = 1, .min_scale = 1,
                .max_overflows_at_min_scale = 3});
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(true).ok());
  const absl::Status st = s.Update(true);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("min_scale"), std::string::npos);
}

TEST(LossScalerTest, StaticScaleNeverMoves) {
  LossScaler s({.static_scale = 128, .max_overflows_at_min_scale = 1});
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s.Update(i % 2 == 0).ok());
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.skipped_steps(), 3);
}

}  // namespace
}  // namespace zt
