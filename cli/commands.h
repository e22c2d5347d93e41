// The verbs of `zt`, separated from argument parsing (main.cc) so each is a plain function
// of its flags that returns a status.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/control.pb.h"

namespace zt::cli {

struct TrainFlags {
  std::string job_file;
  // A DeepSpeed ds_config.json laid over the job file (worker/job/deepspeed_config.h).
  std::string deepspeed;
  int64_t stop_after_step = -1;  // < 0: run to train.max_steps
  std::string run_dir;
  std::string export_path;
  std::string export_dtype = "fp32";
  int64_t sample_tokens = 0;
  std::string tokenizer = "bytes";
  std::string prompt = "\n";
  bool quiet = false;
  // The ranks this process runs, "A" or "A-B" (inclusive); empty: every rank of the job.
  std::string ranks;
  // Directory of the rendezvous store shared with the processes running the other ranks;
  // required when `ranks` is not every rank.
  std::string rendezvous;
  // Continue from the latest checkpoint of `resume_dir` (empty: the job's checkpoint.dir).
  bool resume = false;
  std::string resume_dir;
  // With resume: fall back to the newest older checkpoint that verifies.
  bool fallback = false;
};
absl::Status RunTrain(const TrainFlags& flags);

struct PrepareFlags {
  std::vector<std::string> inputs;
  std::string tokenizer;
  std::string out;
  std::string val_out;
  double val_fraction = 0.1;
  // "text" or "jsonl" (documents with a loss mask, worker/data/prepare.h).
  std::string format = "text";
};
absl::Status RunPrepare(const PrepareFlags& flags);

struct EstimateFlags {
  std::string job_file;
  // A DeepSpeed ds_config.json laid over the job file; its batch rule uses world_size when set.
  std::string deepspeed;
  int world_size = 0;   // 0: the job's parallel.world_size
  int zero_stage = -1;  // < 0: the job's parallel.zero_stage (with plan: pins it)
  bool json = false;
  // Print the sharding planner's choice and every candidate instead of one memory plan.
  bool plan = false;
  // With plan: bytes, or a size like "16GiB" (cli/output_format.h); empty: this machine's
  // MemAvailable divided among the ranks.
  std::string device_memory;
};
// Dispatches to RunEstimatePlan with flags.plan.
absl::Status RunEstimate(const EstimateFlags& flags);
absl::Status RunEstimatePlan(const EstimateFlags& flags);

struct ExportFlags {
  // A checkpoint.dir (its `latest` step is exported) or one step directory.
  std::string checkpoint;
  std::string format = "hf";
  std::string out;
  // fp32, bf16 or fp16; empty: fp32, or for a merged LoRA model the base's own dtype.
  std::string dtype;
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  // A LoRA job's checkpoint: the merged model (W + scale·B·A) instead of the PEFT adapters.
  bool merge_adapters = false;
  bool quiet = false;
};
absl::Status RunExport(const ExportFlags& flags);

// `zt offload probe PATH`: the write and read bandwidth the swap store would reach in PATH.
struct OffloadProbeFlags {
  std::string path;
  // Sizes: bytes, or a size like "1MiB" (cli/output_format.h). Defaults: the job schema's
  // offload.aio defaults (DeepSpeed's), and the probe's 256 MiB.
  std::string block_size = "1MiB";
  int queue_depth = 8;
  std::string bytes = "256MiB";
  bool json = false;
};
// Prints one line (with json: one JSON object) to stdout; errors name the flag or the path.
absl::Status RunOffloadProbe(const OffloadProbeFlags& flags);

// How every remote verb reaches the coordinator (worker/node/control_channel.h resolves the
// empty ones: $ZT_COORDINATOR or 127.0.0.1:7070; $ZT_TOKEN or $ZT_STATE_DIR/token).
struct RemoteFlags {
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
  // Print messages through protobuf's JSON mapping instead of tables.
  bool json = false;
  // Seconds each call may take, waiting for the coordinator to accept the connection included
  // (a coordinator that is restarting delays a call rather than failing it).
  int timeout_s = 30;
};

struct SubmitFlags {
  RemoteFlags remote;
  std::string job_file;
  // A DeepSpeed ds_config.json laid over the job file before it is sent.
  std::string deepspeed;
  bool watch = false;
  bool has_priority = false;  // --priority given: it replaces scheduling.priority
  int priority = 0;
};
// Prints the job id (with json: the Job); with watch, then watches as RunWatch.
absl::Status RunSubmit(const SubmitFlags& flags);

struct ListFlags {
  RemoteFlags remote;
  std::string state;  // a Job.State name (any case); empty: every state
  int64_t limit = 0;  // at most this many jobs, the newest; 0: all of them
};
absl::Status RunList(const ListFlags& flags);

struct JobFlags {
  RemoteFlags remote;
  std::string job_id;
};
absl::Status RunStatus(const JobFlags& flags);
absl::Status RunCancel(const JobFlags& flags);
// Removes a finished job from the coordinator (DeleteJob).
absl::Status RunDelete(const JobFlags& flags);
// Streams the job's events until it finishes; the status is JobOutcome's.
absl::Status RunWatch(const JobFlags& flags);

struct ResumeFlags {
  RemoteFlags remote;
  // A job id, or a checkpoint directory (an existing path) to continue with `job_file`.
  std::string target;
  std::string job_file;
  // With job_file: a DeepSpeed ds_config.json laid over it, as the run being continued had.
  std::string deepspeed;
  bool fallback = false;
};
absl::Status RunResume(const ResumeFlags& flags);

absl::Status RunNodes(const RemoteFlags& flags);

// The exit code of a verb's status (documented in main.cc): 0 OK; 3 Cancelled (the job was
// cancelled); 4 Unavailable or DeadlineExceeded (the coordinator cannot be reached: retry);
// 5 Unauthenticated; otherwise by the classification the daemon restarts jobs by
// (worker/job/failure_kind.h): 2 a permanent error, the user's input is wrong
// (InvalidArgument, NotFound, PermissionDenied, FailedPrecondition, OutOfRange, DataLoss,
// AlreadyExists, Unimplemented); 1 a transient one (the run or the job failed).
// Only the verbs that talk to a coordinator give 4: in `zt train`, Unavailable and
// DeadlineExceeded come from the ranks' collectives (a lost peer) and the run failed: 1.
enum class VerbKind { kOffline, kRemote };
int ExitCodeFor(const absl::Status& status, VerbKind kind = VerbKind::kRemote);

// A finished job's state as a status that ExitCodeFor maps: SUCCEEDED OK, CANCELLED
// Cancelled, FAILED Aborted (exit 1) or, when `failure_code` (the job's) is a permanent error,
// that code (exit 2: the job, its data or paths are wrong; rerunning it fails again), any other
// state Unknown (exit 1). `reason` (the job's failure_reason) ends the message.
absl::Status JobOutcome(zerotrain::Job::State state, const std::string& job_id,
                        const std::string& reason, int32_t failure_code = 0);

}  // namespace zt::cli
