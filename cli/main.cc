// zt: the ZeroTrain client. The offline verbs run here, on this machine's devices:
//   zt train JOBFILE     train a job in this process
//   (train, estimate, submit and resume --job take --deepspeed DS_CONFIG: a DeepSpeed
//   ds_config.json laid over the job file, docs/deepspeed.md)
//   zt prepare ...       turn text files into token shards
//   zt estimate JOBFILE [--plan]  where a rank's memory goes / the sharding the planner picks
//   zt export CKPT --out DIR  a checkpoint as a Hugging Face model directory
//   zt offload probe PATH  the swap store's write/read GB/s in PATH
// The remote verbs talk to a coordinator (`ztd`; --coordinator, else $ZT_COORDINATOR, else
// 127.0.0.1:7070; the token from --token-file, else $ZT_TOKEN, else $ZT_STATE_DIR/token;
// each call waits up to --timeout seconds, default 30, for the coordinator to answer,
// connecting included, and calls that are safe to repeat are resent while it restarts):
//   zt submit JOBFILE [--watch] [--priority N]   zt list [--state S] [--limit N]
//   zt status JOB   zt watch JOB   zt cancel JOB   zt delete JOB
//   zt resume JOB|CHECKPOINT [--job JOBFILE] [--fallback]   zt nodes
// Exit codes (cli/exit_codes.cc), so a batch script knows what to do next:
//   0  success; for submit --watch and watch: the job SUCCEEDED
//   1  the run failed, or the job FAILED (after spending its restarts)
//   2  the input (command line, job file, data, a path the coordinator refuses) is wrong:
//      for `zt train`, a rank failed with an error no rerun can fix (the classification the
//      daemon uses to fail a job instead of restarting it, worker/job/failure_kind.h); 1 is a
//      failure a rerun may not repeat (a lost peer, a full disk). For watch and submit
//      --watch: the job FAILED on such an error (Job.failure_code), without a restart
//   3  the job was CANCELLED
//   4  the coordinator cannot be reached (UNAVAILABLE, DEADLINE_EXCEEDED): retry later
//   5  UNAUTHENTICATED: the token is missing or wrong
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "cli/commands.h"
#include "worker/node/secret_file.h"

int main(int argc, char** argv) {
  // A peer rank that dies closes its sockets; writing to one must fail the collective with
  // an error naming the rank, not kill this process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"zt: train transformer language models that do not fit one device"};
  app.require_subcommand(1);

  zt::cli::TrainFlags train;
  CLI::App* train_cmd = app.add_subcommand("train", "Run a job in this process, on this machine");
  train_cmd->add_option("job", train.job_file, "Job file (YAML or JSON)")->required();
  train_cmd->footer(
      "Exit codes: 0 trained; 2 an error no rerun can fix (the job file, its data or paths, a "
      "checkpoint of another configuration: the errors on which the daemon fails a job instead "
      "of restarting it); 1 a failure a rerun may not repeat (a lost peer, a full disk).");
  const char* deepspeed_help =
      "DeepSpeed ds_config.json whose batch sizes, precision, ZeRO stage, optimizer and "
      "scheduler replace the job file's (docs/deepspeed.md)";
  train_cmd->add_option("--deepspeed", train.deepspeed, deepspeed_help);
  train_cmd
      ->add_option("--steps", train.stop_after_step,
                   "Stop after this global step without changing the schedule (0: no steps)")
      ->check(CLI::NonNegativeNumber);
  train_cmd->add_option("--run-dir", train.run_dir,
                        "Directory for metrics.jsonl (default runs/<job name>)");
  train_cmd->add_option("--export", train.export_path,
                        "Write the final weights as Hugging Face safetensors to this file");
  train_cmd->add_option("--export-dtype", train.export_dtype, "fp32 (default), bf16 or fp16");
  train_cmd->add_option("--sample", train.sample_tokens,
                        "After training, print this many tokens sampled from the model");
  train_cmd->add_option("--tokenizer", train.tokenizer,
                        "Tokenizer to decode samples with: bytes (default) or a path");
  train_cmd->add_option("--prompt", train.prompt, "Text the sample continues");
  train_cmd->add_flag("--quiet", train.quiet, "No progress lines");
  train_cmd->add_option("--ranks", train.ranks,
                        "Ranks this process runs, A or A-B (default: all, one thread each)");
  train_cmd->add_option("--rendezvous", train.rendezvous,
                        "Directory of the store the processes of a multi-process job share");
  CLI::Option* resume =
      train_cmd
          ->add_option("--resume", train.resume_dir,
                       "Continue from the latest checkpoint in DIR (default: checkpoint.dir)")
          ->expected(0, 1);
  train_cmd->add_flag("--fallback", train.fallback,
                      "With --resume: use the newest older checkpoint that verifies if the "
                      "latest does not");

  zt::cli::PrepareFlags prepare;
  CLI::App* prepare_cmd =
      app.add_subcommand("prepare", "Tokenize text files into a token shard (docs/formats.md)");
  prepare_cmd->add_option("inputs", prepare.inputs, "Text files")->required();
  prepare_cmd
      ->add_option("--tokenizer", prepare.tokenizer,
                   "bytes, a tokenizer.json, or a GPT-2 vocab.json (merges.txt beside it)")
      ->required();
  prepare_cmd->add_option("--out", prepare.out, "Output shard")->required();
  prepare_cmd->add_option("--val-out", prepare.val_out,
                          "Also write the last --val-fraction of the tokens to this shard");
  prepare_cmd->add_option("--val-fraction", prepare.val_fraction,
                          "Fraction of tokens for --val-out (default 0.1)");
  prepare_cmd
      ->add_option("--format", prepare.format,
                   "text (default): files of plain text; jsonl: one {\"prompt\", \"completion\"} "
                   "or {\"text\"} object a line, written with a document index (.docs)")
      ->check(CLI::IsMember({"text", "jsonl"}));

  zt::cli::EstimateFlags estimate;
  CLI::App* estimate_cmd = app.add_subcommand(
      "estimate", "Print where a rank's memory goes, by category, without allocating it");
  estimate_cmd->add_option("job", estimate.job_file, "Job file (YAML or JSON)")->required();
  estimate_cmd->add_option("--deepspeed", estimate.deepspeed, deepspeed_help);
  estimate_cmd
      ->add_option("--world-size", estimate.world_size,
                   "Ranks, sharded as one group (default: the job's)")
      ->check(CLI::PositiveNumber);
  estimate_cmd
      ->add_option("--zero-stage", estimate.zero_stage, "ZeRO stage 0-3 (default: the job's)")
      ->check(CLI::Range(0, 3));
  estimate_cmd->add_flag("--json", estimate.json,
                         "One JSON object (per_rank: bytes by category; with --plan: the "
                         "ShardingPlan message)");
  estimate_cmd->add_flag("--plan", estimate.plan,
                         "Show the ZeRO stage and activation checkpointing the planner chooses, "
                         "and every alternative");
  estimate_cmd->add_option("--device-memory", estimate.device_memory,
                           "With --plan: memory of one device, bytes or a size like 16GiB "
                           "(default: this machine's MemAvailable / world size)");

  zt::cli::OffloadProbeFlags offload_probe;
  CLI::App* offload_cmd = app.add_subcommand("offload", "The offload tier of this machine");
  offload_cmd->require_subcommand(1);
  CLI::App* probe_cmd = offload_cmd->add_subcommand(
      "probe", "Write and read back a file in PATH as the NVMe swap store would; print GB/s");
  probe_cmd->add_option("path", offload_probe.path, "A writable directory (offload.nvme_path)")
      ->required();
  probe_cmd->add_option("--block-size", offload_probe.block_size,
                        "Bytes per I/O, a multiple of 4096 (default 1MiB, offload.aio's)");
  probe_cmd
      ->add_option("--queue-depth", offload_probe.queue_depth,
                   "I/Os in flight, 1-4096 (default 8, offload.aio's)")
      ->check(CLI::Range(1, 4096));
  probe_cmd->add_option("--bytes", offload_probe.bytes, "Size of the probe file (default 256MiB)");
  probe_cmd->add_flag("--json", offload_probe.json, "One JSON object");

  zt::cli::ExportFlags export_flags;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face model directory, tensor by tensor");
  export_cmd
      ->add_option("checkpoint", export_flags.checkpoint,
                   "A checkpoint.dir (its latest step) or one step directory")
      ->required();
  export_cmd->add_option("--format", export_flags.format, "hf (default)");
  export_cmd->add_option("--out", export_flags.out, "Output directory")->required();
  export_cmd->add_option("--dtype", export_flags.dtype,
                         "fp32 (default; --merge-adapters: the base's own dtype), bf16 or fp16");
  export_cmd->add_option("--max-shard-bytes", export_flags.max_shard_bytes,
                         "Split the weights into files of at most this many bytes "
                         "(default 5000000000)");
  export_cmd->add_flag("--merge-adapters", export_flags.merge_adapters,
                       "A LoRA checkpoint: write the merged model, not the PEFT adapters");
  export_cmd->add_flag("--quiet", export_flags.quiet, "No summary line");

  zt::cli::RemoteFlags remote;
  auto add_remote = [&remote](CLI::App* cmd) {
    cmd->add_option("--coordinator", remote.coordinator,
                    "host:port of the coordinator (default $ZT_COORDINATOR, else 127.0.0.1:7070)");
    cmd->add_option("--token-file", remote.token_file,
                    "File holding the coordinator's token (default $ZT_TOKEN, else "
                    "$ZT_STATE_DIR/token)");
    cmd->add_option("--tls-ca", remote.tls_ca, "PEM CA to verify the coordinator (enables TLS)");
    cmd->add_option("--tls-cert", remote.tls_cert, "PEM client certificate (mutual TLS)");
    cmd->add_option("--tls-key", remote.tls_key, "PEM client key (mutual TLS)");
    cmd->add_option("--timeout", remote.timeout_s,
                    "Seconds each call waits for the coordinator, connecting included (default 30)")
        ->check(CLI::PositiveNumber);
    cmd->add_flag("--json", remote.json,
                  "JSON through protobuf's JSON mapping (an object, an array, or for watch one "
                  "event per line)");
  };

  zt::cli::SubmitFlags submit;
  CLI::App* submit_cmd = app.add_subcommand("submit", "Submit a job to the coordinator");
  submit_cmd->add_option("job", submit.job_file, "Job file (YAML or JSON)")->required();
  submit_cmd->add_option("--deepspeed", submit.deepspeed, deepspeed_help);
  submit_cmd->add_flag("--watch", submit.watch, "Then watch it until it finishes");
  CLI::Option* priority = submit_cmd->add_option(
      "--priority", submit.priority, "Scheduling priority, higher first (default: the job's)");
  add_remote(submit_cmd);

  zt::cli::ListFlags list;
  CLI::App* list_cmd = app.add_subcommand("list", "List jobs, newest first");
  list_cmd->add_option("--state", list.state, "Only jobs in this state (PENDING, RUNNING, ...)");
  list_cmd->add_option("--limit", list.limit, "At most this many, the newest (default: all)")
      ->check(CLI::NonNegativeNumber);
  add_remote(list_cmd);

  zt::cli::JobFlags job_flags;
  CLI::App* status_cmd = app.add_subcommand("status", "Show one job");
  CLI::App* watch_cmd =
      app.add_subcommand("watch", "Follow a job until it finishes (exit 0 when it SUCCEEDED)");
  CLI::App* cancel_cmd = app.add_subcommand("cancel", "Cancel a job");
  CLI::App* delete_cmd =
      app.add_subcommand("delete", "Remove a finished job and its history from the coordinator");
  for (CLI::App* cmd : {status_cmd, watch_cmd, cancel_cmd, delete_cmd}) {
    cmd->add_option("job", job_flags.job_id, "Job id")->required();
    add_remote(cmd);
  }

  zt::cli::ResumeFlags resume_flags;
  CLI::App* resume_cmd = app.add_subcommand(
      "resume", "Queue a FAILED or CANCELLED job again, or continue a checkpoint directory");
  resume_cmd->add_option("target", resume_flags.target, "Job id or checkpoint directory")
      ->required();
  resume_cmd->add_option("--job", resume_flags.job_file,
                         "With a checkpoint directory: the job file to continue");
  resume_cmd->add_option("--deepspeed", resume_flags.deepspeed,
                         "With --job: the DeepSpeed config the job was submitted with");
  resume_cmd->add_flag("--fallback", resume_flags.fallback,
                       "Use the newest older checkpoint that verifies if the latest does not");
  add_remote(resume_cmd);

  CLI::App* nodes_cmd = app.add_subcommand("nodes", "List the coordinator's nodes");
  add_remote(nodes_cmd);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // A token file that others can read is refused before any remote verb sends it, as ssh
  // refuses such a private key (exit 2: the operator must fix the file).
  const bool offline_verb =
      *train_cmd || *prepare_cmd || *estimate_cmd || *export_cmd || *offload_cmd;
  if (absl::Status mode = zt::CheckTokenFile(remote.token_file); !offline_verb && !mode.ok()) {
    std::cerr << "zt: " << mode.message() << "\n";
    return zt::cli::ExitCodeFor(mode, zt::cli::VerbKind::kRemote);
  }
  absl::Status status;
  train.resume = resume->count() > 0;
  if (*train_cmd) status = zt::cli::RunTrain(train);
  if (*prepare_cmd) status = zt::cli::RunPrepare(prepare);
  if (*estimate_cmd) status = zt::cli::RunEstimate(estimate);
  if (*export_cmd) status = zt::cli::RunExport(export_flags);
  if (*probe_cmd) status = zt::cli::RunOffloadProbe(offload_probe);
  submit.has_priority = priority->count() > 0;
  submit.remote = list.remote = job_flags.remote = resume_flags.remote = remote;
  if (*submit_cmd) status = zt::cli::RunSubmit(submit);
  if (*list_cmd) status = zt::cli::RunList(list);
  if (*status_cmd) status = zt::cli::RunStatus(job_flags);
  if (*watch_cmd) status = zt::cli::RunWatch(job_flags);
  if (*cancel_cmd) status = zt::cli::RunCancel(job_flags);
  if (*delete_cmd) status = zt::cli::RunDelete(job_flags);
  if (*resume_cmd) status = zt::cli::RunResume(resume_flags);
  if (*nodes_cmd) status = zt::cli::RunNodes(remote);
  if (!status.ok()) {
    std::cerr << "zt: " << status.message() << "\n";
    const bool offline = *train_cmd || *prepare_cmd || *estimate_cmd || *export_cmd || *offload_cmd;
    return zt::cli::ExitCodeFor(status,
                                offline ? zt::cli::VerbKind::kOffline : zt::cli::VerbKind::kRemote);
  }
  return 0;
}
