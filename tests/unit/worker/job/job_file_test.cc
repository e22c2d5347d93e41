#include "worker/job/job_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/job/test_jobs.h"

namespace zt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using zerotrain::JobSpec;

absl::StatusOr<JobSpec> Yaml(const std::string& text) {
  return ParseJobText(text, JobFormat::kYaml, "job.yaml");
}

absl::StatusOr<JobSpec> Json(const std::string& text) {
  return ParseJobText(text, JobFormat::kJson, "job.json");
}

// The message of a parse that must fail with InvalidArgument.
std::string ErrorOf(const absl::StatusOr<JobSpec>& result) {
  EXPECT_FALSE(result.ok());
  if (result.ok()) return "";
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  return std::string(result.status().message());
}

TEST(JobFileTest, YamlAndJsonOfTheSameJobGiveEqualMessages) {
  absl::StatusOr<JobSpec> from_yaml = Yaml(testing::kFullYaml);
  absl::StatusOr<JobSpec> from_json = Json(testing::kFullJson);
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*from_yaml, *from_json))
      << from_yaml->DebugString() << "\nvs\n"
      << from_json->DebugString();
  // Equal could also mean "both empty": check values of every kind arrived.
  EXPECT_EQ(from_yaml->model().family(), zerotrain::ModelConfig::LLAMA);
  EXPECT_EQ(from_yaml->model().n_kv_head(), 2);
  EXPECT_EQ(from_yaml->data().seed(), 18446744073709551615ull);
  EXPECT_THAT(from_yaml->data().train(), ElementsAre("a.bin", "b.bin"));
  EXPECT_THAT(from_yaml->data().val(), ElementsAre("c.bin"));
  // Both sides round the same decimal to the nearest float, so they are exactly equal.
  EXPECT_EQ(from_yaml->model().norm_eps(), static_cast<float>(1.0e-6));
  EXPECT_EQ(from_yaml->optimizer().schedule().min_lr_ratio(), 0.25f);
  EXPECT_TRUE(from_yaml->optimizer().decay_all_parameters());
  EXPECT_TRUE(from_yaml->optimizer().has_weight_decay());
  EXPECT_EQ(from_yaml->precision().compute_dtype(), zerotrain::PrecisionConfig::FP16);
  EXPECT_EQ(from_yaml->resources().device(), zerotrain::ResourceConfig::CUDA);
}

TEST(JobFileTest, LowerCamelCaseKeysAreAcceptedInBothFormats) {
  const std::string snake =
      "model: {n_kv_head: 2, max_seq_len: 64, tie_embeddings: false}\n"
      "train: {micro_batch_size: 3}\n"
      "optimizer: {schedule: {warmup_steps: 4, min_lr_ratio: 0.5}}\n";
  const std::string camel =
      "model: {nKvHead: 2, maxSeqLen: 64, tieEmbeddings: false}\n"
      "train: {microBatchSize: 3}\n"
      "optimizer: {schedule: {warmupSteps: 4, minLrRatio: 0.5}}\n";
  absl::StatusOr<JobSpec> a = Yaml(snake);
  absl::StatusOr<JobSpec> b = Yaml(camel);
  absl::StatusOr<JobSpec> c = Json(
      R"({"model": {"nKvHead": 2, "maxSeqLen": 64, "tieEmbeddings": false},
          "train": {"microBatchSize": 3},
          "optimizer": {"schedule": {"warmupSteps": 4, "minLrRatio": 0.5}}})");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*a, *b));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*a, *c));
  EXPECT_EQ(b->model().n_kv_head(), 2);
  EXPECT_TRUE(b->model().has_tie_embeddings());
  EXPECT_EQ(b->optimizer().schedule().warmup_steps(), 4);
}

TEST(JobFileTest, AFieldGivenUnderBothNamesIsAnError) {
  EXPECT_THAT(ErrorOf(Yaml("model:\n  n_head: 4\n  nHead: 4\n")),
              HasSubstr("job.yaml:3:3: model.n_head: given more than once"));
}

TEST(JobFileTest, UnknownNestedFieldNamesItsPathAndTheKnownFields) {
  const std::string error = ErrorOf(Yaml("model:\n  n_layer: 2\n  d_modle: 256\n"));
  EXPECT_THAT(error, HasSubstr("job.yaml:3:3: model.d_modle: unknown field (known fields: "
                               "family, n_layer, n_head, n_kv_head, d_model,"));
  EXPECT_THAT(error, HasSubstr("did you mean d_model?"));
  EXPECT_THAT(ErrorOf(Yaml("optimizer:\n  schedule:\n    warmup: 3\n")),
              HasSubstr("optimizer.schedule.warmup: unknown field (known fields: warmup_steps, "
                        "decay, min_lr_ratio)"));
  EXPECT_THAT(ErrorOf(Yaml("modle: {}\n")), HasSubstr("job.yaml:1:1: modle: unknown field"));
  // A junk key is echoed quoted and cut, never whole.
  const std::string error_for_long_key = ErrorOf(Yaml(std::string(1000, 'k') + ": 1\n"));
  EXPECT_THAT(error_for_long_key, HasSubstr("job.yaml:1:1: '" + std::string(60, 'k') + "...'"));
  EXPECT_LT(error_for_long_key.size(), 400u);
}

TEST(JobFileTest, BadScalarsNameTheFieldAndTheValue) {
  EXPECT_THAT(ErrorOf(Yaml("train:\n  max_steps: ten\n")),
              HasSubstr("job.yaml:2:14: train.max_steps: 'ten' is not an integer"));
  EXPECT_THAT(ErrorOf(Yaml("train: {max_steps: 10.5}")),
              HasSubstr("train.max_steps: '10.5' is not an integer"));
  EXPECT_THAT(ErrorOf(Yaml("model: {n_layer: 3000000000}")),
              HasSubstr("model.n_layer: '3000000000' is out of range for int32 "
                        "(-2147483648..2147483647)"));
  EXPECT_THAT(ErrorOf(Yaml("train: {seed: -1}")),
              HasSubstr("train.seed: '-1' is out of range for uint64"));
  EXPECT_THAT(ErrorOf(Yaml("train: {seed: 18446744073709551616}")),
              HasSubstr("train.seed: '18446744073709551616' is out of range for uint64"));
  EXPECT_THAT(ErrorOf(Yaml("optimizer: {lr: fast}")),
              HasSubstr("optimizer.lr: 'fast' is not a number"));
  EXPECT_THAT(ErrorOf(Yaml("optimizer: {lr: inf}")),
              HasSubstr("optimizer.lr: 'inf' is not a number"));
  EXPECT_THAT(ErrorOf(Yaml("optimizer: {lr: 1e39}")),
              HasSubstr("optimizer.lr: '1e39' is out of range for float"));
  EXPECT_THAT(ErrorOf(Yaml("data: {shuffle: yes}")),
              HasSubstr("data.shuffle: 'yes' is not a boolean (true or false)"));
}

TEST(JobFileTest, IntegerAndFloatEdgesParseExactly) {
  absl::StatusOr<JobSpec> spec = Yaml(
      "model: {n_layer: +2147483647, n_head: -2147483648}\n"
      "train: {seed: 18446744073709551615}\n"
      "optimizer: {lr: .inf, eps: -.inf, beta1: .nan, beta2: 3.4028234e38}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().n_layer(), 2147483647);
  EXPECT_EQ(spec->model().n_head(), -2147483647 - 1);
  EXPECT_EQ(spec->train().seed(), 18446744073709551615ull);
  EXPECT_EQ(spec->optimizer().lr(), std::numeric_limits<float>::infinity());
  EXPECT_EQ(spec->optimizer().eps(), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(spec->optimizer().beta1()));
  // 3.4028234e38 rounds to FLT_MAX, the largest value a float field accepts.
  EXPECT_EQ(spec->optimizer().beta2(), std::numeric_limits<float>::max());
}

TEST(JobFileTest, BadEnumListsTheValidNames) {
  EXPECT_THAT(ErrorOf(Yaml("model:\n  family: GPT3\n")),
              HasSubstr("job.yaml:2:11: model.family: 'GPT3' is not one of GPT2, LLAMA"));
  EXPECT_THAT(ErrorOf(Yaml("model: {family: llama}")),
              HasSubstr("model.family: 'llama' is not one of GPT2, LLAMA (names are "
                        "case-sensitive: LLAMA)"));
  // The placeholder means "not given"; writing it is a mistake, not a choice.
  EXPECT_THAT(ErrorOf(Yaml("optimizer: {schedule: {decay: DECAY_UNSPECIFIED}}")),
              HasSubstr("optimizer.schedule.decay: 'DECAY_UNSPECIFIED' is not one of "
                        "CONSTANT, COSINE, LINEAR"));
}

TEST(JobFileTest, WrongNodeKindsNameTheField) {
  EXPECT_THAT(ErrorOf(Yaml("model:\n  n_layer: [1, 2]\n")),
              HasSubstr("job.yaml:2:12: model.n_layer: expected an integer, got a list"));
  EXPECT_THAT(ErrorOf(Yaml("name: {a: 1}")), HasSubstr("name: expected a string, got a mapping"));
  EXPECT_THAT(ErrorOf(Yaml("model: {family: [GPT2]}")),
              HasSubstr("model.family: expected one of GPT2, LLAMA, got a list"));
  EXPECT_THAT(ErrorOf(Yaml("model: 4")),
              HasSubstr("model: expected a mapping of ModelConfig fields, got '4'"));
  EXPECT_THAT(ErrorOf(Yaml("data: {train: [a.bin, [b.bin]]}")),
              HasSubstr("data.train[1]: expected a string, got a list"));
  EXPECT_THAT(ErrorOf(Yaml("data: {train: [a.bin, ~]}")),
              HasSubstr("data.train[1]: a list element cannot be null"));
  EXPECT_THAT(ErrorOf(Yaml("[1, 2]")),
              HasSubstr("job.yaml:1:1: expected a mapping of JobSpec fields, got a list"));
}

TEST(JobFileTest, AScalarForARepeatedFieldBecomesAOneElementList) {
  absl::StatusOr<JobSpec> spec = Yaml("data:\n  train: shard0.bin\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->data().train(), ElementsAre("shard0.bin"));
}

TEST(JobFileTest, NullValuesLeaveFieldsUnset) {
  absl::StatusOr<JobSpec> spec = Yaml("model:\n  n_kv_head:\n  d_ff: ~\nname: null\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->model().has_n_kv_head());
  EXPECT_FALSE(spec->model().has_d_ff());
  EXPECT_EQ(spec->name(), "");
  // Quoted, it is the text, not null.
  absl::StatusOr<JobSpec> quoted = Yaml("name: 'null'\n");
  ASSERT_TRUE(quoted.ok()) << quoted.status();
  EXPECT_EQ(quoted->name(), "null");
}

TEST(JobFileTest, EveryErrorIsReportedOnItsOwnLine) {
  const absl::StatusOr<JobSpec> result =
      Yaml("model:\n  family: GPT3\n  n_layer: two\ntrain:\n  steps: 3\n");
  ASSERT_FALSE(result.ok());
  EXPECT_THAT(testing::Lines(result.status()),
              ElementsAre(StartsWith("job.yaml:2:11: model.family:"),
                          StartsWith("job.yaml:3:12: model.n_layer:"),
                          StartsWith("job.yaml:5:3: train.steps: unknown field")));
}

TEST(JobFileTest, YamlSyntaxErrorsGiveLineAndColumn) {
  const std::string error = ErrorOf(Yaml("model:\n  n_layer: 2\n  n_head: [4\ntrain: {}\n"));
  EXPECT_THAT(error, AllOf(StartsWith("job.yaml:4:"), HasSubstr("YAML syntax error")));
  EXPECT_THAT(ErrorOf(Yaml("model:\n  n_layer: 2\n n_head: 4\n")),
              AllOf(StartsWith("job.yaml:3:"), HasSubstr("YAML syntax error")));
  EXPECT_THAT(ErrorOf(Yaml("name: a\n---\nname: b\n")),
              HasSubstr("a job file holds one YAML document, found more than one"));
}

TEST(JobFileTest, EmptyFilesAreRejectedByName) {
  EXPECT_THAT(ErrorOf(Yaml("")), HasSubstr("job.yaml: the job file is empty"));
  EXPECT_THAT(ErrorOf(Yaml("# only a comment\n\n")), HasSubstr("job.yaml: the job file is empty"));
  EXPECT_THAT(ErrorOf(Json(" \n")), HasSubstr("job.json: the job file is empty"));
  // An empty mapping is a job with every field at its default; validation says what is missing.
  EXPECT_TRUE(Yaml("{}").ok());
  EXPECT_TRUE(Json("{}").ok());
}

TEST(JobFileTest, JsonErrorsAreInvalidArgumentPrefixedWithTheSource) {
  EXPECT_THAT(ErrorOf(Json(R"({"model": {"d_modle": 4}})")),
              AllOf(StartsWith("job.json: "), HasSubstr("d_modle")));
  EXPECT_THAT(ErrorOf(Json(R"({"model": {"family": "GPT3"}})")),
              AllOf(StartsWith("job.json: "), HasSubstr("GPT3")));
  EXPECT_THAT(ErrorOf(Json(R"({"train": {"max_steps": "ten"}})")), StartsWith("job.json: "));
  EXPECT_THAT(ErrorOf(Json("{\n  \"model\": }\n")),
              StartsWith("job.json:2:12: JSON syntax error while parsing value"));
  EXPECT_THAT(ErrorOf(Json("{\"name\": \"a\"\n\n \"b\"}")), StartsWith("job.json:3:"));
}

TEST(JobFileTest, InvalidUtf8InAStringIsRejected) {
  // Raw bytes: YAML's own "\xff" escape means U+00FF and is re-encoded as valid UTF-8.
  EXPECT_THAT(ErrorOf(Yaml("name: a\xff"
                           "b\n")),
              HasSubstr("job.yaml:1:7: name: 'a\\xffb' is not valid UTF-8"));
  // An overlong encoding of '/', the classic way past path filters.
  EXPECT_THAT(ErrorOf(Yaml("data: {train: [ok.bin, \xc0\xaf"
                           "x.bin]}")),
              HasSubstr("data.train[1]: '\\xc0\\xafx.bin' is not valid UTF-8"));
  absl::StatusOr<JobSpec> spec = Yaml("name: \"caf\\xe9\"\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "caf\xc3\xa9");
}

TEST(JobFileTest, OneMegabyteOfGarbageIsAnErrorNotACrash) {
  std::mt19937 rng(7);
  std::string garbage(1 << 20, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  EXPECT_FALSE(Yaml(garbage).ok());
  EXPECT_FALSE(Json(garbage).ok());

  // Printable junk reaches deeper into the parsers than random bytes do.
  const std::string alphabet = "{}[]:,-#'\"\n abc0129.&*!|>";
  std::string printable(1 << 20, ' ');
  for (char& c : printable) c = alphabet[rng() % alphabet.size()];
  EXPECT_FALSE(Yaml(printable).ok());
  EXPECT_FALSE(Json(printable).ok());

  // Deep nesting would overflow the stack of a naively recursive parser.
  const std::string deep_list(1 << 20, '[');
  EXPECT_FALSE(Yaml(deep_list).ok());
  EXPECT_FALSE(Json(deep_list).ok());
  std::string deep_map;
  for (int i = 0; i < 100000; ++i) deep_map += "{a: ";
  EXPECT_FALSE(Yaml(deep_map).ok());

  // A huge list of bad values reports a bounded number of lines.
  std::string many = "data:\n  train:\n";
  for (int i = 0; i < 50000; ++i) many += "    - [x]\n";
  const absl::StatusOr<JobSpec> result = Yaml(many);
  ASSERT_FALSE(result.ok());
  EXPECT_LE(testing::Lines(result.status()).size(), 21u);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("... and 49980 more errors"));
}

class LoadJobFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("load_job_file_test_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(LoadJobFileTest, PicksTheFormatFromTheExtension) {
  for (const char* name : {"a.yaml", "b.yml", "c.YAML"}) {
    absl::StatusOr<JobSpec> spec = LoadJobFile(Write(name, testing::kFullYaml));
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(spec->name(), "full-job.1");
  }
  absl::StatusOr<JobSpec> spec = LoadJobFile(Write("d.json", testing::kFullJson));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "full-job.1");
  // YAML text in a .json file goes to the JSON parser, which rejects it.
  EXPECT_FALSE(LoadJobFile(Write("e.json", testing::kFullYaml)).ok());
}

TEST_F(LoadJobFileTest, ErrorsNameThePath) {
  const std::string missing = (dir_ / "missing.yaml").string();
  absl::StatusOr<JobSpec> result = LoadJobFile(missing);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr(missing));

  const std::string txt = Write("job.txt", "name: x\n");
  result = LoadJobFile(txt);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr(txt + ": a job file must end in .yaml, .yml or .json"));

  std::filesystem::create_directories(dir_ / "dir.yaml");
  result = LoadJobFile((dir_ / "dir.yaml").string());
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("is not a regular file"));

  const std::string bad = Write("bad.yaml", "model:\n  d_modle: 1\n");
  EXPECT_THAT(ErrorOf(LoadJobFile(bad)), StartsWith(bad + ":2:3: model.d_modle: unknown field"));
}

}  // namespace
}  // namespace zt
