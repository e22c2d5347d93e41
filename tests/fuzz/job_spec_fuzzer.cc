// libFuzzer target: arbitrary bytes as a YAML job file, a JSON job file and a serialized
// JobSpec, through parse, defaults, validation and the planner's view (tests/fuzz/
// fuzz_targets.h). Must never crash, hang or leak; any status is a pass.
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Protobuf logs every invalid UTF-8 string it parses; the statuses carry what matters.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)zt::fuzz::RunJobSpecInput(data, size);
  return 0;
}
