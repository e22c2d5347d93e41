// The fuzz corpus (tests/fuzz/corpus/) through the job-spec fuzz target, in the default build:
// hostile job files and JobSpecs (deep nesting, huge and negative sizes, NaN, unknown enums,
// alias bombs, binary garbage) must be refused with an error a user can act on, and the valid
// controls accepted, so the target is shown to reach validation and not only the parser. A
// crash, a hang or a sanitizer report fails the test by ending the binary.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/fuzz/fuzz_targets.h"

namespace zt::fuzz {
namespace {

enum Path { kYaml, kJson, kProto };

// The paths that accept each corpus file; every other path must refuse it. A new reproducer
// saved in the corpus gets its line here (usually `{}`: refused everywhere).
const std::map<std::string, std::set<Path>>& Expectations() {
  static const auto* expected = new std::map<std::string, std::set<Path>>{
      {"valid_tiny.yaml", {kYaml}},
      // JSON is YAML too.
      {"valid_tiny.json", {kYaml, kJson}},
      {"valid_tiny.jobspec.binpb", {kProto}},
      {"valid_tiny.submit.binpb", {}},
      // 10^9 blocks: refused by model.n_layer's bound (it exhausted the coordinator's memory
      // in the planner's layout before the bound existed; submit_job_fuzzer found it).
      {"billion_layers.yaml", {}},
      // Legal, only enormous: accepted without walking the sizes (the time bound below).
      {"huge_world_size.yaml", {kYaml}},
      // A SubmitJobRequest with 10^9 blocks: not a JobSpec, refused by this target.
      {"huge_valid.submit.binpb", {}},
      {"billion_layers.jobspec.binpb", {}},
      {"billion_layers.submit.binpb", {}},
      {"binary_garbage.bin", {}},
      {"llama_stage3.submit.binpb", {}},
      {"path_outside_root.submit.binpb", {}},
      {"deep_json_nesting.json", {}},
      {"deep_yaml_mapping_nesting.yaml", {}},
      {"deep_yaml_nesting.yaml", {}},
      {"duplicate_keys.json", {}},
      {"empty", {}},
      {"huge_numbers.yaml", {}},
      {"invalid_utf8_name.yaml", {}},
      {"multiple_documents.yaml", {}},
      {"nan_values.json", {}},
      {"nan_values.yaml", {}},
      {"negative_sizes.yaml", {}},
      {"unknown_enums.yaml", {}},
      {"yaml_alias_bomb.yaml", {}},
      {"yaml_loadall_loop_found.bin", {}},
      {"yaml_loadall_loop_min.yaml", {}},
  };
  return *expected;
}

// yaml_loadall_loop_*: inputs on which YAML::LoadAll of yaml-cpp 0.7 never returned,
// allocating ~300 MiB/s (upstream jbeder/yaml-cpp#1319); job_spec_fuzzer found them, and
// worker/job/yaml_to_json.cc now parses at most two documents. A regression hangs this test.

std::filesystem::path CorpusDir() {
  return std::filesystem::path(ZT_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
}

std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void ExpectOutcome(const std::string& file, const char* path_name, const absl::Status& status,
                   bool accepted) {
  if (accepted) {
    EXPECT_TRUE(status.ok()) << file << " (" << path_name << "): " << status;
    return;
  }
  ASSERT_FALSE(status.ok()) << file << " (" << path_name << ") was accepted";
  // Bad input is the user's to fix: InvalidArgument names the field, FailedPrecondition what
  // this engine cannot run. Anything else (Internal, Unknown) would mean a path that did not
  // expect the input.
  EXPECT_TRUE(absl::IsInvalidArgument(status) || absl::IsFailedPrecondition(status))
      << file << " (" << path_name << "): " << status;
  EXPECT_FALSE(status.message().empty()) << file << " (" << path_name << ")";
}

TEST(FuzzRegressionTest, EveryCorpusFileHasAnExpectation) {
  std::set<std::string> on_disk;
  for (const auto& entry : std::filesystem::directory_iterator(CorpusDir())) {
    on_disk.insert(entry.path().filename().string());
  }
  for (const std::string& name : on_disk) {
    EXPECT_TRUE(Expectations().contains(name)) << name << " has no line in Expectations()";
  }
  for (const auto& [name, accepted] : Expectations()) {
    EXPECT_TRUE(on_disk.contains(name)) << name << " is missing from " << CorpusDir();
  }
}

void RunCorpusFile(const std::string& name, const std::set<Path>& accepted) {
  const std::string bytes = ReadBytes(CorpusDir() / name);
  const auto start = std::chrono::steady_clock::now();
  const JobSpecFuzzResult result =
      RunJobSpecInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ExpectOutcome(name, "yaml", result.yaml, accepted.contains(kYaml));
  ExpectOutcome(name, "json", result.json, accepted.contains(kJson));
  ExpectOutcome(name, "proto", result.proto, accepted.contains(kProto));
  // A job is refused or planned without scaling with the sizes it names (1e9 layers must not
  // be walked); each input here takes milliseconds, so 5 s only catches that, even on a
  // loaded 2-core machine.
  EXPECT_LT(seconds, 5.0) << name;
}

TEST(FuzzRegressionTest, CorpusIsRefusedOrAcceptedAsExpected) {
  for (const auto& [name, accepted] : Expectations()) {
    RunCorpusFile(name, accepted);
  }
}


}  // namespace
}  // namespace zt::fuzz
