// The control plane under ordinary abuse (issue 20), against real `ztd` daemons on loopback:
// idle sockets on the metrics port, token files others can read, a state disk that fills and
// frees, many concurrent clients, a coordinator killed during submits, fuzzed specs.
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/control_plane_clients.h"
#include "tests/integration/daemon_cluster.h"
#include "tests/integration/loopback_http.h"

namespace zt::testing {
namespace {

class ControlPlaneRobustnessTest : public DaemonClusterTest {
 protected:
  std::string Token() const {
    std::string t = ReadText(state_dir_ + "/token");
    while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
    return t;
  }
  bool CoordinatorAlive() { return coordinator_ != nullptr && !coordinator_->Poll().has_value(); }
};

// "CODE message" of a failed call, for failure lists.
std::string Describe(const char* call, const grpc::Status& status) {
  return absl::StrCat(call, ": ", status.error_code(), " ", status.error_message());
}

// Timed assertion: a functional bound, not a performance figure. With civetweb's defaults the
// scrape waits 30 s (2 workers, each held by an idle connection until its 30 s request
// timeout); the bound of 1 s leaves a 30x margin on either side on a loaded 2-core machine.
TEST_F(ControlPlaneRobustnessTest, ScrapeAnswersWithinASecondWithAHundredIdleConnectionsOpen) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  ASSERT_NO_FATAL_FAILURE(StartNode("node-a"));
  const std::pair<std::string, int> endpoints[] = {{"coordinator", MetricsPort(*coordinator_)},
                                                   {"node", MetricsPort(*nodes_["node-a"])}};
  for (const auto& [who, port] : endpoints) {
    SCOPED_TRACE(who);
    IdleConnections idle(port, 100);
    ASSERT_EQ(idle.size(), 100u);
    // Let the server accept them all and hand them to its workers before the scrape queues.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const Scrape scrape = ScrapeMetrics(port, std::chrono::seconds(10));
    ASSERT_FALSE(scrape.response.empty()) << "no answer within 10 s";
    EXPECT_LT(scrape.seconds, 1.0);
    EXPECT_NE(scrape.response.find(" 200 "), std::string::npos) << scrape.response.substr(0, 200);
    EXPECT_NE(scrape.response.find("# TYPE "), std::string::npos);
  }
}

mode_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// A copy of `from` at `to` with `mode`.
void CopyWithMode(const std::string& from, const std::string& to, mode_t mode) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(::chmod(to.c_str(), mode), 0);
}

TEST_F(ControlPlaneRobustnessTest, FilesZtdWritesAreOwnerOnly) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  EXPECT_EQ(ModeOf(state_dir_ + "/token"), 0600u);
  EXPECT_EQ(ModeOf(state_dir_ + "/address"), 0600u);
  EXPECT_EQ(ModeOf(state_dir_), 0700u) << "ztd created the state directory";
}

TEST_F(ControlPlaneRobustnessTest, TokenFileOthersCanReadIsRefusedByZtAndZtdNamingModeAndFix) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  const std::string open_token = Path("open-token");
  ASSERT_NO_FATAL_FAILURE(CopyWithMode(state_dir_ + "/token", open_token, 0644));
  auto expect_refused = [&](const std::string& output, const std::string& path, const char* mode) {
    EXPECT_NE(output.find(path), std::string::npos) << output;
    EXPECT_NE(output.find(mode), std::string::npos) << output;
    EXPECT_NE(output.find("chmod 600"), std::string::npos) << output;
  };

  // zt, with --token-file and through $ZT_STATE_DIR/token.
  const RunResult flagged = Zt("list --token-file " + open_token);
  EXPECT_EQ(flagged.exit_code, 2) << flagged.output;
  expect_refused(flagged.output, open_token, "0644");
  ASSERT_EQ(::chmod((state_dir_ + "/token").c_str(), 0640), 0);
  const RunResult from_state_dir = Zt("list");
  EXPECT_EQ(from_state_dir.exit_code, 2) << from_state_dir.output;
  expect_refused(from_state_dir.output, state_dir_ + "/token", "0640");
  ASSERT_EQ(::chmod((state_dir_ + "/token").c_str(), 0600), 0);
  EXPECT_EQ(Zt("list").exit_code, 0);
  EXPECT_EQ(Zt("train --help").exit_code, 0);

  // ztd --node and ztd --coordinator --token-file.
  const std::vector<std::vector<std::string>> daemons = {
      {"--node", "--coordinator-addr", address_, "--token-file", open_token, "--metrics-addr",
       "off", "--node-id", "refused"},
      {"--coordinator", "--listen", "127.0.0.1:0", "--state-dir", Path("other-state"),
       "--token-file", open_token, "--metrics-addr", "off"}};
  for (const std::vector<std::string>& args : daemons) {
    ZtProcess ztd(args, Path("refused-" + args[0].substr(2) + ".log"), "ztd");
    ASSERT_TRUE(ztd.started());
    EXPECT_EQ(ztd.WaitUntil(Clock::now() + std::chrono::seconds(30)), 2) << ztd.Output();
    expect_refused(ztd.Output(), open_token, "0644");
  }
}

// N clients mix every job call for T seconds while simulated nodes heartbeat; every call is
// well formed, so every call must succeed. The clients' calls wait for their channel to be
// ready (within the deadline): connection set-up under load is the client channel's concern
// (worker/node/control_channel.cc), what this asserts is that the coordinator answers all.
TEST_F(ControlPlaneRobustnessTest, ConcurrentClientsMixingEveryCallWhileNodesHeartbeatNeverFail) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  const std::string token = Token();
  constexpr int kClients = 16;
  constexpr auto kDuration = std::chrono::seconds(8);
  SimulatedNodes nodes(address_, token, /*count=*/2, /*devices=*/4, std::chrono::milliseconds(100));
  struct Tally {
    int calls = 0;
    std::vector<std::string> failures;
  };
  std::vector<Tally> tallies(kClients);
  const auto end = Clock::now() + kDuration;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      JobClient client(address_, token);
      Tally& tally = tallies[c];
      auto record = [&](const char* call, const grpc::Status& status) {
        ++tally.calls;
        if (!status.ok()) tally.failures.push_back(Describe(call, status));
      };
      std::mt19937 rng(static_cast<unsigned>(c));
      std::vector<std::string> mine;
      for (int n = 0; Clock::now() < end; ++n) {
        const int op = mine.empty() ? 0 : static_cast<int>(rng() % 5);
        const std::string some = mine.empty() ? "" : mine[rng() % mine.size()];
        if (op == 0) {
          zerotrain::SubmitJobRequest request;
          *request.mutable_spec() = TinySpec(absl::StrCat("c", c, "-", n), dir_.string());
          zerotrain::Job job;
          record("SubmitJob", client.jobs->SubmitJob(client.Context().get(), request, &job));
          if (!job.id().empty()) mine.push_back(job.id());
        } else if (op == 1) {
          zerotrain::ListJobsRequest request;
          request.set_page_size(10);
          zerotrain::ListJobsResponse response;
          record("ListJobs", client.jobs->ListJobs(client.Context().get(), request, &response));
        } else if (op == 2) {
          zerotrain::GetJobRequest request;
          request.set_job_id(some);
          zerotrain::Job job;
          record("GetJob", client.jobs->GetJob(client.Context().get(), request, &job));
        } else if (op == 3) {
          // A watcher that reads the history's first event, then hangs up.
          zerotrain::WatchJobRequest request;
          request.set_job_id(some);
          auto context = client.Context();
          auto reader = client.jobs->WatchJob(context.get(), request);
          zerotrain::JobEvent event;
          const bool got = reader->Read(&event);
          context->TryCancel();
          while (reader->Read(&event)) {
          }
          const grpc::Status status = reader->Finish();
          record("WatchJob", got || status.ok() ? grpc::Status::OK : status);
        } else {
          zerotrain::CancelJobRequest request;
          request.set_job_id(some);
          zerotrain::Job job;
          record("CancelJob", client.jobs->CancelJob(client.Context().get(), request, &job));
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  int calls = 0;
  std::vector<std::string> failures;
  for (const Tally& t : tallies) {
    calls += t.calls;
    failures.insert(failures.end(), t.failures.begin(), t.failures.end());
  }
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << calls
                                << " calls failed; first: " << failures.front();
  EXPECT_GT(calls, 10 * kClients) << "too few calls for a load test";
  EXPECT_EQ(nodes.failures(), 0);
  EXPECT_GT(nodes.heartbeats(), 20);
  EXPECT_TRUE(CoordinatorAlive()) << coordinator_->Output();
}

// kill -9 of the coordinator while 8 clients submit: after the restart every job whose submit
// was acknowledged is there with its spec, and no job is there twice (every submit has its own
// name; the ones in flight at the kill may or may not be there, once at most).
TEST_F(ControlPlaneRobustnessTest, CoordinatorKilledDuringSubmitsKeepsEveryAcknowledgedJobOnce) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  const std::string token = Token();
  const int port = CoordinatorPort();
  constexpr int kClients = 8;
  std::mutex mu;
  std::map<std::string, std::string> acknowledged;  // job id -> name
  std::atomic<bool> stop{false};
  std::atomic<int> acks{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      JobClient client(address_, token);
      for (int n = 0; !stop.load(); ++n) {
        zerotrain::SubmitJobRequest request;
        *request.mutable_spec() = TinySpec(absl::StrCat("k", c, "-", n), dir_.string());
        zerotrain::Job job;
        if (client.jobs->SubmitJob(client.Context(std::chrono::seconds(3)).get(), request, &job)
                .ok()) {
          std::lock_guard<std::mutex> lock(mu);
          acknowledged[job.id()] = job.spec().name();
          acks.fetch_add(1);
        }
      }
    });
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (acks.load() < 150 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  coordinator_->Kill();  // SIGKILL in the middle of the submits
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  stop.store(true);
  for (std::thread& t : clients) t.join();
  ASSERT_GE(acknowledged.size(), 150u);

  ASSERT_NO_FATAL_FAILURE(StartCoordinator(port));
  JobClient client(address_, Token());
  for (const auto& [id, name] : acknowledged) {
    zerotrain::GetJobRequest request;
    request.set_job_id(id);
    zerotrain::Job job;
    const grpc::Status status = client.jobs->GetJob(client.Context().get(), request, &job);
    ASSERT_TRUE(status.ok()) << "acknowledged job " << id << " lost: " << status.error_message();
    EXPECT_EQ(job.spec().name(), name);
  }
  // Every job, page by page.
  std::map<std::string, int> by_name;
  int listed = 0;
  zerotrain::ListJobsRequest list;
  list.set_page_size(1000);
  do {
    zerotrain::ListJobsResponse page;
    ASSERT_TRUE(client.jobs->ListJobs(client.Context().get(), list, &page).ok());
    for (const zerotrain::JobSummary& job : page.jobs()) ++by_name[job.name()];
    listed += page.jobs_size();
    list.set_page_token(page.next_page_token());
  } while (!list.page_token().empty());
  for (const auto& [name, count] : by_name) EXPECT_EQ(count, 1) << name << " is there twice";
  EXPECT_GE(listed, static_cast<int>(acknowledged.size()));
  EXPECT_LE(listed, static_cast<int>(acknowledged.size()) + kClients)
      << "more jobs than acknowledged submits plus those in flight at the kill";
}

// Random mutations of a valid spec through the real RPC: flipped, inserted, deleted and
// truncated bytes of the serialized request (so the server's parser sees them too), and
// field values set to extremes through reflection. The daemon answers every call (never
// UNAVAILABLE, DEADLINE_EXCEEDED or UNKNOWN) and is alive and serving afterwards.
std::string MutateBytes(std::string bytes, std::mt19937& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !bytes.empty(); ++e) {
    const size_t at = rng() % bytes.size();
    switch (rng() % 4) {
      case 0:
        bytes[at] = static_cast<char>(bytes[at] ^ (1u << (rng() % 8)));
        break;
      case 1:
        bytes.insert(at, 1 + rng() % 8, static_cast<char>(rng()));
        break;
      case 2:
        bytes.erase(at, 1 + rng() % 8);
        break;
      default:
        bytes.resize(at);
    }
  }
  return bytes;
}

// Sets one random scalar field somewhere in `message` (set or not) to an extreme value.
void MutateField(google::protobuf::Message* message, std::mt19937& rng, int depth = 0) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = message->GetDescriptor();
  const google::protobuf::Reflection* r = message->GetReflection();
  if (d->field_count() == 0) return;
  const FieldDescriptor* f = d->field(static_cast<int>(rng() % d->field_count()));
  if (f->type() == FieldDescriptor::TYPE_MESSAGE) {
    if (depth < 6 && !f->is_repeated()) MutateField(r->MutableMessage(message, f), rng, depth + 1);
    return;
  }
  const int64_t ints[] = {0,
                          -1,
                          1,
                          std::numeric_limits<int32_t>::max(),
                          std::numeric_limits<int32_t>::min(),
                          1 << 20,
                          static_cast<int32_t>(rng())};
  const double reals[] = {0,    -1,    std::nan(""), std::numeric_limits<double>::infinity(),
                          1e30, -1e-30};
  const std::string strings[] = {
      "", "..", "a/../../etc", std::string(300, 'a'), std::string("x\0y", 3), "shard_*.bin", "/"};
  const int64_t i = ints[rng() % std::size(ints)];
  const double x = reals[rng() % std::size(reals)];
  const std::string& str = strings[rng() % std::size(strings)];
  if (f->is_repeated()) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      for (int k = static_cast<int>(rng() % 3); k >= 0; --k) r->AddString(message, f, str);
    } else {
      r->ClearField(message, f);
    }
    return;
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(message, f, static_cast<int32_t>(i));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(message, f, i * (rng() % 2 ? 1 : 1 << 30));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(message, f, static_cast<uint32_t>(i));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(message, f, static_cast<uint64_t>(i));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(message, f, static_cast<float>(x));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(message, f, x);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(message, f, !r->GetBool(*message, f));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      r->SetEnumValue(message, f, static_cast<int>(rng() % 12) - 1);
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(message, f, str);
      break;
    default:
      break;
  }
}

bool Answered(const grpc::Status& status) {
  return status.error_code() != grpc::StatusCode::UNAVAILABLE &&
         status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
         status.error_code() != grpc::StatusCode::UNKNOWN;
}

TEST_F(ControlPlaneRobustnessTest, FuzzedSpecsThroughTheRealRpcAreAnsweredAndNeverCrashTheDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator());
  JobClient client(address_, Token());
  zerotrain::SubmitJobRequest valid;
  *valid.mutable_spec() = TinySpec("fuzz", dir_.string());
  const std::string valid_bytes = valid.SerializeAsString();
  grpc::GenericStub generic(client.channel);
  std::mt19937 rng(20);
  constexpr int kEach = 250;
  std::vector<std::string> unanswered;
  for (int n = 0; n < kEach; ++n) {
    const std::string bytes = MutateBytes(valid_bytes, rng);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer response;
    auto context = client.Context(std::chrono::seconds(10));
    std::promise<grpc::Status> done;
    generic.UnaryCall(context.get(), "/zerotrain.JobService/SubmitJob", grpc::StubOptions(),
                      &request, &response, [&](grpc::Status s) { done.set_value(std::move(s)); });
    const grpc::Status status = done.get_future().get();
    if (!Answered(status)) unanswered.push_back(Describe("bytes", status));
  }
  for (int n = 0; n < kEach; ++n) {
    zerotrain::SubmitJobRequest request = valid;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
      MutateField(request.mutable_spec(), rng);
    }
    zerotrain::Job job;
    const grpc::Status status =
        client.jobs->SubmitJob(client.Context(std::chrono::seconds(10)).get(), request, &job);
    if (!Answered(status)) {
      unanswered.push_back(
          absl::StrCat(Describe("fields", status), " for ", request.spec().ShortDebugString()));
    }
  }
  EXPECT_TRUE(unanswered.empty()) << unanswered.size()
                                  << " unanswered; first: " << unanswered.front();
  ASSERT_TRUE(CoordinatorAlive()) << coordinator_->Output();
  zerotrain::Job job;
  const grpc::Status after = client.jobs->SubmitJob(client.Context().get(), valid, &job);
  EXPECT_TRUE(after.ok()) << after.error_message();
}

// A small tmpfs as the state disk, filled by submits, then grown: the coordinator refuses
// writes cleanly before RocksDB meets ENOSPC (which aborts Debian's RocksDB), writes again by
// itself once the disk is grown, and zt_store_writable says 0 then 1. Needs root (mount); the fault
// seam test (tests/unit/daemon/coordinator_store_faults_test.cc) covers the same everywhere.
TEST_F(ControlPlaneRobustnessTest, FullStateTmpfsRecoversWithoutARestartOnceGrown) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  std::filesystem::create_directories(state_dir_);
  if (::mount("tmpfs", state_dir_.c_str(), "tmpfs", 0, "size=3m,mode=0700") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << state_dir_ << ": " << std::strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{state_dir_};
  // A reserve of 1 MiB on the 3 MiB disk (the default, 16 MiB, would refuse every write).
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(0, {"--state-reserve-mib", "1"}));
  JobClient client(address_, Token());
  auto metric = [&](const std::string& name) {
    const Scrape scrape = ScrapeMetrics(MetricsPort(*coordinator_), std::chrono::seconds(10));
    const size_t at = scrape.response.find("\n" + name + " ");
    return at == std::string::npos ? std::string("absent")
                                   : scrape.response.substr(at + name.size() + 2, 1);
  };
  // The gauge follows within a background pass of the coordinator.
  auto metric_becomes = [&](const std::string& name, const std::string& value) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (metric(name) != value && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return metric(name);
  };
  EXPECT_EQ(metric("zt_store_writable"), "1");
  // Specs of ~200 KiB (paths are not opened by the coordinator) fill 3 MiB within a few dozen.
  zerotrain::SubmitJobRequest big;
  *big.mutable_spec() = TinySpec("big", dir_.string());
  for (int i = 0; i < 2000; ++i) {
    big.mutable_spec()->mutable_data()->add_train(
        absl::StrCat(dir_.string(), "/shard-", i, "-", std::string(64, 'p'), ".bin"));
  }
  grpc::Status full;
  for (int n = 0; n < 200 && full.ok(); ++n) {
    zerotrain::Job job;
    full = client.jobs->SubmitJob(client.Context().get(), big, &job);
  }
  ASSERT_FALSE(full.ok()) << "3 MiB never filled";
  EXPECT_EQ(full.error_code(), grpc::StatusCode::UNAVAILABLE) << full.error_message();
  EXPECT_NE(full.error_message().find("bytes free"), std::string::npos) << full.error_message();
  EXPECT_EQ(metric_becomes("zt_store_writable", "0"), "0");
  ASSERT_EQ(::mount("tmpfs", state_dir_.c_str(), "tmpfs", MS_REMOUNT, "size=64m,mode=0700"), 0)
      << std::strerror(errno);
  // Before issue 20 every submit failed from here on until ztd restarted.
  zerotrain::SubmitJobRequest small;
  *small.mutable_spec() = TinySpec("after", dir_.string());
  grpc::Status again = grpc::Status(grpc::StatusCode::UNAVAILABLE, "not tried");
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!again.ok() && Clock::now() < deadline) {
    zerotrain::Job job;
    again = client.jobs->SubmitJob(client.Context().get(), small, &job);
    if (!again.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(metric_becomes("zt_store_writable", "1"), "1");
  EXPECT_TRUE(CoordinatorAlive()) << coordinator_->Output();
  coordinator_.reset();  // before the tmpfs goes
}

}  // namespace
}  // namespace zt::testing
