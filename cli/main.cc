// zt: the ZeroTrain client. The offline verbs run here, on this machine's devices:
//   zt train JOBFILE     train a job in this process
//   zt prepare ...       turn text files into token shards
//   zt estimate JOBFILE  where a rank's memory goes, from the memory plan
//   zt export CKPT --out DIR  a checkpoint as a Hugging Face model directory
// Exit codes: 0 success; 1 the run failed; 2 the input (command line, job file, data) is
// wrong — a batch script can tell "fix the job" from "retry".
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "cli/commands.h"

int main(int argc, char** argv) {
  // A peer rank that dies closes its sockets; writing to one must fail the collective with
  // an error naming the rank, not kill this process with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"zt: train transformer language models that do not fit one device"};
  app.require_subcommand(1);

  zt::cli::TrainFlags train;
  CLI::App* train_cmd = app.add_subcommand("train", "Run a job in this process, on this machine");
  train_cmd->add_option("job", train.job_file, "Job file (YAML or JSON)")->required();
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

  zt::cli::EstimateFlags estimate;
  CLI::App* estimate_cmd = app.add_subcommand(
      "estimate", "Print where a rank's memory goes, by category, without allocating it");
  estimate_cmd->add_option("job", estimate.job_file, "Job file (YAML or JSON)")->required();
  estimate_cmd
      ->add_option("--world-size", estimate.world_size,
                   "Ranks, sharded as one group (default: the job's)")
      ->check(CLI::PositiveNumber);
  estimate_cmd
      ->add_option("--zero-stage", estimate.zero_stage, "ZeRO stage 0-3 (default: the job's)")
      ->check(CLI::Range(0, 3));
  estimate_cmd->add_flag("--json", estimate.json, "One JSON object (per_rank: bytes by category)");

  zt::cli::ExportFlags export_flags;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face model directory, tensor by tensor");
  export_cmd
      ->add_option("checkpoint", export_flags.checkpoint,
                   "A checkpoint.dir (its latest step) or one step directory")
      ->required();
  export_cmd->add_option("--format", export_flags.format, "hf (default)");
  export_cmd->add_option("--out", export_flags.out, "Output directory")->required();
  export_cmd->add_option("--dtype", export_flags.dtype, "fp32 (default), bf16 or fp16");
  export_cmd->add_option("--max-shard-bytes", export_flags.max_shard_bytes,
                         "Split the weights into files of at most this many bytes "
                         "(default 5000000000)");
  export_cmd->add_flag("--quiet", export_flags.quiet, "No summary line");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  absl::Status status;
  train.resume = resume->count() > 0;
  if (*train_cmd) status = zt::cli::RunTrain(train);
  if (*prepare_cmd) status = zt::cli::RunPrepare(prepare);
  if (*estimate_cmd) status = zt::cli::RunEstimate(estimate);
  if (*export_cmd) status = zt::cli::RunExport(export_flags);
  if (!status.ok()) {
    std::cerr << "zt: " << status.message() << "\n";
    return zt::cli::ExitCodeFor(status);
  }
  return 0;
}
