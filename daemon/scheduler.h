// Gang placement: which devices the ranks of queued jobs run on. Pure functions of their
// arguments (thread-safe); the coordinator calls them under its lock.
//
// Policy:
//   - A job gets all its ranks placed or none.
//   - Order: higher priority first; equal priorities in submission order (strict FIFO). The
//     first job that cannot be placed now ends the pass: nothing behind it is placed, so a big
//     job is never starved by a stream of small ones (no backfill).
//   - A device can hold one rank; it qualifies for a job when its kind is the job's and its
//     memory is at least the job's device_memory_bytes.
//   - Ranks are packed onto as few nodes as possible: one node when any node has enough
//     qualifying devices (the one with the fewest that suffice, ties by node id), otherwise
//     nodes by descending qualifying count (ties by node id). Consecutive ranks go to one node,
//     devices by ascending index. With hybrid sharding (shard_group_size < world_size) a node
//     takes whole groups only, so a shard group never spans nodes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/control.pb.h"
#include "proto/job.pb.h"

namespace zt {

struct SchedulerJob {
  std::string id;
  int32_t priority = 0;
  // Submission order (smaller: earlier).
  int64_t order = 0;
  int32_t world_size = 1;
  // Ranks per shard group (world_size when the job does not use hybrid sharding).
  int32_t shard_group_size = 1;
  zerotrain::ResourceConfig::DeviceKind device_kind = zerotrain::ResourceConfig::CPU;
  // Device memory a rank needs: the plan's per-rank peak plus its safety margin.
  int64_t device_memory_bytes = 0;
};

struct SchedulerDevice {
  int32_t index = 0;
  zerotrain::ResourceConfig::DeviceKind kind = zerotrain::ResourceConfig::CPU;
  int64_t memory_bytes = 0;
};

// How many devices of one kind a node has, and the smallest one's memory.
struct KindCapacity {
  int32_t count = 0;
  int64_t smallest_memory_bytes = 0;
};

struct SchedulerNode {
  std::string id;
  // Free devices for ScheduleJobs; every device for NeverFits.
  std::vector<SchedulerDevice> devices;
  // `devices` summed up by kind (index: the DeviceKind's number), set by SummarizeCapacity.
  // Placement reads it in place of the device list when every device of the job's kind is
  // large enough (the usual case: a node's GPUs are alike), so a scan of 10,000 nodes stays
  // in one contiguous array instead of visiting 10,000 device lists. Nodes never summarized
  // are scanned device by device.
  std::array<KindCapacity, 3> capacity{};
  bool summarized = false;
};

// Sets node.capacity from node.devices (call after every change to them).
void SummarizeCapacity(SchedulerNode& node);

struct JobPlacement {
  std::string job_id;
  // Rank r at index r.
  std::vector<zerotrain::RankPlacement> ranks;
};

// The placements of one scheduling pass over `queued` (any order) on the nodes' free devices.
std::vector<JobPlacement> ScheduleJobs(const std::vector<SchedulerJob>& queued,
                                       const std::vector<SchedulerNode>& free);

// Where the ranks of `job` would go on `nodes`' devices, or nullopt when they do not fit.
std::optional<JobPlacement> PlaceJob(const SchedulerJob& job,
                                     const std::vector<SchedulerNode>& nodes);

// nullopt when `job` fits on `all` (every device of every registered node, busy or not);
// otherwise why not, with the numbers: "needs 4 CPU devices of ≥ 2.10 GiB; the registered
// nodes have 3 such devices (node-a: 2, node-b: 1)".
std::optional<std::string> NeverFits(const SchedulerJob& job,
                                     const std::vector<SchedulerNode>& all);

// "2.10 GiB".
std::string FormatBytes(int64_t bytes);

}  // namespace zt
