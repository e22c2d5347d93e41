#include "cli/remote_format.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/output_format.h"

namespace zt::cli {
namespace {

using Row = std::vector<std::string>;

// Left-aligned columns two spaces apart, each as wide as its widest cell.
std::string Table(const std::vector<Row>& rows) {
  std::vector<size_t> widths;
  for (const Row& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const Row& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// "1.2k", "35.0", "12.3M": three significant digits for rates.
std::string Rate(double v) {
  if (!(v > 0)) return "-";
  if (v >= 1e6) return absl::StrFormat("%.1fM", v / 1e6);
  if (v >= 1e3) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrFormat("%.1f", v);
}

std::string Loss(const zerotrain::Progress& p) {
  return p.step() > 0 && std::isfinite(p.loss()) ? absl::StrFormat("%.4f", p.loss()) : "-";
}

std::string Steps(const zerotrain::Progress& p) {
  if (p.max_steps() <= 0) return p.step() > 0 ? absl::StrCat(p.step()) : "-";
  return absl::StrCat(p.step(), "/", p.max_steps());
}

// "2m31s", "1h04m": an ETA, finer than FormatAge for short waits.
std::string Eta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "-";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}

std::string Clock(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return absl::StrFormat("%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

std::string Placement(const zerotrain::Attempt& attempt) {
  std::vector<std::string> ranks;
  for (const zerotrain::RankPlacement& r : attempt.placement()) {
    ranks.push_back(absl::StrCat(r.rank(), "@", r.node_id(), ":", r.device()));
  }
  return ranks.empty() ? "not placed" : absl::StrJoin(ranks, ", ");
}

}  // namespace

std::string JobStateName(zerotrain::Job::State state) { return zerotrain::Job::State_Name(state); }

std::string FormatJobTable(const google::protobuf::RepeatedPtrField<zerotrain::JobSummary>& jobs,
                           int64_t now_ms) {
  std::vector<Row> rows = {{"ID", "STATE", "STEP", "LOSS", "TOK/S", "RANKS", "ATTEMPTS", "AGE"}};
  for (const zerotrain::JobSummary& job : jobs) {
    const int ranks = job.world_size();
    rows.push_back({job.id(), JobStateName(job.state()), Steps(job.progress()),
                    Loss(job.progress()), Rate(job.progress().tokens_per_s()),
                    ranks > 0 ? absl::StrCat(ranks) : "-", absl::StrCat(job.attempts()),
                    job.created_ms() > 0 ? FormatAge(now_ms - job.created_ms()) : "-"});
  }
  return Table(rows);
}

std::string FormatNodeTable(const google::protobuf::RepeatedPtrField<zerotrain::Node>& nodes,
                            int64_t now_ms) {
  std::vector<Row> rows = {
      {"ID", "HEALTHY", "DEVICES", "FREE/TOTAL", "MEMORY/DEVICE", "JOBS", "HEARTBEAT"}};
  for (const zerotrain::Node& node : nodes) {
    const int total = node.info().devices_size();
    // "8× NVIDIA H100 80GB HBM3 (sm 9.0)": devices grouped by what they are, in index order
    // of first appearance, so a job's `resources.device` can be matched at a glance.
    std::vector<std::pair<std::string, int>> kinds;
    for (const zerotrain::DeviceInfo& d : node.info().devices()) {
      // Unnamed devices by kind; an unset kind is a CPU device, as in a job's resources.
      std::string what = !d.name().empty()                            ? d.name()
                         : d.kind() == zerotrain::ResourceConfig::CUDA ? "CUDA"
                                                                        : "CPU";
      if (!d.compute_capability().empty()) absl::StrAppend(&what, " (sm ", d.compute_capability(), ")");
      auto same = std::find_if(kinds.begin(), kinds.end(),
                               [&](const auto& k) { return k.first == what; });
      if (same == kinds.end()) {
        kinds.emplace_back(what, 1);
      } else {
        ++same->second;
      }
    }
    std::vector<std::string> described;
    for (const auto& [what, count] : kinds) described.push_back(absl::StrCat(count, "× ", what));
    std::set<std::string> jobs;
    for (const zerotrain::RunningAttempt& a : node.running()) jobs.insert(a.job_id());
    int64_t smallest = 0;
    for (const zerotrain::DeviceInfo& d : node.info().devices()) {
      if (smallest == 0 || d.memory_bytes() < smallest) smallest = d.memory_bytes();
    }
    rows.push_back({node.info().id(), node.healthy() ? "yes" : "no",
                    described.empty() ? "-" : absl::StrJoin(described, ", "),
                    absl::StrCat(node.free_devices_size(), "/", total),
                    smallest > 0 ? FormatBytes(smallest) : "-",
                    jobs.empty() ? "-" : absl::StrJoin(jobs, ","),
                    node.last_heartbeat_ms() > 0
                        ? absl::StrCat(FormatAge(now_ms - node.last_heartbeat_ms()), " ago")
                        : "never"});
  }
  return Table(rows);
}

std::string FormatJobStatus(const zerotrain::Job& job, int64_t now_ms) {
  std::string out;
  auto field = [&](const std::string& label, const std::string& value) {
    absl::StrAppend(&out, absl::StrFormat("%-9s %s\n", label + ":", value));
  };
  field("job", job.id());
  field("state", JobStateName(job.state()));
  if (!job.spec().name().empty()) field("name", job.spec().name());
  if (job.created_ms() > 0)
    field("created", absl::StrCat(FormatAge(now_ms - job.created_ms()), " ago"));
  if (job.has_plan()) {
    const zerotrain::PlanCandidate& c = job.plan().chosen();
    std::string pinned = job.plan().pinned().empty()
                             ? "planner chose both"
                             : absl::StrCat("pinned: ", absl::StrJoin(job.plan().pinned(), ", "));
    field("plan",
          absl::StrFormat(
              "ZeRO stage %d, activation checkpointing %s, %s per rank on %d ranks (%s)",
              c.zero_stage(),
              zerotrain::MemoryConfig::ActivationCheckpointing_Name(c.activation_checkpointing()),
              FormatBytes(c.peak_bytes_per_rank()), job.plan().world_size(), pinned));
  }
  const zerotrain::Progress& p = job.progress();
  if (p.step() > 0) {
    field("progress",
          absl::StrCat("step ", Steps(p), ", loss ", Loss(p), ", ", Rate(p.tokens_per_s()),
                       " tok/s, memory ", FormatBytes(p.memory_bytes())));
  }
  for (const zerotrain::Attempt& a : job.attempts()) {
    std::string line = absl::StrCat("#", a.number(), " ", Placement(a));
    if (a.resumed_from_step() > 0)
      absl::StrAppend(&line, ", resumed from step ", a.resumed_from_step());
    if (a.ended_ms() > 0 && a.started_ms() > 0) {
      absl::StrAppend(&line, ", ran ", FormatAge(a.ended_ms() - a.started_ms()));
    }
    absl::StrAppend(&line, a.end_reason().empty() ? (a.ended_ms() > 0 ? ", ended" : ", running")
                                                  : absl::StrCat(", ended: ", a.end_reason()));
    field("attempt", line);
  }
  if (!job.failure_reason().empty()) field("failure", job.failure_reason());
  if (!job.run_dir().empty()) field("run dir", job.run_dir());
  return out;
}

std::string FormatProgressLine(const zerotrain::Progress& p, int width) {
  std::string head = absl::StrCat("step ", Steps(p));
  std::string tail = absl::StrCat("loss ", Loss(p), "  ", Rate(p.tokens_per_s()), " tok/s");
  if (p.memory_bytes() > 0) absl::StrAppend(&tail, "  mem ", FormatBytes(p.memory_bytes()));
  const int64_t left = p.max_steps() - p.step();
  absl::StrAppend(&tail, "  ETA ",
                  p.max_steps() > 0 && p.step_ms() > 0 ? Eta(left * p.step_ms() / 1000.0) : "-");
  if (p.max_steps() > 0) {
    const double done = std::clamp(static_cast<double>(p.step()) / p.max_steps(), 0.0, 1.0);
    const std::string percent = absl::StrFormat("%3d%%", static_cast<int>(done * 100));
    // "head [bar] percent  tail": the bar gets the columns the text leaves.
    const int bar = width - static_cast<int>(head.size() + percent.size() + tail.size()) - 6;
    if (bar >= 10) {
      const int filled = static_cast<int>(done * bar);
      head = absl::StrCat(head, " [", std::string(filled, '#'), std::string(bar - filled, '.'),
                          "] ", percent);
    } else {
      head = absl::StrCat(head, " ", percent);
    }
  }
  std::string line = absl::StrCat(head, "  ", tail);
  if (width > 0 && static_cast<int>(line.size()) > width) line.resize(width);
  return line;
}

std::string FormatEventLine(const zerotrain::JobEvent& event) {
  std::string line = absl::StrCat("[", Clock(event.time_ms()), "] ", JobStateName(event.state()));
  // A progress event's message ("step 7/300") says less than its progress line.
  if (event.has_progress()) {
    absl::StrAppend(&line, ": ", FormatProgressLine(event.progress(), 0));
  } else if (!event.message().empty()) {
    absl::StrAppend(&line, ": ", event.message());
  }
  return line;
}

}  // namespace zt::cli
