#include "offload/swap_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/offload/offload_test_util.h"

namespace zt::offload {
namespace {

using testing::FaultInjectionEnv;
using testing::GateEnv;
using ::testing::HasSubstr;
using testing::Pattern;
using testing::TempDir;

struct Warnings {
  std::vector<std::string> lines;
  WarningSink sink() {
    return [this](absl::string_view line) { lines.emplace_back(line); };
  }
};

SwapStoreOptions SmallStore(const std::string& dir) {
  return {
      .path = dir, .file_size = 4 << 20, .file_count = 2, .queue_depth = 4, .block_size = 16384};
}

SwapKey Key(uint32_t unit, SwapRole role, uint64_t generation, std::string job = "job-a") {
  return {.job = std::move(job),
          .unit = unit,
          .range_begin = 1024 * unit,
          .range_end = 1024 * (unit + 1),
          .role = role,
          .generation = generation};
}

// The whole extent of `key`, or the read's error.
absl::StatusOr<std::vector<std::byte>> ReadAll(SwapStore& store, const SwapKey& key) {
  auto length = store.Length(key);
  if (!length.ok()) return length.status();
  std::vector<std::byte> out(*length);
  auto n = store.Read(key, absl::MakeSpan(out));
  if (!n.ok()) return n.status();
  return out;
}

TEST(SwapStoreTest, RoundTripsManyExtentsAcrossCommitAndReopen) {
  TempDir dir;
  constexpr int kUnits = 60;
  // Sizes around the block and alignment edges; odd offsets make the sources unaligned.
  auto size_of = [](int u) { return static_cast<size_t>((u * 7919) % 70000 + (u % 3)); };
  std::vector<std::vector<std::byte>> data;
  {
    auto store = SwapStore::Open(SmallStore(dir.path()));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->open_report().created);
    for (int u = 0; u < kUnits; ++u) {
      for (SwapRole role : {SwapRole::kMaster, SwapRole::kMomentum}) {
        std::vector<std::byte> bytes = Pattern(size_of(u) + 1, u * 10 + static_cast<int>(role));
        // Written from one byte in, so the source is not page-aligned.
        ASSERT_TRUE((*store)->Write(Key(u, role, 1), absl::MakeSpan(bytes).subspan(1)).ok());
        data.emplace_back(bytes.begin() + 1, bytes.end());
      }
    }
    // Staged extents read back before the commit, too.
    auto staged = ReadAll(**store, Key(5, SwapRole::kMomentum, 1));
    ASSERT_TRUE(staged.ok()) << staged.status();
    EXPECT_EQ(*staged, data[11]);
    ASSERT_TRUE((*store)->Commit("job-a", 1).ok());
    EXPECT_EQ((*store)->CommittedGeneration("job-a"), 1u);
  }
  auto store = SwapStore::Open(SmallStore(dir.path()));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->open_report().unclean);
  EXPECT_EQ((*store)->stats().committed_extents, size_t{2 * kUnits});
  int i = 0;
  for (int u = 0; u < kUnits; ++u) {
    for (SwapRole role : {SwapRole::kMaster, SwapRole::kMomentum}) {
      auto got = ReadAll(**store, Key(u, role, 1));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, data[i++]) << SwapKeyText(Key(u, role, 1));
    }
  }
}

TEST(SwapStoreTest, NewGenerationCarriesForwardSlotsItDoesNotRewriteAndFreesReplacedOnes) {
  TempDir dir;
  auto store = SwapStore::Open(SmallStore(dir.path()));
  ASSERT_TRUE(store.ok()) << store.status();
  SwapStore& s = **store;
  const auto a1 = Pattern(50000, 1), b1 = Pattern(30000, 2), a2 = Pattern(50000, 3);
  ASSERT_TRUE(s.Write(Key(0, SwapRole::kMaster, 1), a1).ok());
  ASSERT_TRUE(s.Write(Key(1, SwapRole::kMaster, 1), b1).ok());
  ASSERT_TRUE(s.Commit("job-a", 1).ok());
  const uint64_t free_after_1 = s.stats().free_bytes;
  ASSERT_TRUE(s.Write(Key(0, SwapRole::kMaster, 2), a2).ok());
  ASSERT_TRUE(s.Commit("job-a", 2).ok());
  EXPECT_EQ(s.stats().free_bytes, free_after_1);  // a1's space came back
  EXPECT_EQ(*ReadAll(s, Key(0, SwapRole::kMaster, 2)), a2);
  EXPECT_EQ(*ReadAll(s, Key(1, SwapRole::kMaster, 2)), b1);
  // The old generation is gone, and the committed one cannot be written over.
  EXPECT_EQ(ReadAll(s, Key(0, SwapRole::kMaster, 1)).status().code(), absl::StatusCode::kNotFound);
  absl::Status over = s.Write(Key(0, SwapRole::kMaster, 2), a1);
  EXPECT_EQ(over.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(over.message(), HasSubstr("committed generation is 2"));
  ASSERT_TRUE(s.DropJob("job-a").ok());
  EXPECT_EQ(s.stats().free_bytes, s.stats().capacity_bytes);
}

// remove_when_closed: closing deletes the swap files and the index the store made, and the
// directory when that empties it; a file the store did not make, and the directory holding it,
// stay. Without it (the default) the store is there for the next open.
// A read moves while a write is in flight (the store's lanes): the write is held at the gate
// until the read has finished. With one lane the read waits for the lane the held write has,
// so the write is still held when its limit passes.
TEST(SwapStoreTest, AReadMovesWhileAWriteIsInFlight) {
  for (const uint32_t lanes : {2u, 1u}) {
    TempDir dir;
    GateEnv env(IoOp::Kind::kWrite, absl::Seconds(lanes == 2 ? 30 : 2));
    SwapStoreOptions options = SmallStore(dir.path());
    options.io_lanes = lanes;
    options.env = &env;
    auto store = SwapStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    const std::vector<std::byte> a = Pattern(40000, 1), b = Pattern(50000, 2);
    ASSERT_TRUE((*store)->Write(Key(0, SwapRole::kMaster, 1), a).ok());
    ASSERT_TRUE((*store)->Commit("job-a", 1).ok());
    env.Arm();
    absl::Status written;
    std::thread writer([&] { written = (*store)->Write(Key(1, SwapRole::kMaster, 2), b); });
    ASSERT_TRUE(env.WaitUntilHeld(absl::Seconds(10))) << lanes;
    auto read = ReadAll(**store, Key(0, SwapRole::kMaster, 1));
    env.Release();
    writer.join();
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(*read == a) << lanes;
    if (lanes == 2) {
      EXPECT_TRUE(written.ok()) << written;
      auto back = ReadAll(**store, Key(1, SwapRole::kMaster, 2));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_TRUE(*back == b);
    } else {
      EXPECT_EQ(written.code(), absl::StatusCode::kDeadlineExceeded) << written;
    }
  }
}

// An extent being read keeps its space while the read moves: a commit that replaces it frees
// it only once the read ends, so a write meanwhile cannot land on the bytes being read (first
// fit would put it there: checked below once the read has ended).
TEST(SwapStoreTest, AnExtentBeingReadIsNotReusedUntilTheReadEnds) {
  TempDir dir;
  GateEnv env(IoOp::Kind::kRead, absl::Seconds(30));
  SwapStoreOptions options = SmallStore(dir.path());
  options.file_count = 1;
  options.env = &env;
  auto store = SwapStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  SwapStore& s = **store;
  const std::vector<std::byte> first = Pattern(64 << 10, 1);
  ASSERT_TRUE(s.Write(Key(0, SwapRole::kMaster, 1), first).ok());
  ASSERT_TRUE(s.Commit("job-a", 1).ok());
  const uint64_t free_before = s.stats().free_bytes;
  env.Arm();
  absl::StatusOr<std::vector<std::byte>> read;
  std::thread reader([&] { read = ReadAll(s, Key(0, SwapRole::kMaster, 1)); });
  ASSERT_TRUE(env.WaitUntilHeld(absl::Seconds(10)));
  // Generation 2 replaces the slot: generation 1's extent is freed at the commit, but pinned.
  ASSERT_TRUE(s.Write(Key(0, SwapRole::kMaster, 2), Pattern(64 << 10, 2)).ok());
  ASSERT_TRUE(s.Commit("job-a", 2).ok());
  EXPECT_EQ(s.stats().free_bytes, free_before - (64 << 10)) << "the read's extent was freed";
  // A write of the same size now takes other space.
  ASSERT_TRUE(s.Write(Key(1, SwapRole::kMaster, 3), Pattern(64 << 10, 3)).ok());
  env.Release();
  reader.join();
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == first);
  // Freed now: the next write of that size takes the first extent's space again.
  EXPECT_EQ(s.stats().free_bytes, free_before - (64 << 10));
}

TEST(SwapStoreTest, RemoveWhenClosedDeletesWhatTheStoreMadeAndNothingElse) {
  TempDir dir;
  namespace fs = std::filesystem;
  const fs::path own = fs::path(dir.path()) / "own", shared = fs::path(dir.path()) / "shared",
                 kept = fs::path(dir.path()) / "kept";
  for (const fs::path& p : {own, shared, kept}) fs::create_directories(p);
  std::FILE* notes = std::fopen((shared / "notes.txt").c_str(), "w");
  ASSERT_NE(notes, nullptr);
  std::fclose(notes);
  for (const fs::path& p : {own, shared, kept}) {
    SwapStoreOptions options = SmallStore(p.string());
    options.remove_when_closed = p != kept;
    auto store = SwapStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Write(Key(0, SwapRole::kMaster, 1), Pattern(10000, 1)).ok());
    ASSERT_TRUE((*store)->Commit("job-a", 1).ok());
    ASSERT_TRUE(fs::exists(p / "swap-001.zts"));
    ASSERT_TRUE(fs::is_directory(p / "index"));
  }
  EXPECT_FALSE(fs::exists(own));
  EXPECT_TRUE(fs::exists(shared / "notes.txt"));
  EXPECT_FALSE(fs::exists(shared / "swap-000.zts"));
  EXPECT_FALSE(fs::exists(shared / "swap-001.zts"));
  EXPECT_FALSE(fs::exists(shared / "index"));
  EXPECT_TRUE(fs::exists(kept / "swap-000.zts"));
  auto reopened = SwapStore::Open(SmallStore(kept.string()));
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(*ReadAll(**reopened, Key(0, SwapRole::kMaster, 1)), Pattern(10000, 1));
}

TEST(SwapStoreTest, FlippedByteOnDiskIsDataLossNamingKeyAndFile) {
  TempDir dir;
  const SwapKey key = Key(3, SwapRole::kVariance, 1);
  {
    auto store = SwapStore::Open(SmallStore(dir.path()));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Write(key, Pattern(10000, 9)).ok());
    ASSERT_TRUE((*store)->Commit("job-a", 1).ok());
  }
  // The first extent of a fresh store starts at offset 0 of the first swap file.
  const std::string file = dir.path() + "/swap-000.zts";
  {
    const int fd = open(file.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c = 0;
    ASSERT_EQ(pread(fd, &c, 1, 1234), 1);
    c ^= 0x10;
    ASSERT_EQ(pwrite(fd, &c, 1, 1234), 1);
    fsync(fd);
    close(fd);
  }
  {
    auto store = SwapStore::Open(SmallStore(dir.path()));
    ASSERT_TRUE(store.ok()) << store.status();
    auto got = ReadAll(**store, key);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(got.status().message(), HasSubstr(SwapKeyText(key)));
    EXPECT_THAT(got.status().message(), HasSubstr(file));
    EXPECT_THAT(got.status().message(), HasSubstr("CRC32C"));
  }
  // Verifying at open finds it too: refused under kFail, discarded by default.
  SwapStoreOptions strict = SmallStore(dir.path());
  strict.verify_clean_stores = true;
  strict.recovery = RecoveryPolicy::kFail;
  auto refused = SwapStore::Open(strict);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(refused.status().message(), HasSubstr(file));
  Warnings warnings;
  strict.recovery = RecoveryPolicy::kVerifyOrDiscard;
  strict.warn = warnings.sink();
  auto discarded = SwapStore::Open(strict);
  ASSERT_TRUE(discarded.ok()) << discarded.status();
  EXPECT_TRUE((*discarded)->open_report().discarded);
  EXPECT_THAT((*discarded)->open_report().discard_reason, HasSubstr(SwapKeyText(key)));
  ASSERT_EQ(warnings.lines.size(), 1u);
  EXPECT_THAT(warnings.lines[0], HasSubstr("discarded"));
  EXPECT_EQ((*discarded)->CommittedGeneration("job-a"), 0u);
  EXPECT_EQ((*discarded)->stats().free_bytes, (*discarded)->stats().capacity_bytes);
}

// A crash at each stage of generation 2's commit, then a reopen: the store shows generation 1
// whole or generation 2 whole, never a mix, and the space of what was not committed is free.
class SwapStoreCrashTest : public ::testing::TestWithParam<CommitStage> {};

TEST_P(SwapStoreCrashTest, GenerationSwitchIsAtomic) {
  TempDir dir;
  constexpr int kUnits = 8;
  constexpr size_t kBytes = 40000;
  FaultInjectionEnv env;
  SwapStoreOptions options = SmallStore(dir.path());
  options.env = &env;
  uint64_t free_after_1 = 0;
  {
    auto store = SwapStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int u = 0; u < kUnits; ++u) {
      ASSERT_TRUE((*store)->Write(Key(u, SwapRole::kMaster, 1), Pattern(kBytes, 100 + u)).ok());
    }
    ASSERT_TRUE((*store)->Commit("job-a", 1).ok());
    free_after_1 = (*store)->stats().free_bytes;
    for (int u = 0; u < kUnits; ++u) {
      ASSERT_TRUE((*store)->Write(Key(u, SwapRole::kMaster, 2), Pattern(kBytes, 200 + u)).ok());
    }
    env.crash_at = GetParam();
    absl::Status commit = (*store)->Commit("job-a", 2);
    ASSERT_EQ(commit.code(), absl::StatusCode::kAborted) << commit;
    // A dead process does nothing more: the store refuses further calls.
    EXPECT_EQ((*store)->Write(Key(0, SwapRole::kMaster, 3), Pattern(10, 1)).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  env.DropUnsyncedData();  // the power cut takes what was never synced

  SwapStoreOptions reopen = SmallStore(dir.path());  // the real OS, as after a restart
  auto store = SwapStore::Open(reopen);
  ASSERT_TRUE(store.ok()) << store.status();
  const SwapOpenReport& report = (*store)->open_report();
  EXPECT_TRUE(report.unclean);
  EXPECT_FALSE(report.discarded) << report.discard_reason;
  EXPECT_EQ(report.extents_verified, size_t{kUnits});
  const uint64_t gen = (*store)->CommittedGeneration("job-a");
  EXPECT_EQ(gen, GetParam() == CommitStage::kIndexCommitted ? 2u : 1u);
  for (int u = 0; u < kUnits; ++u) {
    auto got = ReadAll(**store, Key(u, SwapRole::kMaster, gen));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, Pattern(kBytes, (gen == 1 ? 100 : 200) + u)) << "unit " << u;
  }
  EXPECT_EQ((*store)->stats().free_bytes, free_after_1);  // staged space reclaimed
}

INSTANTIATE_TEST_SUITE_P(EveryStage, SwapStoreCrashTest,
                         ::testing::Values(CommitStage::kDataWritten, CommitStage::kDataDurable,
                                           CommitStage::kIndexCommitted),
                         [](const auto& info) {
                           std::string name(CommitStageName(info.param));
                           std::erase(name, ' ');
                           return name;
                         });

// The child half of UncleanStopIsVerifiedAtReopen, in a process of its own: it commits
// generation 1, stages generation 2 and dies by SIGKILL. It runs before main when the variable
// names a directory, so it is no test of its own; any failure exits with status 3.
void RunKilledChild(const char* dir) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "killed child: %s\n", s.ToString().c_str());
    _exit(3);
  };
  auto store = SwapStore::Open(SmallStore(dir));
  if (!store.ok()) fail(store.status());
  for (int u = 0; u < 4; ++u) {
    if (auto s = (*store)->Write(Key(u, SwapRole::kParameters, 1), Pattern(30000, u)); !s.ok()) {
      fail(s);
    }
  }
  if (auto s = (*store)->Commit("job-a", 1); !s.ok()) fail(s);
  for (int u = 0; u < 4; ++u) {
    if (auto s = (*store)->Write(Key(u, SwapRole::kParameters, 2), Pattern(30000, 50 + u));
        !s.ok()) {
      fail(s);
    }
  }
  raise(SIGKILL);
}

constexpr char kKilledChildVariable[] = "ZT_OFFLOAD_KILLED_CHILD_DIR";
[[maybe_unused]] const bool kRanKilledChild = [] {
  const char* dir = std::getenv(kKilledChildVariable);
  if (dir != nullptr) RunKilledChild(dir);
  return dir != nullptr;
}();

TEST(SwapStoreTest, UncleanStopIsVerifiedAtReopen) {
  TempDir dir;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // A fresh image of this binary, so the child shares no threads or locks with the parent.
    setenv(kKilledChildVariable, dir.path().c_str(), 1);
    execl("/proc/self/exe", "offload_test", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;

  auto store = SwapStore::Open(SmallStore(dir.path()));
  ASSERT_TRUE(store.ok()) << store.status();
  const SwapOpenReport& report = (*store)->open_report();
  EXPECT_TRUE(report.unclean);
  EXPECT_EQ(report.extents_verified, 4u);
  EXPECT_FALSE(report.discarded);
  EXPECT_EQ((*store)->CommittedGeneration("job-a"), 1u);
  for (int u = 0; u < 4; ++u) {
    auto got = ReadAll(**store, Key(u, SwapRole::kParameters, 1));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, Pattern(30000, u));
  }
  // Generation 2 was staged only: its space is free again.
  EXPECT_EQ((*store)->stats().free_bytes, (*store)->stats().capacity_bytes - 4 * 32768);
}

// Regression: a refused open's destructor marked the store clean, so the open after it trusted
// the store it had just refused without verifying it.
TEST(SwapStoreTest, RefusedOpenLeavesTheStoreToBeVerifiedAgain) {
  TempDir dir;
  FaultInjectionEnv env;
  SwapStoreOptions options = SmallStore(dir.path());
  options.env = &env;
  {
    auto store = SwapStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Write(Key(0, SwapRole::kMaster, 1), Pattern(20000, 1)).ok());
    env.crash_at = CommitStage::kIndexCommitted;
    ASSERT_FALSE((*store)->Commit("job-a", 1).ok());
  }
  // The unclean store's one extent then rots on disk.
  const std::string file = dir.path() + "/swap-000.zts";
  const int fd = open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "X", 1, 100), 1);
  close(fd);
  SwapStoreOptions strict = SmallStore(dir.path());
  strict.recovery = RecoveryPolicy::kFail;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto refused = SwapStore::Open(strict);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << "attempt " << attempt;
  }
}

TEST(SwapStoreTest, SwapFileRemovedUnderACleanIndexIsNotTrusted) {
  TempDir dir;
  {
    auto store = SwapStore::Open(SmallStore(dir.path()));
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Write(Key(0, SwapRole::kMaster, 1), Pattern(20000, 1)).ok());
    ASSERT_TRUE((*store)->Commit("job-a", 1).ok());
  }
  std::filesystem::remove(dir.path() + "/swap-000.zts");
  Warnings warnings;
  SwapStoreOptions options = SmallStore(dir.path());
  options.warn = warnings.sink();
  auto store = SwapStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->open_report().discarded);
  EXPECT_THAT((*store)->open_report().discard_reason, HasSubstr("swap-000.zts"));
  EXPECT_EQ((*store)->CommittedGeneration("job-a"), 0u);
}

TEST(SwapStoreTest, FullSwapFilesAreResourceExhaustedNamingPathAndBytes) {
  TempDir dir;
  SwapStoreOptions options = SmallStore(dir.path());
  options.file_size = 64 << 10;
  options.file_count = 1;
  auto store = SwapStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Write(Key(0, SwapRole::kMaster, 1), Pattern(40000, 1)).ok());
  absl::Status full = (*store)->Write(Key(1, SwapRole::kMaster, 1), Pattern(40000, 2));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr(dir.path()));
  EXPECT_THAT(full.message(), HasSubstr("needs 40960 bytes"));
  // The failure left the store usable.
  EXPECT_TRUE((*store)->Commit("job-a", 1).ok());
}

TEST(SwapStoreTest, EnospcFromTheFilesystemIsResourceExhaustedAndFreesTheExtent) {
  TempDir dir;
  FaultInjectionEnv env;
  SwapStoreOptions options = SmallStore(dir.path());
  options.env = &env;
  auto store = SwapStore::Open(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t free_before = (*store)->stats().free_bytes;
  env.write_budget = 8192;
  absl::Status s = (*store)->Write(Key(0, SwapRole::kMaster, 1), Pattern(100000, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr(dir.path() + "/swap-"));
  EXPECT_THAT(s.message(), HasSubstr(SwapKeyText(Key(0, SwapRole::kMaster, 1))));
  EXPECT_EQ((*store)->stats().free_bytes, free_before);
}

// Root only: a 4 MiB tmpfs cannot hold 8 MiB of swap files, and open says so.
TEST(SwapStoreTest, FullDiskAtOpenNamesPathAndBytes) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a size-limited tmpfs needs root";
  TempDir dir;
  if (mount("tmpfs", dir.path().c_str(), "tmpfs", 0, "size=4m") != 0) {
    GTEST_SKIP() << "mount -t tmpfs refused: " << std::strerror(errno);
  }
  Warnings warnings;
  SwapStoreOptions options = SmallStore(dir.path());
  options.file_size = 8 << 20;
  options.file_count = 1;
  options.warn = warnings.sink();
  auto store = SwapStore::Open(options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(store.status().message(), HasSubstr(dir.path() + "/swap-000.zts"));
  EXPECT_THAT(store.status().message(), HasSubstr("needs 8388608 bytes"));
  // Nothing of the failed store is left on the small disk.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  store = absl::StatusOr<std::unique_ptr<SwapStore>>();
  EXPECT_EQ(umount(dir.path().c_str()), 0) << std::strerror(errno);
}

// The names in `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// A disk that fills while the store preallocates its files: the open fails naming the file and
// the bytes, and what it made (the files before, the index) is gone with it, so a failed open
// holds none of the space the checkpoints share; what was there before stays.
TEST(SwapStoreTest, AFailedOpenRemovesWhatItMadeAndNothingElse) {
  TempDir dir;
  const std::string foreign = dir.path() + "/checkpoint-0001";
  close(open(foreign.c_str(), O_CREAT | O_WRONLY, 0600));
  FaultInjectionEnv env;
  SwapStoreOptions options = SmallStore(dir.path());
  options.file_count = 3;
  options.env = &env;
  env.preallocate_budget = 2 * options.file_size;  // the third file does not fit
  auto store = SwapStore::Open(options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(store.status().message(), HasSubstr(dir.path() + "/swap-002.zts"));
  EXPECT_THAT(store.status().message(), HasSubstr("needs 4194304 bytes"));
  EXPECT_THAT(Entries(dir.path()), ::testing::ElementsAre("checkpoint-0001"));

  // A store that exists keeps its files and index when a reopen fails: only the file the
  // reopen made again (removed by hand) goes.
  env.preallocate_budget.reset();
  {
    auto made = SwapStore::Open(options);
    ASSERT_TRUE(made.ok()) << made.status();
  }
  const std::vector<std::string> whole = Entries(dir.path());
  ASSERT_EQ(whole.size(), 5u);  // the foreign file, the index, three swap files
  std::filesystem::remove(dir.path() + "/swap-001.zts");
  env.preallocate_budget = options.file_size;  // swap-000 (already there) fits, swap-001 not
  store = SwapStore::Open(options);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(store.status().message(), HasSubstr(dir.path() + "/swap-001.zts"));
  std::vector<std::string> left = whole;
  std::erase(left, "swap-001.zts");
  EXPECT_EQ(Entries(dir.path()), left);
}

TEST(SwapStoreTest, BadPathsAreRefusedByName) {
  TempDir dir;
  const std::string missing = dir.path() + "/no/such/dir";
  auto s = SwapStore::Open(SmallStore(missing));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr(missing));

  const std::string file = dir.path() + "/a-file";
  close(open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  s = SwapStore::Open(SmallStore(file));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr(file));

  SwapStoreOptions bad = SmallStore(dir.path());
  bad.block_size = 1000;
  EXPECT_THAT(SwapStore::Open(bad).status().message(), HasSubstr("block_size 1000"));

  if (geteuid() == 0) {
    // Root writes through permission bits; a read-only mount stops even root.
    const std::string ro = dir.path() + "/ro";
    std::filesystem::create_directory(ro);
    if (mount("tmpfs", ro.c_str(), "tmpfs", MS_RDONLY, "size=1m") == 0) {
      s = SwapStore::Open(SmallStore(ro));
      EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
      EXPECT_THAT(s.status().message(), HasSubstr(ro));
      umount(ro.c_str());
    }
  } else {
    const std::string locked = dir.path() + "/locked";
    std::filesystem::create_directory(locked);
    chmod(locked.c_str(), 0500);
    s = SwapStore::Open(SmallStore(locked));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(s.status().message(), HasSubstr(locked));
    chmod(locked.c_str(), 0700);
  }
}

TEST(SwapStoreTest, SecondOpenOfTheSameStoreIsRefused) {
  TempDir dir;
  auto first = SwapStore::Open(SmallStore(dir.path()));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SwapStore::Open(SmallStore(dir.path()));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("one swap store"));
}

TEST(SwapStoreTest, DifferentGeometryIsRefused) {
  TempDir dir;
  ASSERT_TRUE(SwapStore::Open(SmallStore(dir.path())).ok());
  SwapStoreOptions other = SmallStore(dir.path());
  other.file_count = 3;
  auto s = SwapStore::Open(other);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("2 swap files"));
}

// Placement: a job's extents go to its own file first, so two jobs writing at once (a node's
// ranks) keep out of each other's space; they spill over into the next file only when theirs
// is full.
TEST(SwapStoreTest, PlacementKeepsEachJobInItsOwnFile) {
  TempDir dir;
  SwapStoreOptions options = SmallStore(dir.path());
  options.file_size = 2 * 65536;
  auto opened = SwapStore::Open(options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  SwapStore& store = **opened;
  EXPECT_EQ(store.file_count(), 2u);
  ASSERT_TRUE(store.SetPlacement("job-b", 1).ok());
  EXPECT_EQ(store.SetPlacement("job-b", 2).code(), absl::StatusCode::kInvalidArgument);
  // Generations of both jobs, interleaved extent by extent: each file holds exactly two
  // generations of its job, so any sharing of a file would run out of space.
  for (uint64_t g = 1; g <= 6; ++g) {
    for (uint32_t u = 0; u < 2; ++u) {
      for (const char* job : {"job-a", "job-b"}) {
        const auto data = Pattern(u == 0 ? 40000 : 20000, static_cast<uint32_t>(g * 10 + u));
        ASSERT_TRUE(store.Write(Key(u, SwapRole::kMaster, g, job), data).ok())
            << job << " generation " << g;
      }
    }
    ASSERT_TRUE(store.Commit("job-a", g).ok());
    ASSERT_TRUE(store.Commit("job-b", g).ok());
  }
  // Generation 5 of job-b (the first of its two slots' turn) starts file 1.
  std::vector<std::byte> raw(40000);
  const int fd = open((std::filesystem::path(dir.path()) / "swap-001.zts").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pread(fd, raw.data(), raw.size(), 0), static_cast<ssize_t>(raw.size()));
  close(fd);
  EXPECT_EQ(raw, Pattern(40000, 50));
  EXPECT_EQ(*ReadAll(store, Key(0, SwapRole::kMaster, 6, "job-b")), Pattern(40000, 60));
  EXPECT_EQ(*ReadAll(store, Key(1, SwapRole::kMaster, 6, "job-a")), Pattern(20000, 61));
}

}  // namespace
}  // namespace zt::offload
