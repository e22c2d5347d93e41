#include "daemon/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace zt {
namespace {

struct Candidate {
  const SchedulerNode* node;
  std::vector<int32_t> devices;  // qualifying, ascending index
  // How many of them the job may use: whole shard groups only with hybrid sharding.
  int32_t usable = 0;
};

std::vector<Candidate> Qualifying(const SchedulerJob& job,
                                  const std::vector<SchedulerNode>& nodes) {
  const bool hybrid = job.shard_group_size > 0 && job.shard_group_size < job.world_size;
  std::vector<Candidate> out;
  for (const SchedulerNode& node : nodes) {
    Candidate c{&node, {}, 0};
    for (const SchedulerDevice& d : node.devices) {
      if (d.kind == job.device_kind && d.memory_bytes >= job.device_memory_bytes) {
        c.devices.push_back(d.index);
      }
    }
    std::sort(c.devices.begin(), c.devices.end());
    const int32_t n = static_cast<int32_t>(c.devices.size());
    c.usable = hybrid ? n / job.shard_group_size * job.shard_group_size : n;
    if (c.usable > 0) out.push_back(std::move(c));
  }
  return out;
}

const char* KindName(zerotrain::ResourceConfig::DeviceKind kind) {
  return kind == zerotrain::ResourceConfig::CUDA ? "CUDA" : "CPU";
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

std::optional<JobPlacement> PlaceJob(const SchedulerJob& job,
                                     const std::vector<SchedulerNode>& nodes) {
  std::vector<Candidate> candidates = Qualifying(job, nodes);
  std::vector<const Candidate*> chosen;
  const Candidate* single = nullptr;
  for (const Candidate& c : candidates) {
    if (c.usable < job.world_size) continue;
    if (single == nullptr || c.usable < single->usable ||
        (c.usable == single->usable && c.node->id < single->node->id)) {
      single = &c;
    }
  }
  if (single != nullptr) {
    chosen.push_back(single);
  } else {
    std::vector<const Candidate*> order;
    for (const Candidate& c : candidates) order.push_back(&c);
    std::sort(order.begin(), order.end(), [](const Candidate* a, const Candidate* b) {
      if (a->usable != b->usable) return a->usable > b->usable;
      return a->node->id < b->node->id;
    });
    int64_t total = 0;
    for (const Candidate* c : order) {
      if (total >= job.world_size) break;
      chosen.push_back(c);
      total += c->usable;
    }
    if (total < job.world_size) return std::nullopt;
  }
  JobPlacement placement{job.id, {}};
  int32_t rank = 0;
  for (const Candidate* c : chosen) {
    for (int32_t i = 0; i < c->usable && rank < job.world_size; ++i, ++rank) {
      zerotrain::RankPlacement& p = placement.ranks.emplace_back();
      p.set_rank(rank);
      p.set_node_id(c->node->id);
      p.set_device(c->devices[i]);
    }
  }
  return placement;
}

std::vector<JobPlacement> ScheduleJobs(const std::vector<SchedulerJob>& queued,
                                       const std::vector<SchedulerNode>& free) {
  std::vector<const SchedulerJob*> order;
  for (const SchedulerJob& job : queued) order.push_back(&job);
  std::stable_sort(order.begin(), order.end(), [](const SchedulerJob* a, const SchedulerJob* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->order < b->order;
  });
  std::vector<SchedulerNode> nodes = free;
  std::vector<JobPlacement> placements;
  for (const SchedulerJob* job : order) {
    std::optional<JobPlacement> placement = PlaceJob(*job, nodes);
    if (!placement.has_value()) break;
    for (const zerotrain::RankPlacement& p : placement->ranks) {
      for (SchedulerNode& node : nodes) {
        if (node.id != p.node_id()) continue;
        std::erase_if(node.devices,
                      [&](const SchedulerDevice& d) { return d.index == p.device(); });
      }
    }
    placements.push_back(*std::move(placement));
  }
  return placements;
}

std::optional<std::string> NeverFits(const SchedulerJob& job,
                                     const std::vector<SchedulerNode>& all) {
  if (PlaceJob(job, all).has_value()) return std::nullopt;
  std::vector<Candidate> candidates = Qualifying(job, all);
  std::vector<std::string> per_node;
  int64_t usable = 0;
  for (const Candidate& c : candidates) {
    per_node.push_back(absl::StrCat(c.node->id, ": ", c.usable));
    usable += c.usable;
  }
  std::string groups;
  if (job.shard_group_size > 0 && job.shard_group_size < job.world_size) {
    groups = absl::StrCat(" in whole shard groups of ", job.shard_group_size, " per node");
  }
  return absl::StrCat(
      "needs ", job.world_size, " ", KindName(job.device_kind), " devices of ≥ ",
      FormatBytes(job.device_memory_bytes), groups, "; the registered nodes have ", usable,
      " such devices",
      per_node.empty() ? "" : absl::StrCat(" (", absl::StrJoin(per_node, ", "), ")"));
}

}  // namespace zt
