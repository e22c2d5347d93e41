// What the remote verbs print for people: tables of jobs and nodes, a job's status block,
// event lines and the live progress line of `zt watch`. Pure functions of the messages and
// the current time (Unix ms), thread-safe; no gRPC, so tests need no daemon.
#pragma once

#include <cstdint>
#include <string>

#include "google/protobuf/repeated_field.h"
#include "proto/control.pb.h"

namespace zt::cli {

// "RUNNING", "SUCCEEDED", ...
std::string JobStateName(zerotrain::Job::State state);

// One header line and one line per job: id, state, step/total, loss, tokens/s, ranks,
// attempts, age (since created_ms). Columns are as wide as their widest cell; missing
// values print "-".
std::string FormatJobTable(const google::protobuf::RepeatedPtrField<zerotrain::JobSummary>& jobs,
                           int64_t now_ms);

// One header line and one line per node: id, healthy, devices free/total, memory per device
// (the smallest), running jobs, last heartbeat age.
std::string FormatNodeTable(const google::protobuf::RepeatedPtrField<zerotrain::Node>& nodes,
                            int64_t now_ms);

// A readable block: id, state, name, age, the plan chosen, progress, every attempt with its
// placement (rank@node:device) and end reason, and the failure reason. Ends with a newline.
std::string FormatJobStatus(const zerotrain::Job& job, int64_t now_ms);

// The live line of a running job, at most `width` columns (the terminal's):
//   "step 120/300 [#######.......]  40%  loss 2.4531  1.2k tok/s  mem 650 MiB  ETA 2m31s"
// The bar takes what the text leaves (none below 10 columns); ETA from step_ms and the steps
// left ("-" when unknown). Without max_steps no bar or percentage.
std::string FormatProgressLine(const zerotrain::Progress& progress, int width);

// One line for an event that is not progress, or a progress line without a bar (for logs):
//   "[12:03:04] RUNNING: placed on node-a:0-1"
// Time in UTC.
std::string FormatEventLine(const zerotrain::JobEvent& event);

}  // namespace zt::cli
