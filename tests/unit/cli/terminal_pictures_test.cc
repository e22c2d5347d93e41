// Tests of cli/terminal_pictures.h: the loss sparkline and the memory bars `zt status` and
// `zt watch` draw on a terminal.
#include "cli/terminal_pictures.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace zt::cli {
namespace {

// Display columns of UTF-8 text: one per code point (the block characters are one column).
int Columns(const std::string& text) {
  int n = 0;
  for (const unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

TEST(SparklineTest, LowestToHighestMapToTheEighthBlocks) {
  EXPECT_EQ(Sparkline({0, 1, 2, 3, 4, 5, 6, 7}, 80), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(Sparkline({7, 0}, 80), "█▁");
}

TEST(SparklineTest, KeepsTheLastWidthValues) {
  EXPECT_EQ(Sparkline({100, 0, 1}, 2), "▁█") << "the 100 is left out, so 0..1 is the range";
}

TEST(SparklineTest, EqualValuesAreMidHeightAndNonFiniteOnesShow) {
  EXPECT_EQ(Sparkline({2, 2, 2}, 10), "▄▄▄");
  EXPECT_EQ(Sparkline({1, NAN, 2, INFINITY}, 10), "▁!█!");
  EXPECT_EQ(Sparkline({}, 10), "");
  EXPECT_EQ(Sparkline({1}, 0), "");
}

TEST(FormatLossSparklineTest, FirstAndLastLossBesideTheCurveWithinTheWidth) {
  std::vector<double> losses;
  for (int i = 0; i < 200; ++i) losses.push_back(4.0 - i * 0.01);
  const std::string line = FormatLossSparkline(losses, 60);
  EXPECT_EQ(line.rfind("loss ▇", 0) == 0 || line.rfind("loss █", 0) == 0, true) << line;
  // As many as fit beside "loss " and the figures (22 here), which are those of the first
  // and last loss drawn: step 178's 4 - 1.78 and step 199's.
  EXPECT_EQ(line, "loss " + Sparkline(losses, 22) + " 2.2200 → 2.0100 (last 22 steps)");
  EXPECT_LE(Columns(line), 60) << line;
  EXPECT_EQ(FormatLossSparkline({}, 60), "");
}

TEST(FormatMemoryBarsTest, ShareOfThePlanPerCategoryAndOverThePlanMarked) {
  zerotrain::MemoryByCategory measured, plan;
  plan.set_parameters(2 << 20);
  measured.set_parameters(1 << 20);
  plan.set_activations(1 << 20);
  measured.set_activations((1 << 20) + (1 << 18));
  plan.set_pinned_host(4 << 20);
  const std::string text = FormatMemoryBars(measured, plan, 70);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << text << "categories with neither plan nor measure are left out";
  EXPECT_EQ(lines[0].rfind("  parameters", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("1.00 MiB / 2.00 MiB    50%"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[1].rfind("  activations", 0), 0u) << lines[1];
  EXPECT_NE(lines[1].find("!]"), std::string::npos) << "over the plan: " << lines[1];
  EXPECT_NE(lines[1].find("125%"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2].rfind("  pinned_host", 0), 0u) << "host after device: " << lines[2];
  for (const std::string& line : lines) EXPECT_LE(Columns(line), 70) << line;
  // Half the plan: half the bar full.
  const size_t open = lines[0].find('['), close = lines[0].find(']');
  const std::string bar = lines[0].substr(open + 1, close - open - 1);
  int full = 0, empty = 0;
  for (size_t i = 0; i < bar.size(); i += 3) (bar.compare(i, 3, "█") == 0 ? full : empty)++;
  EXPECT_EQ(full, empty) << bar;
  EXPECT_EQ(FormatMemoryBars({}, {}, 70), "");
}

TEST(FormatTrainingPicturesTest, LossThenMemoryUnderAHeading) {
  zerotrain::Progress progress;
  progress.mutable_memory()->set_parameters(1 << 20);
  progress.mutable_memory_plan()->set_parameters(1 << 20);
  const std::string text = FormatTrainingPictures({3.0, 2.0}, progress, 80);
  const std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_EQ(lines[0], "loss █▁ 3.0000 → 2.0000 (last 2 steps)");
  EXPECT_EQ(lines[1], "memory (rank 0, measured / plan)");
  EXPECT_EQ(lines[2].rfind("  parameters", 0), 0u);
  EXPECT_EQ(FormatTrainingPictures({}, zerotrain::Progress(), 80), "");
}

}  // namespace
}  // namespace zt::cli
