// libFuzzer target: arbitrary bytes as a SubmitJobRequest into Coordinator::Submit, the call
// JobService.SubmitJob's handler makes (daemon/job_service.cc) after authorization. Must return
// a status for every input, never crash, and refuse or plan huge models at once (the planner
// only computes sizes; it allocates nothing of the model).
//
// One coordinator serves the whole run: created in LLVMFuzzerInitialize over a temporary state
// directory, with $TMPDIR/zt-fuzz-allowed as its allowed root, and no nodes, so jobs are planned
// against the default device memory and queued PENDING. An accepted job is cancelled at once
// (PENDING jobs end CANCELLED on the spot), so the queue the scheduler walks stays empty; the job
// records themselves stay, a few KiB each.
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "daemon/coordinator.h"
#include "google/protobuf/stubs/logging.h"
#include "proto/control.pb.h"

namespace {

zt::Coordinator* coordinator = nullptr;
// The temporary state directory, removed at exit (libFuzzer ends with exit()).
std::string* state_dir = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Protobuf logs every invalid UTF-8 string it parses; the statuses carry what matters.
  google::protobuf::SetLogHandler(nullptr);
  std::string pattern =
      (std::filesystem::temp_directory_path() / "zt-submit-fuzzer-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    std::fprintf(stderr, "submit_job_fuzzer: cannot create a temporary directory\n");
    std::abort();
  }
  state_dir = new std::string(pattern);
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(*state_dir, ignored);
  });
  // A fixed name, so that seeds can name paths under it and reach the planner (the corpus'
  // *.submit.binpb use /tmp/zt-fuzz-allowed/...); it holds nothing and is shared by runs.
  const std::string root = (std::filesystem::temp_directory_path() / "zt-fuzz-allowed").string();
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  absl::StatusOr<std::unique_ptr<zt::Coordinator>> created =
      zt::Coordinator::Create({.state_dir = pattern, .allowed_roots = {root}});
  if (!created.ok()) {
    std::fprintf(stderr, "submit_job_fuzzer: %s\n", created.status().ToString().c_str());
    std::abort();
  }
  // Lives for the process: libFuzzer exits without a hook to destroy it.
  coordinator = created->release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zerotrain::SubmitJobRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return -1;
  absl::StatusOr<zerotrain::Job> job = coordinator->Submit(request.spec());
  if (job.ok()) (void)coordinator->Cancel(job->id());
  return 0;
}
