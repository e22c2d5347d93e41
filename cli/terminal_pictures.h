// Pictures `zt status` and `zt watch` draw when their output is a terminal: the recent loss as a
// sparkline and memory by category as bars against the plan. Pure functions of values to text
// (UTF-8 block characters), thread-safe; `--json` and output that is not a terminal never use
// them, so scripts see the same text as before.
#pragma once

#include <string>
#include <vector>

#include "proto/control.pb.h"

namespace zt::cli {

// One character per value, ▁ (the smallest) to █ (the largest) between the finite values' min
// and max; all equal: ▄. The last `width` values when there are more. A non-finite value is
// '!' (a diverged loss must show). Empty for no values or width ≤ 0.
std::string Sparkline(const std::vector<double>& values, int width);

// "loss ▇▆▅▄▃▃▂▁ 3.4521 → 2.1034 (last 64 steps)" in at most `width` columns; empty for
// no losses.
std::string FormatLossSparkline(const std::vector<double>& losses, int width);

// One line per category with a plan or a measurement, device categories first, then host
// (pinned, NVMe):
//   "  parameters     [██████████░░░░]  1.50 MiB / 2.00 MiB   75%"
// The bar is the measured high-water mark as a share of the category's plan, `width` columns
// in all (at least 10 for the bar); over the plan the bar is full and ends in '!'. Empty when
// nothing is planned or measured.
std::string FormatMemoryBars(const zerotrain::MemoryByCategory& measured,
                             const zerotrain::MemoryByCategory& plan, int width);

// The block `zt status` and `zt watch` draw: the loss sparkline, then "memory (rank 0,
// measured / plan)" and its bars, from `progress` (Progress.memory, memory_plan). Empty
// when there is neither a loss nor a memory figure.
std::string FormatTrainingPictures(const std::vector<double>& recent_loss,
                                   const zerotrain::Progress& progress, int width);

// The columns of the terminal `fd` is, 80 when it is none or does not say.
int TerminalColumns(int fd);

}  // namespace zt::cli
