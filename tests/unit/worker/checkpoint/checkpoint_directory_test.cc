// The checkpoint directory protocol under fault injection. Crashes are real: a forked child runs
// a save up to a crash point and _exit()s there (no destructors, no cleanup, as a kill -9
// leaves it); a full disk is RLIMIT_FSIZE in a forked child. Checksums are compared with a
// bitwise CRC32C written from the polynomial, and byte ranges with the bytes written: both are
// exact, so every comparison here is equality.
#include "worker/checkpoint/checkpoint_directory.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/worker/checkpoint/checkpoint_test_util.h"
#include "kernels/crc32c.h"

namespace zt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using testing_util::ScratchDir;

// The reference: CRC32C one bit at a time, straight from the reflected polynomial.
uint32_t ReferenceCrc32c(const std::vector<uint8_t>& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t b : bytes) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1u) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// The entries of `dir` whose names start with `prefix`.
std::vector<std::string> Entries(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// The files of one saved step: two rank files whose bytes follow from the step.
struct StepFiles {
  std::vector<uint8_t> rank0;
  std::vector<uint8_t> rank1;
};
StepFiles FilesOf(int64_t step) {
  // rank0 is larger than the writer's 1 MiB buffer, so both the buffered and the direct write
  // paths carry bytes.
  return {RandomBytes((size_t{3} << 20) + 17, static_cast<uint32_t>(step) * 2 + 1),
          RandomBytes(4099, static_cast<uint32_t>(step) * 2 + 2)};
}

absl::Status WriteInChunks(CheckpointSave& save, const std::string& name,
                           const std::vector<uint8_t>& bytes, size_t chunk) {
  absl::StatusOr<std::unique_ptr<CheckpointFileWriter>> writer = save.OpenFile(name);
  if (!writer.ok()) return writer.status();
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    const size_t n = std::min(chunk, bytes.size() - at);
    absl::Status status = (*writer)->Append(absl::MakeConstSpan(bytes.data() + at, n));
    if (!status.ok()) return status;
  }
  return (*writer)->Close();
}

// A complete save of `step`, as the trainer will do it.
void SaveStep(const std::string& dir, int64_t step, CheckpointSaveOptions options = {}) {
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, step, options);
  ASSERT_TRUE(save.ok()) << save.status();
  const StepFiles files = FilesOf(step);
  ASSERT_TRUE(WriteInChunks(**save, "rank-00000.safetensors", files.rank0, 1000003).ok());
  ASSERT_TRUE(WriteInChunks(**save, "rank-00001.safetensors", files.rank1, 100).ok());
  const absl::Status status =
      (*save)->Commit({{"step", step}, {"sampler", {{"tokens", 64 * step}}}});
  ASSERT_TRUE(status.ok()) << status;
}

// Opens, verifies and checks every byte of the checkpoint of `step` in `step_dir`.
void ExpectStep(const std::string& step_dir, int64_t step) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(step_dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->step(), step);
  EXPECT_EQ((*ckpt)->state()["sampler"]["tokens"], 64 * step);
  EXPECT_TRUE((*ckpt)->VerifyAll().ok()) << (*ckpt)->VerifyAll();
  const StepFiles files = FilesOf(step);
  EXPECT_EQ(ReadFile(step_dir + "/rank-00000.safetensors"), files.rank0);
  EXPECT_EQ(ReadFile(step_dir + "/rank-00001.safetensors"), files.rank1);
}

TEST(CheckpointDirectoryTest, Crc32cMatchesTheReferenceOnTheCheckValueAndRandomSplits) {
  // RFC 3720's check value for CRC32C.
  EXPECT_EQ(Crc32cExtend(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtend(0, nullptr, 0), 0u);
  const std::vector<uint8_t> bytes = RandomBytes(70001, 7);
  for (size_t len : {size_t{1}, size_t{7}, size_t{8}, size_t{63}, size_t{4096}, bytes.size()}) {
    for (size_t split : {size_t{0}, size_t{1}, size_t{3}, len / 2}) {
      if (split > len) continue;
      // Splits at odd offsets start the second part unaligned, the hardware path's prologue.
      const uint32_t crc =
          Crc32cExtend(Crc32cExtend(0, bytes.data(), split), bytes.data() + split, len - split);
      EXPECT_EQ(crc, ReferenceCrc32c({bytes.begin(), bytes.begin() + len}))
          << "len " << len << " split " << split;
    }
  }
  EXPECT_EQ(Crc32cFromHex(Crc32cToHex(0x0012abefu)), 0x0012abefu);
  EXPECT_FALSE(Crc32cFromHex("0012ABEF").has_value());
  EXPECT_FALSE(Crc32cFromHex("12abef").has_value());
}

TEST(CheckpointDirectoryTest, RoundTripVerifiesAndReadsRanges) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 20);

  absl::StatusOr<std::string> latest = FindLatest(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, dir + "/step-00000020");
  EXPECT_EQ(ReadFile(dir + "/latest"), std::vector<uint8_t>({'s', 't', 'e', 'p', '-', '0', '0', '0',
                                                             '0', '0', '0', '2', '0', '\n'}));
  EXPECT_THAT(Entries(dir, ".tmp-"), IsEmpty());
  ExpectStep(*latest, 20);

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(*latest);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const StepFiles files = FilesOf(20);
  ASSERT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->files()[0].name, "rank-00000.safetensors");
  EXPECT_EQ((*ckpt)->files()[0].size, static_cast<int64_t>(files.rank0.size()));
  EXPECT_EQ((*ckpt)->files()[0].crc32c, ReferenceCrc32c(files.rank0));
  EXPECT_EQ((*ckpt)->files()[1].name, "rank-00001.safetensors");
  EXPECT_EQ((*ckpt)->files()[1].crc32c, ReferenceCrc32c(files.rank1));
  EXPECT_EQ((*ckpt)->state()["step"], 20);

  std::vector<uint8_t> range(5000);
  ASSERT_TRUE((*ckpt)->ReadRange("rank-00000.safetensors", 1048570, absl::MakeSpan(range)).ok());
  EXPECT_TRUE(std::equal(range.begin(), range.end(), files.rank0.begin() + 1048570));
  std::vector<uint8_t> tail(99);
  ASSERT_TRUE((*ckpt)->ReadRange("rank-00001.safetensors", 4000, absl::MakeSpan(tail)).ok());
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), files.rank1.begin() + 4000));

  const absl::Status past_end =
      (*ckpt)->ReadRange("rank-00001.safetensors", 4000, absl::MakeSpan(range));
  EXPECT_EQ(past_end.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(past_end.message(), HasSubstr("rank-00001.safetensors"));
  EXPECT_EQ((*ckpt)->ReadRange("rank-00001.safetensors", -1, absl::MakeSpan(tail)).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*ckpt)->ReadRange("rank-00009.safetensors", 0, absl::MakeSpan(tail)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*ckpt)->Verify("rank-00009.safetensors").code(), absl::StatusCode::kNotFound);

  absl::StatusOr<std::vector<CheckpointEntry>> complete = ListComplete(dir);
  ASSERT_TRUE(complete.ok()) << complete.status();
  ASSERT_EQ(complete->size(), 1u);
  EXPECT_EQ((*complete)[0].step, 20);
}

TEST(CheckpointDirectoryTest, WritersOnSeveralThreadsAndAdoptedFiles) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, 3);
  ASSERT_TRUE(save.ok()) << save.status();
  constexpr int kRanks = 4;
  std::vector<absl::Status> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      results[r] = WriteInChunks(**save, "rank-0000" + std::to_string(r) + ".safetensors",
                                 RandomBytes(200000 + r, 100 + r), 4093);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  // A file written by a writer that needs a path (SafetensorsWriter) joins by adoption.
  const std::vector<uint8_t> adopted = RandomBytes(12345, 9);
  WriteFile((*save)->TempPath("extra.bin"), adopted);
  ASSERT_TRUE((*save)->AdoptFile("extra.bin").ok());
  ASSERT_TRUE((*save)->Commit(nlohmann::json::object()).ok());

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir + "/step-00000003");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ((*ckpt)->files().size(), kRanks + 1u);
  EXPECT_TRUE((*ckpt)->VerifyAll().ok());
  for (int r = 0; r < kRanks; ++r) {
    const CheckpointFileInfo* info =
        (*ckpt)->Find("rank-0000" + std::to_string(r) + ".safetensors");
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->crc32c, ReferenceCrc32c(RandomBytes(200000 + r, 100 + r)));
  }
  EXPECT_EQ((*ckpt)->Find("extra.bin")->crc32c, ReferenceCrc32c(adopted));
}

TEST(CheckpointDirectoryTest, BadNamesUnclosedWritersAndAbort) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 10);
  EXPECT_EQ(BeginSave(dir, -1).status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status exists = BeginSave(dir, 10).status();
  EXPECT_EQ(exists.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(exists.message(), HasSubstr(dir + "/step-00000010"));
  {
    absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, 20);
    ASSERT_TRUE(save.ok()) << save.status();
    for (const char* bad : {"", "a/b", ".hidden", "manifest.json"}) {
      EXPECT_EQ((*save)->OpenFile(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
    absl::StatusOr<std::unique_ptr<CheckpointFileWriter>> w = (*save)->OpenFile("rank-0.bin");
    ASSERT_TRUE(w.ok());
    EXPECT_EQ((*save)->OpenFile("rank-0.bin").status().code(), absl::StatusCode::kAlreadyExists);
    ASSERT_TRUE((*w)->Append("half").ok());
    const absl::Status unclosed = (*save)->Commit({});
    EXPECT_EQ(unclosed.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(unclosed.message(), HasSubstr("rank-0.bin"));
    EXPECT_THAT(Entries(dir, ".tmp-step-00000020-"), ::testing::SizeIs(1));
    // Destroyed without a successful Commit(): the temporary directory goes.
  }
  EXPECT_THAT(Entries(dir, ".tmp-"), IsEmpty());
  {
    absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, 30);
    ASSERT_TRUE(save.ok());
    absl::StatusOr<std::unique_ptr<CheckpointFileWriter>> w = (*save)->OpenFile("r.bin");
    ASSERT_TRUE((*save)->Abort().ok());
    EXPECT_THAT(Entries(dir, ".tmp-"), IsEmpty());
    EXPECT_EQ((*w)->Close().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*save)->OpenFile("s.bin").status().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(*FindLatest(dir), dir + "/step-00000010");
  ExpectStep(dir + "/step-00000010", 10);
}

TEST(CheckpointDirectoryTest, OverwriteReplacesAnExistingStepAtomically) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 10);
  absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, 10, {.overwrite = true});
  ASSERT_TRUE(save.ok()) << save.status();
  const std::vector<uint8_t> bytes = RandomBytes(777, 42);
  ASSERT_TRUE(WriteInChunks(**save, "only.bin", bytes, 50).ok());
  ASSERT_TRUE((*save)->Commit({{"generation", 2}}).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir + "/step-00000010");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->state()["generation"], 2);
  ASSERT_EQ((*ckpt)->files().size(), 1u);
  EXPECT_TRUE((*ckpt)->VerifyAll().ok());
  EXPECT_FALSE(fs::exists(dir + "/step-00000010/rank-00000.safetensors"));
  EXPECT_THAT(Entries(dir, ".tmp-"), IsEmpty());
}

// Where the child process dies.
enum class CrashPoint { kMidFile, kBeforeRename, kBeforeLatest };

class CheckpointDirectoryCrashTest : public ::testing::TestWithParam<CrashPoint> {};

TEST_P(CheckpointDirectoryCrashTest, PreviousCheckpointLoadsAndPruneCleansUp) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 10);

  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: the save of step 20, cut short. _exit() runs no destructor, as a kill would.
    absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, 20);
    if (!save.ok()) ::_exit(2);
    const StepFiles files = FilesOf(20);
    absl::StatusOr<std::unique_ptr<CheckpointFileWriter>> w =
        (*save)->OpenFile("rank-00000.safetensors");
    if (!w.ok()) ::_exit(3);
    const bool mid_file = GetParam() == CrashPoint::kMidFile;
    const size_t n = mid_file ? files.rank0.size() / 2 : files.rank0.size();
    if (!(*w)->Append(absl::MakeConstSpan(files.rank0.data(), n)).ok()) ::_exit(4);
    if (mid_file) ::_exit(0);
    if (!(*w)->Close().ok() || !(*save)->Seal({{"step", 20}}).ok()) ::_exit(5);
    if (GetParam() == CrashPoint::kBeforeRename) ::_exit(0);
    if (!(*save)->Publish().ok()) ::_exit(6);
    ::_exit(0);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  ASSERT_EQ(WEXITSTATUS(wstatus), 0);

  // What the dead save left behind.
  if (GetParam() == CrashPoint::kBeforeLatest) {
    EXPECT_TRUE(fs::exists(dir + "/step-00000020/manifest.json"));
    EXPECT_THAT(Entries(dir, ".tmp-"), IsEmpty());
  } else {
    EXPECT_THAT(Entries(dir, ".tmp-step-00000020-"), ::testing::SizeIs(1));
    EXPECT_FALSE(fs::exists(dir + "/step-00000020"));
  }

  EXPECT_EQ(*FindLatest(dir), dir + "/step-00000010");
  for (CheckpointFallback fallback :
       {CheckpointFallback::kNone, CheckpointFallback::kOlderVerified}) {
    absl::StatusOr<LoadableCheckpoint> loadable = FindLoadable(dir, fallback);
    ASSERT_TRUE(loadable.ok()) << loadable.status();
    EXPECT_EQ(loadable->checkpoint->path(), dir + "/step-00000010");
    EXPECT_EQ(loadable->note, "");
  }
  ExpectStep(dir + "/step-00000010", 10);

  ASSERT_TRUE(Prune(dir, 3).ok());
  EXPECT_THAT(Entries(dir, ""), UnorderedElementsAre("latest", "step-00000010"));
  // The resumed run saves step 20 again, without needing overwrite.
  SaveStep(dir, 20);
  ExpectStep(*FindLatest(dir), 20);
}

INSTANTIATE_TEST_SUITE_P(CrashPoints, CheckpointDirectoryCrashTest,
                         ::testing::Values(CrashPoint::kMidFile, CrashPoint::kBeforeRename,
                                           CrashPoint::kBeforeLatest));

TEST(CheckpointDirectoryTest, FlippedByteIsDetectedAndFallbackSaysWhy) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 10);
  SaveStep(dir, 20);
  const std::string victim = dir + "/step-00000020/rank-00001.safetensors";
  std::vector<uint8_t> bytes = ReadFile(victim);
  bytes[1234] ^= 0x10;
  WriteFile(victim, bytes);

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir + "/step-00000020");
  ASSERT_TRUE(ckpt.ok());
  EXPECT_TRUE((*ckpt)->Verify("rank-00000.safetensors").ok());
  const absl::Status bad = (*ckpt)->Verify("rank-00001.safetensors");
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.message(), HasSubstr(victim));
  EXPECT_THAT(bad.message(), HasSubstr("checksum mismatch"));

  const absl::StatusOr<LoadableCheckpoint> strict = FindLoadable(dir, CheckpointFallback::kNone);
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(strict.status().message(), HasSubstr(victim));

  absl::StatusOr<LoadableCheckpoint> loadable =
      FindLoadable(dir, CheckpointFallback::kOlderVerified);
  ASSERT_TRUE(loadable.ok()) << loadable.status();
  EXPECT_EQ(loadable->checkpoint->step(), 10);
  EXPECT_THAT(loadable->note, HasSubstr(dir + "/step-00000020"));
  EXPECT_THAT(loadable->note, HasSubstr("checksum mismatch"));
  EXPECT_THAT(loadable->note, HasSubstr(dir + "/step-00000010"));
}

TEST(CheckpointDirectoryTest, TruncatedMissingAndLongerFilesAreNamed) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 10);
  SaveStep(dir, 20);
  const std::string step_dir = dir + "/step-00000020";
  const std::string rank0 = step_dir + "/rank-00000.safetensors";
  const int64_t full = static_cast<int64_t>(FilesOf(20).rank0.size());
  fs::resize_file(rank0, 1000);

  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(step_dir);
  ASSERT_TRUE(ckpt.ok());
  const absl::Status truncated = (*ckpt)->Verify("rank-00000.safetensors");
  EXPECT_EQ(truncated.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(truncated.message(), HasSubstr(rank0));
  EXPECT_THAT(truncated.message(), HasSubstr("truncated: 1000 of " + std::to_string(full)));
  std::vector<uint8_t> range(100);
  const absl::Status short_read =
      (*ckpt)->ReadRange("rank-00000.safetensors", 950, absl::MakeSpan(range));
  EXPECT_EQ(short_read.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(short_read.message(), HasSubstr("truncated: 1000 of"));

  absl::StatusOr<LoadableCheckpoint> loadable =
      FindLoadable(dir, CheckpointFallback::kOlderVerified);
  ASSERT_TRUE(loadable.ok()) << loadable.status();
  EXPECT_EQ(loadable->checkpoint->step(), 10);
  EXPECT_THAT(loadable->note, HasSubstr("truncated"));

  const std::string rank1 = step_dir + "/rank-00001.safetensors";
  std::vector<uint8_t> longer = ReadFile(rank1);
  longer.push_back(0);
  WriteFile(rank1, longer);
  EXPECT_THAT((*ckpt)->Verify("rank-00001.safetensors").message(),
              HasSubstr("has 4100 bytes, the manifest lists 4099"));
  fs::remove(rank1);
  const absl::Status missing = (*ckpt)->Verify("rank-00001.safetensors");
  EXPECT_EQ(missing.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.message(), HasSubstr(rank1 + "': missing"));
}

TEST(CheckpointDirectoryTest, CorruptManifestsAndLatest) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  const absl::Status none = FindLatest(dir).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.message(), HasSubstr(dir + "/latest"));
  SaveStep(dir, 10);
  const std::string manifest = dir + "/step-00000010/manifest.json";
  const std::vector<uint8_t> original = ReadFile(manifest);

  // A changed digit that still parses: the manifest's own checksum catches it.
  std::string text(original.begin(), original.end());
  const size_t at = text.find("\"tokens\": 640");
  ASSERT_NE(at, std::string::npos);
  text[at + 10] = '7';
  WriteFile(manifest, {text.begin(), text.end()});
  absl::Status status = OpenCheckpoint(dir + "/step-00000010").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr(manifest));
  EXPECT_THAT(status.message(), HasSubstr("checksum mismatch"));

  WriteFile(manifest, {original.begin(), original.begin() + original.size() / 2});
  status = OpenCheckpoint(dir + "/step-00000010").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("not valid JSON"));

  // A newer format version, correctly checksummed, is refused as such.
  nlohmann::json j = nlohmann::json::parse(original);
  j["format_version"] = kCheckpointFormatVersion + 1;
  j.erase("manifest_crc32c");
  const std::string compact = j.dump();
  j["manifest_crc32c"] = Crc32cToHex(Crc32cExtend(0, compact.data(), compact.size()));
  const std::string newer = j.dump(2);
  WriteFile(manifest, {newer.begin(), newer.end()});
  status = OpenCheckpoint(dir + "/step-00000010").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("format version 2"));

  WriteFile(dir + "/latest", {'x', 'y', '\n'});
  EXPECT_EQ(FindLatest(dir).status().code(), absl::StatusCode::kDataLoss);
  const std::string gone = "step-00000099\n";
  WriteFile(dir + "/latest", {gone.begin(), gone.end()});
  status = FindLatest(dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(dir + "/step-00000099"));
  EXPECT_EQ(FindLoadable(dir, CheckpointFallback::kOlderVerified).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointDirectoryTest, DiskFullFailsTheSaveNamingTheFile) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  SaveStep(dir, 10);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A 64 KiB file-size limit: the write past it fails with EFBIG (SIGXFSZ ignored), as a
    // full disk fails with ENOSPC.
    ::close(pipe_fds[0]);
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    std::string report;
    {
      absl::StatusOr<std::unique_ptr<CheckpointSave>> save = BeginSave(dir, 20);
      if (save.ok()) {
        const absl::Status write =
            WriteInChunks(**save, "rank-00000.safetensors", FilesOf(20).rank0, 1 << 21);
        const absl::Status commit = (*save)->Commit({});
        report = absl::StrCat(static_cast<int>(write.code()), "|", write.message(), "|",
                              static_cast<int>(commit.code()), "|", commit.message());
      } else {
        report = save.status().ToString();
      }
    }  // The failed save is destroyed, which removes its temporary directory.
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) report.append(buf, n);
  ::close(pipe_fds[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));

  const std::vector<std::string> parts = absl::StrSplit(report, '|');
  ASSERT_EQ(parts.size(), 4u) << report;
  EXPECT_EQ(parts[0], std::to_string(static_cast<int>(absl::StatusCode::kResourceExhausted)));
  EXPECT_THAT(parts[1], HasSubstr("rank-00000.safetensors"));
  EXPECT_THAT(parts[1], HasSubstr(std::strerror(EFBIG)));
  EXPECT_EQ(parts[2], std::to_string(static_cast<int>(absl::StatusCode::kFailedPrecondition)));
  EXPECT_THAT(parts[3], HasSubstr("rank-00000.safetensors"));

  EXPECT_THAT(Entries(dir, ".tmp-"), IsEmpty());
  absl::StatusOr<LoadableCheckpoint> loadable = FindLoadable(dir, CheckpointFallback::kNone);
  ASSERT_TRUE(loadable.ok()) << loadable.status();
  EXPECT_EQ(loadable->checkpoint->step(), 10);
  ExpectStep(dir + "/step-00000010", 10);
}

TEST(CheckpointDirectoryTest, PruneKeepsTheNewestAndLatestAndSparesOpenSaves) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  for (int64_t step : {10, 20, 30, 40, 50}) SaveStep(dir, step);
  EXPECT_EQ(Prune(dir, 0).code(), absl::StatusCode::kInvalidArgument);

  // A stale temporary entry (of a process that died) goes; this process's open save stays.
  fs::create_directories(dir + "/.tmp-step-00000060-deadbeef/x");
  absl::StatusOr<std::unique_ptr<CheckpointSave>> open = BeginSave(dir, 70);
  ASSERT_TRUE(open.ok());
  const std::string open_temp = fs::path((*open)->current_path()).filename().string();
  ASSERT_TRUE(Prune(dir, 2).ok());
  EXPECT_THAT(Entries(dir, ""),
              UnorderedElementsAre("latest", "step-00000040", "step-00000050", open_temp));
  ASSERT_TRUE((*open)->Abort().ok());
  ExpectStep(dir + "/step-00000040", 40);
  ExpectStep(dir + "/step-00000050", 50);

  // `latest` moved back by hand (a rollback): keep_last counts back from it, it is never pruned,
  // and the newer directory, which loading ignores from now on, goes.
  const std::string back = "step-00000040\n";
  WriteFile(dir + "/latest", {back.begin(), back.end()});
  ASSERT_TRUE(Prune(dir, 1).ok());
  EXPECT_THAT(Entries(dir, ""), UnorderedElementsAre("latest", "step-00000040"));
  ExpectStep(*FindLatest(dir), 40);
}

// Issue 20: a kill -9 while pruning left an empty step directory behind. Pruning now renames a
// step aside (one atomic step) before deleting it, so a kill leaves only a `.tmp-` entry; both
// kinds of leftover are invisible to loading and removed by the next pruning or first save.
TEST(CheckpointDirectoryTest, LeftoversOfAKilledPruningAreIgnoredThenRemoved) {
  ScratchDir scratch;
  const std::string dir = scratch.Path("ckpt");
  for (int64_t step : {10, 20, 30}) SaveStep(dir, step);
  // Killed after the rename, during the deletion: part of step 10's files remain aside.
  fs::rename(dir + "/step-00000010", dir + "/.tmp-pruned-step-00000010");
  fs::remove(dir + "/.tmp-pruned-step-00000010/manifest.json");
  // Killed half-way through an in-place deletion (an older version): a step without manifest.
  fs::create_directories(dir + "/step-00000005");
  absl::StatusOr<std::vector<CheckpointEntry>> complete = ListComplete(dir);
  ASSERT_TRUE(complete.ok()) << complete.status();
  ASSERT_EQ(complete->size(), 2u);
  EXPECT_EQ((*complete)[0].step, 20);
  ExpectStep(*FindLatest(dir), 30);

  ASSERT_TRUE(RemoveCheckpointLeftovers(dir).ok());
  EXPECT_THAT(Entries(dir, ""), UnorderedElementsAre("latest", "step-00000020", "step-00000030"));

  // Pruning itself leaves nothing aside: step 20 goes, and only the kept steps remain.
  fs::create_directories(dir + "/.tmp-pruned-step-00000020");  // a stale one of the same name
  ASSERT_TRUE(Prune(dir, 1).ok());
  EXPECT_THAT(Entries(dir, ""), UnorderedElementsAre("latest", "step-00000030"));
  ExpectStep(*FindLatest(dir), 30);
}

}  // namespace
}  // namespace zt
