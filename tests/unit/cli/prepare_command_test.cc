// `zt prepare --format jsonl` through the command: shard and document index written, a bad
// line named by file:line.
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/document_index.h"
#include "worker/data/token_shard.h"

namespace zt::cli {
namespace {

using ::testing::HasSubstr;

class PrepareCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zt-prepare-cmd-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(PrepareCommandTest, JsonlWritesTheShardAndItsDocumentIndex) {
  const std::string in = Write("a.jsonl", "{\"prompt\": \"ab\", \"completion\": \"cd\"}\n"
                                          "{\"text\": \"xyz\"}\n");
  const std::string out = (dir_ / "a.bin").string();
  ASSERT_TRUE(RunPrepare({.inputs = {in}, .tokenizer = "bytes", .out = out, .format = "jsonl"})
                  .ok());
  auto index = ReadDocumentIndex(out, 7);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_TRUE(index->has_value());
  ASSERT_EQ((*index)->documents.size(), 2u);
  EXPECT_EQ((*index)->documents[0].prompt_length, 2u);
  // The text format over the same file is plain text: no index.
  ASSERT_TRUE(RunPrepare({.inputs = {in}, .tokenizer = "bytes", .out = out}).ok());
  EXPECT_FALSE(std::filesystem::exists(out + kDocumentIndexSuffix));
}

TEST_F(PrepareCommandTest, JsonlBadLineIsNamed) {
  const std::string in = Write("b.jsonl", "{\"text\": \"ok\"}\n{\"prompt\": \"only\"}\n");
  const absl::Status s = RunPrepare(
      {.inputs = {in}, .tokenizer = "bytes", .out = (dir_ / "b.bin").string(), .format = "jsonl"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(in + ":2: needs a 'text' field or both 'prompt' and "
                                          "'completion'"));
}

}  // namespace
}  // namespace zt::cli
