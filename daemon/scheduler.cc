#include "daemon/scheduler.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace zt {
namespace {

// A node with devices the job can use. Found by counting alone: building the device list of
// every node of a 10,000-node registry on each placement cost more than the rest of SubmitJob.
struct Candidate {
  const SchedulerNode* node;
  // How many of its qualifying devices the job may use: whole shard groups only with hybrid
  // sharding.
  int32_t usable = 0;
};

bool Qualifies(const SchedulerJob& job, const SchedulerDevice& d) {
  return d.kind == job.device_kind && d.memory_bytes >= job.device_memory_bytes;
}

// The node's devices that qualify for `job`, counted from its capacity summary where that
// decides it.
int32_t QualifyingCount(const SchedulerJob& job, const SchedulerNode& node) {
  const size_t kind = static_cast<size_t>(job.device_kind);
  if (node.summarized && kind < node.capacity.size()) {
    const KindCapacity& c = node.capacity[kind];
    if (c.count == 0) return 0;
    if (c.smallest_memory_bytes >= job.device_memory_bytes) return c.count;
  }
  int32_t n = 0;
  for (const SchedulerDevice& d : node.devices) n += Qualifies(job, d) ? 1 : 0;
  return n;
}

std::vector<Candidate> Qualifying(const SchedulerJob& job,
                                  const std::vector<SchedulerNode>& nodes) {
  const bool hybrid = job.shard_group_size > 0 && job.shard_group_size < job.world_size;
  std::vector<Candidate> out;
  for (const SchedulerNode& node : nodes) {
    const int32_t n = QualifyingCount(job, node);
    const int32_t usable = hybrid ? n / job.shard_group_size * job.shard_group_size : n;
    if (usable > 0) out.push_back(Candidate{&node, usable});
  }
  return out;
}

// The qualifying devices of a chosen node, ascending index.
std::vector<int32_t> QualifyingDevices(const SchedulerJob& job, const SchedulerNode& node) {
  std::vector<int32_t> devices;
  for (const SchedulerDevice& d : node.devices) {
    if (Qualifies(job, d)) devices.push_back(d.index);
  }
  std::sort(devices.begin(), devices.end());
  return devices;
}

const char* KindName(zerotrain::ResourceConfig::DeviceKind kind) {
  return kind == zerotrain::ResourceConfig::CUDA ? "CUDA" : "CPU";
}

}  // namespace

void SummarizeCapacity(SchedulerNode& node) {
  node.capacity = {};
  for (const SchedulerDevice& d : node.devices) {
    const size_t kind = static_cast<size_t>(d.kind);
    if (kind >= node.capacity.size()) continue;  // a kind unknown here: left to the scan
    KindCapacity& c = node.capacity[kind];
    c.smallest_memory_bytes =
        c.count == 0 ? d.memory_bytes : std::min(c.smallest_memory_bytes, d.memory_bytes);
    ++c.count;
  }
  node.summarized = true;
}

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
    const std::vector<int32_t> devices = QualifyingDevices(job, *c->node);
    for (int32_t i = 0; i < c->usable && rank < job.world_size; ++i, ++rank) {
      zerotrain::RankPlacement& p = placement.ranks.emplace_back();
      p.set_rank(rank);
      p.set_node_id(c->node->id);
      p.set_device(devices[i]);
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
  // The first job places on `free` itself; only a pass that goes on to a second job copies
  // the nodes to take the first one's devices out (a SubmitJob's pass usually has one job,
  // and copying 10,000 nodes cost more than placing it).
  const std::vector<SchedulerNode>* nodes = &free;
  std::vector<SchedulerNode> remaining;
  std::unordered_map<std::string, size_t> position;  // of a node in `remaining`, by id
  std::vector<JobPlacement> placements;
  for (size_t j = 0; j < order.size(); ++j) {
    std::optional<JobPlacement> placement = PlaceJob(*order[j], *nodes);
    if (!placement.has_value()) break;
    if (j + 1 < order.size()) {
      if (nodes == &free) {
        remaining = free;
        for (size_t i = 0; i < remaining.size(); ++i) position.emplace(remaining[i].id, i);
        nodes = &remaining;
      }
      for (const zerotrain::RankPlacement& p : placement->ranks) {
        SchedulerNode& node = remaining[position.at(p.node_id())];
        std::erase_if(node.devices,
                      [&](const SchedulerDevice& d) { return d.index == p.device(); });
        if (node.summarized) SummarizeCapacity(node);
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
