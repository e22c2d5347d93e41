// The server around the coordinator: the token on every service, the open health and
// reflection services, the listen rule, and requests that are refused while it keeps serving.
#include "daemon/control_server.h"

#include <thread>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/unit/daemon/daemon_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// Waits for `tag` on `cq`; true when the operation succeeded.
bool Await(grpc::CompletionQueue& cq, void* tag) {
  void* got = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&got, &ok));
  EXPECT_EQ(got, tag);
  return ok;
}

class ControlServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    harness_ = std::make_unique<testing::Harness>(
        dir_.path(), CoordinatorOptions{.allowed_roots = {dir_.path()}});
    ASSERT_TRUE(harness_->ok());
  }
  // Every method of every service, called with `context`'s metadata.
  std::vector<std::pair<std::string, grpc::Status>> CallEverything(
      const std::function<void(grpc::ClientContext*)>& decorate) {
    std::vector<std::pair<std::string, grpc::Status>> out;
    auto context = [&] {
      auto c = std::make_unique<grpc::ClientContext>();
      decorate(c.get());
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      return c;
    };
    testing::Harness& h = *harness_;
    zerotrain::Job job;
    zerotrain::SubmitJobRequest submit;
    *submit.mutable_spec() = testing::SmallJob("j", dir_.path(), 1);
    out.emplace_back("SubmitJob", h.jobs->SubmitJob(context().get(), submit, &job));
    out.emplace_back("GetJob", h.jobs->GetJob(context().get(), {}, &job));
    zerotrain::ListJobsResponse list;
    out.emplace_back("ListJobs", h.jobs->ListJobs(context().get(), {}, &list));
    out.emplace_back("CancelJob", h.jobs->CancelJob(context().get(), {}, &job));
    out.emplace_back("ResumeJob", h.jobs->ResumeJob(context().get(), {}, &job));
    zerotrain::EstimateJobResponse estimate;
    out.emplace_back("EstimateJob", h.jobs->EstimateJob(context().get(), {}, &estimate));
    zerotrain::ListNodesResponse nodes;
    out.emplace_back("ListNodes", h.jobs->ListNodes(context().get(), {}, &nodes));
    {
      auto c = context();
      zerotrain::JobEvent event;
      auto reader = h.jobs->WatchJob(c.get(), {});
      while (reader->Read(&event)) {
      }
      out.emplace_back("WatchJob", reader->Finish());
    }
    zerotrain::RegisterResponse reg;
    zerotrain::RegisterRequest reg_request;
    *reg_request.mutable_info() = testing::NodeWithDevices("n", 1, 1 << 30);
    out.emplace_back("Register", h.nodes->Register(context().get(), reg_request, &reg));
    zerotrain::HeartbeatResponse beat;
    out.emplace_back("Heartbeat", h.nodes->Heartbeat(context().get(), {}, &beat));
    {
      auto c = context();
      zerotrain::Assignment assignment;
      auto reader = h.nodes->Assignments(c.get(), {});
      while (reader->Read(&assignment)) {
      }
      out.emplace_back("Assignments", reader->Finish());
    }
    zerotrain::RankReportResponse report;
    out.emplace_back("ReportRank", h.nodes->ReportRank(context().get(), {}, &report));
    zerotrain::StoreSetResponse set;
    out.emplace_back("StoreSet", h.store->StoreSet(context().get(), {}, &set));
    zerotrain::StoreGetResponse get;
    out.emplace_back("StoreGet", h.store->StoreGet(context().get(), {}, &get));
    zerotrain::StoreWaitResponse wait;
    out.emplace_back("StoreWait", h.store->StoreWait(context().get(), {}, &wait));
    zerotrain::StoreAddResponse add;
    out.emplace_back("StoreAdd", h.store->StoreAdd(context().get(), {}, &add));
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::Harness> harness_;
};

TEST_F(ControlServerTest, EveryMethodRefusesAMissingOrWrongToken) {
  for (const auto& [method, status] : CallEverything([](grpc::ClientContext*) {})) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_EQ(status.error_message(), "missing authorization metadata") << method;
  }
  const std::string wrong(64, 'a');
  for (const auto& [method, status] : CallEverything([&](grpc::ClientContext* c) {
         c->AddMetadata("authorization", absl::StrCat("Bearer ", wrong));
       })) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
    EXPECT_EQ(status.error_message(), "wrong token") << method;
  }
  // The right token with a suffix is another token.
  for (const auto& [method, status] : CallEverything([&](grpc::ClientContext* c) {
         c->AddMetadata("authorization", absl::StrCat("Bearer ", harness_->token(), "x"));
       })) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
  }
  // Nothing was stored by the refused calls.
  EXPECT_TRUE(harness_->coordinator().ListNodes().empty());
  EXPECT_TRUE(harness_->coordinator().ListJobs({})->jobs().empty());
}

TEST_F(ControlServerTest, TheRightTokenGetsPastAuthorization) {
  for (const auto& [method, status] : CallEverything([&](grpc::ClientContext* c) {
         c->AddMetadata("authorization", absl::StrCat("Bearer ", harness_->token()));
       })) {
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << method;
  }
}

TEST_F(ControlServerTest, HealthAndReflectionAnswerWithoutToken) {
  auto channel = testing::LoopbackChannel(harness_->port());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  {
    // grpc.health.v1.HealthCheckRequest{service: ""} is the empty message; the answer
    // HealthCheckResponse{status: SERVING (1)} is field 1 as varint 1: bytes 08 01.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer response;
    grpc::Status status;
    auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", Bytes(""), &cq);
    call->StartCall();
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    ASSERT_TRUE(Await(cq, reinterpret_cast<void*>(1)));
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(Flatten(response), std::string("\x08\x01", 2));
  }
  {
    // ServerReflectionRequest{list_services: ""}: field 7, length-delimited, empty.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto call = stub.PrepareCall(
        &context, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
    void* tag = reinterpret_cast<void*>(2);
    call->StartCall(tag);
    ASSERT_TRUE(Await(cq, tag));
    call->Write(Bytes(std::string("\x3a\x00", 2)), tag);
    ASSERT_TRUE(Await(cq, tag));
    grpc::ByteBuffer response;
    call->Read(&response, tag);
    ASSERT_TRUE(Await(cq, tag));
    const std::string listed = Flatten(response);
    EXPECT_THAT(listed, HasSubstr("zerotrain.JobService"));
    EXPECT_THAT(listed, HasSubstr("zerotrain.NodeService"));
    EXPECT_THAT(listed, HasSubstr("zerotrain.RendezvousService"));
    call->WritesDone(tag);
    ASSERT_TRUE(Await(cq, tag));
    grpc::Status status;
    call->Finish(&status, tag);
    ASSERT_TRUE(Await(cq, tag));
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }
}

TEST_F(ControlServerTest, RefusedRequestsLeaveTheServerServing) {
  testing::Harness& h = *harness_;
  zerotrain::Job job;
  // Oversized: a 5 MiB name is over the 4 MiB request limit, refused by gRPC itself.
  zerotrain::SubmitJobRequest oversized;
  *oversized.mutable_spec() = testing::SmallJob("j", dir_.path(), 1);
  oversized.mutable_spec()->set_name(std::string(5 << 20, 'x'));
  EXPECT_EQ(h.jobs->SubmitJob(h.Context().get(), oversized, &job).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);

  // A bad job: every violation named in one INVALID_ARGUMENT.
  zerotrain::SubmitJobRequest bad;
  *bad.mutable_spec() = testing::SmallJob("j", dir_.path(), 1);
  bad.mutable_spec()->mutable_train()->set_max_steps(0);
  bad.mutable_spec()->mutable_model()->set_n_layer(0);
  grpc::Status status = h.jobs->SubmitJob(h.Context().get(), bad, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("train.max_steps"));
  EXPECT_THAT(status.error_message(), HasSubstr("model.n_layer"));

  // A name over 128 characters.
  zerotrain::SubmitJobRequest long_name;
  *long_name.mutable_spec() = testing::SmallJob(std::string(129, 'n'), dir_.path(), 1);
  EXPECT_EQ(h.jobs->SubmitJob(h.Context().get(), long_name, &job).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  // Paths outside the allowed root, directly and through a symlink inside it.
  zerotrain::SubmitJobRequest outside;
  *outside.mutable_spec() = testing::SmallJob("j", dir_.path(), 1);
  outside.mutable_spec()->mutable_data()->add_val("/etc/passwd");
  status = h.jobs->SubmitJob(h.Context().get(), outside, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("data.val[0] /etc/passwd is outside the allowed roots"));
  std::filesystem::create_directory_symlink("/tmp", dir_.Sub("escape"));
  zerotrain::SubmitJobRequest linked;
  *linked.mutable_spec() = testing::SmallJob("j", dir_.path(), 1);
  linked.mutable_spec()->mutable_checkpoint()->set_dir(dir_.Sub("escape/ckpt"));
  status = h.jobs->SubmitJob(h.Context().get(), linked, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("checkpoint.dir"));
  zerotrain::SubmitJobRequest dotdot;
  *dotdot.mutable_spec() = testing::SmallJob("j", dir_.path(), 1);
  dotdot.mutable_spec()->mutable_model()->set_init_from(dir_.Sub("new/../../x.safetensors"));
  // ".." below the existing part could climb out once something creates the directories.
  EXPECT_EQ(h.jobs->SubmitJob(h.Context().get(), dotdot, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Rendezvous bounds name the field.
  zerotrain::StoreSetRequest big_key;
  big_key.set_scope("s");
  big_key.set_key(std::string(513, 'k'));
  zerotrain::StoreSetResponse set;
  status = h.store->StoreSet(h.Context().get(), big_key, &set);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("key has 513 bytes"));

  // Nothing was stored, and the server still serves a good request.
  EXPECT_TRUE(h.coordinator().ListJobs({})->jobs().empty());
  zerotrain::SubmitJobRequest good;
  *good.mutable_spec() = testing::SmallJob("good", dir_.path(), 1);
  status = h.jobs->SubmitJob(h.Context().get(), good, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(job.id(), "good-1");
  EXPECT_EQ(job.state(), zerotrain::Job::PENDING);
}

TEST_F(ControlServerTest, RendezvousSetGetAddWait) {
  testing::Harness& h = *harness_;
  zerotrain::StoreGetResponse got;
  zerotrain::StoreGetRequest get;
  get.set_scope("job-1/1");
  get.set_key("k");
  EXPECT_EQ(h.store->StoreGet(h.Context().get(), get, &got).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A waiter blocked on two keys returns once both are set.
  std::thread waiter([&] {
    zerotrain::StoreWaitRequest wait;
    wait.set_scope("job-1/1");
    wait.add_keys("k");
    wait.add_keys("n");
    wait.set_timeout_ms(10000);
    zerotrain::StoreWaitResponse response;
    grpc::Status status = h.store->StoreWait(h.Context().get(), wait, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
  });
  zerotrain::StoreSetRequest set;
  set.set_scope("job-1/1");
  set.set_key("k");
  set.set_value(std::string("\x00\x01", 2));
  zerotrain::StoreSetResponse set_response;
  ASSERT_TRUE(h.store->StoreSet(h.Context().get(), set, &set_response).ok());
  zerotrain::StoreAddRequest add;
  add.set_scope("job-1/1");
  add.set_key("n");
  add.set_delta(5);
  zerotrain::StoreAddResponse added;
  ASSERT_TRUE(h.store->StoreAdd(h.Context().get(), add, &added).ok());
  EXPECT_EQ(added.value(), 5);
  add.set_delta(-7);
  ASSERT_TRUE(h.store->StoreAdd(h.Context().get(), add, &added).ok());
  EXPECT_EQ(added.value(), -2);
  waiter.join();
  ASSERT_TRUE(h.store->StoreGet(h.Context().get(), get, &got).ok());
  EXPECT_EQ(got.value(), std::string("\x00\x01", 2));

  // A key that never comes: DEADLINE_EXCEEDED naming it, after the timeout.
  zerotrain::StoreWaitRequest wait;
  wait.set_scope("job-1/1");
  wait.add_keys("k");
  wait.add_keys("never");
  wait.set_timeout_ms(300);
  zerotrain::StoreWaitResponse response;
  const absl::Time start = absl::Now();
  grpc::Status status = h.store->StoreWait(h.Context().get(), wait, &response);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr("never"));
  EXPECT_THAT(status.error_message(), ::testing::Not(HasSubstr("k,")));
  for (int i = 0; i < 257; ++i) wait.add_keys(absl::StrCat("x", i));
  status = h.store->StoreWait(h.Context().get(), wait, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("keys has"));
}

TEST(ControlServerListenTest, PlaintextNonLoopbackIsRefusedUnlessAsked) {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create({.state_dir = dir.path()});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<std::unique_ptr<ControlServer>> refused =
      StartControlServer({.listen_address = "0.0.0.0:0"}, coordinator->get(), "t");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--listen 0.0.0.0:0"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--insecure-listen-any"));
  absl::StatusOr<std::unique_ptr<ControlServer>> allowed = StartControlServer(
      {.listen_address = "0.0.0.0:0", .insecure_listen_any = true}, coordinator->get(), "t");
  EXPECT_TRUE(allowed.ok()) << allowed.status();
  absl::StatusOr<std::unique_ptr<ControlServer>> ca_only = StartControlServer(
      {.listen_address = "127.0.0.1:0", .tls_ca = dir.Sub("ca.pem")}, coordinator->get(), "t");
  EXPECT_EQ(ca_only.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ca_only.status().message(), HasSubstr("--tls-ca"));
  absl::StatusOr<std::unique_ptr<ControlServer>> no_cert = StartControlServer(
      {.listen_address = "0.0.0.0:0", .tls_cert = dir.Sub("cert.pem"), .tls_key = dir.Sub("k")},
      coordinator->get(), "t");
  EXPECT_EQ(no_cert.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_cert.status().message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(no_cert.status().message(), HasSubstr(dir.Sub("cert.pem")));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:7070"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[::]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1:7070"));
}

}  // namespace
}  // namespace zt
