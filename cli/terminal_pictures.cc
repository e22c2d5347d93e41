#include "cli/terminal_pictures.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/output_format.h"

namespace zt::cli {
namespace {

// ▁▂▃▄▅▆▇█ in UTF-8, lowest first.
constexpr std::array<const char*, 8> kLevels = {"\u2581", "\u2582", "\u2583", "\u2584",
                                                "\u2585", "\u2586", "\u2587", "\u2588"};
constexpr char kFull[] = "\u2588";   // █
constexpr char kEmpty[] = "\u2591";  // ░

// The categories in the order drawn: the device's, then the host's.
std::array<std::pair<const char*, int64_t>, 8> Categories(const zerotrain::MemoryByCategory& m) {
  return {{{"parameters", m.parameters()},
           {"gradients", m.gradients()},
           {"optimizer", m.optimizer()},
           {"activations", m.activations()},
           {"workspace", m.workspace()},
           {"communication", m.communication()},
           {"pinned_host", m.pinned_host()},
           {"nvme", m.nvme()}}};
}

}  // namespace

std::string Sparkline(const std::vector<double>& values, int width) {
  if (values.empty() || width <= 0) return "";
  const size_t n = std::min(values.size(), static_cast<size_t>(width));
  const auto first = values.end() - static_cast<std::ptrdiff_t>(n);
  double lo = INFINITY, hi = -INFINITY;
  for (auto it = first; it != values.end(); ++it) {
    if (!std::isfinite(*it)) continue;
    lo = std::min(lo, *it);
    hi = std::max(hi, *it);
  }
  std::string out;
  for (auto it = first; it != values.end(); ++it) {
    if (!std::isfinite(*it)) {
      out += '!';
    } else if (hi == lo) {
      out += kLevels[3];
    } else {
      const int level = static_cast<int>(std::lround((*it - lo) / (hi - lo) * 7));
      out += kLevels[std::clamp(level, 0, 7)];
    }
  }
  return out;
}

std::string FormatLossSparkline(const std::vector<double>& losses, int width) {
  if (losses.empty()) return "";
  auto tail = [](std::vector<double>::const_iterator first, const std::vector<double>& all) {
    return absl::StrFormat(" %.4f \u2192 %.4f (last %d steps)", *first, all.back(),
                           static_cast<int>(all.end() - first));
  };
  // "loss " and the tail take 5 + their columns (the arrow is one column, three bytes); the
  // figures are those of the steps drawn.
  const int room =
      std::max(8, width - 5 - static_cast<int>(tail(losses.begin(), losses).size() - 2));
  const auto first = losses.end() - static_cast<std::ptrdiff_t>(
                                        std::min(losses.size(), static_cast<size_t>(room)));
  return absl::StrCat("loss ", Sparkline(losses, room), tail(first, losses));
}

std::string FormatMemoryBars(const zerotrain::MemoryByCategory& measured,
                             const zerotrain::MemoryByCategory& plan, int width) {
  const auto used = Categories(measured);
  const auto planned = Categories(plan);
  struct Row {
    const char* category;
    int64_t bytes, budget;
    std::string figures;
  };
  std::vector<Row> rows;
  size_t widest = 0;  // figures, so every bar is as long and they line up
  for (size_t c = 0; c < used.size(); ++c) {
    const int64_t bytes = used[c].second, budget = planned[c].second;
    if (bytes == 0 && budget == 0) continue;
    std::string figures =
        budget > 0 ? absl::StrFormat("%s / %s  %4.0f%%", FormatBytes(bytes), FormatBytes(budget),
                                     100.0 * static_cast<double>(bytes) / budget)
                   : absl::StrCat(FormatBytes(bytes), " / no plan");
    widest = std::max(widest, figures.size());
    rows.push_back({used[c].first, bytes, budget, std::move(figures)});
  }
  // "  " + 14 for the category, "[", "]", 2 spaces before the figures.
  const int bar = std::max(10, width - 16 - 4 - static_cast<int>(widest));
  std::string out;
  for (const Row& row : rows) {
    const bool over = row.bytes > row.budget;
    const double share =
        row.budget > 0 ? std::min(1.0, static_cast<double>(row.bytes) / row.budget) : 1.0;
    const int filled = over ? bar - 1 : static_cast<int>(std::lround(share * bar));
    std::string drawn;
    for (int i = 0; i < filled; ++i) drawn += kFull;
    if (over) drawn += '!';
    for (int i = filled + (over ? 1 : 0); i < bar; ++i) drawn += kEmpty;
    absl::StrAppend(&out, absl::StrFormat("  %-14s[%s]  %*s\n", row.category, drawn,
                                          static_cast<int>(widest), row.figures));
  }
  return out;
}

std::string FormatTrainingPictures(const std::vector<double>& recent_loss,
                                   const zerotrain::Progress& progress, int width) {
  std::string out;
  const std::string loss = FormatLossSparkline(recent_loss, width);
  if (!loss.empty()) absl::StrAppend(&out, loss, "\n");
  const std::string bars = FormatMemoryBars(progress.memory(), progress.memory_plan(), width);
  if (!bars.empty()) absl::StrAppend(&out, "memory (rank 0, measured / plan)\n", bars);
  return out;
}

int TerminalColumns(int fd) {
  winsize w{};
  if (ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}

}  // namespace zt::cli
