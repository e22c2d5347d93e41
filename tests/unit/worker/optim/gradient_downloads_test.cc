// GradientDownloads (ZeRO-Offload's gradient copies during the backward): a copy waits for the
// reduction it is queued behind, lands in the unit's host buffer, and Take waits for that
// unit's copy alone; copies queued before BackwardEnded count as the backward's.
#include "worker/optim/gradient_downloads.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/store.h"

namespace zt {
namespace {

TEST(GradientDownloadsTest, CopyWaitsForItsReductionAndLandsInTheHostBuffer) {
  // A "reduction" whose completion the test controls: rank 1's Recv, finished by rank 0's Send.
  InProcessStore store;
  std::vector<float> device(256, 0.0f), host(256, -1.0f), sent(256);
  for (int i = 0; i < 256; ++i) sent[i] = static_cast<float>(i) * 0.5f;
  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  std::unique_ptr<Communicator> sender, receiver;
  std::thread connect([&] {
    sender = GlooCommunicator::Create({.rank = 0, .size = 2, .store = &store, .prefix = "gd", .timeout_seconds = 20})
                 .value();
  });
  receiver =
      GlooCommunicator::Create({.rank = 1, .size = 2, .store = &store, .prefix = "gd", .timeout_seconds = 20}).value();
  connect.join();
  Tensor device_view(device.data(), DType::kF32, {256});
  absl::StatusOr<CommHandle> recv = receiver->Recv(device_view, 0, "gradient");
  ASSERT_TRUE(recv.ok()) << recv.status();

  std::unique_ptr<GradientDownloads> downloads =
      GradientDownloads::Create({.copies = copies.get(),
                                 .device = {device_view},
                                 .host = {Tensor(host.data(), DType::kF32, {256})}})
          .value();
  // Nothing queued for the unit yet.
  EXPECT_EQ(downloads->Take(0).status().code(), absl::StatusCode::kFailedPrecondition);
  downloads->Enqueue(0, {*recv});
  // The copy cannot have run: its reduction has not finished.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(downloads->stats().copies, 0);
  EXPECT_EQ(host[0], -1.0f);
  downloads->BackwardEnded();
  ASSERT_TRUE(sender->Send(Tensor(sent.data(), DType::kF32, {256}), 1, "gradient")->Wait().ok());
  absl::StatusOr<Tensor> got = downloads->Take(0);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->raw(), host.data());
  EXPECT_EQ(got->numel(), 256);
  EXPECT_EQ(host, sent);
  const GradientDownloads::Stats s = downloads->stats();
  EXPECT_EQ(s.bytes, 256 * 4);
  EXPECT_EQ(s.copies, 1);
  EXPECT_EQ(s.enqueued_during_backward, 1);
  EXPECT_EQ(s.finished_during_backward, 0) << "it waited for a reduction after the backward";
  // Taken: a second Take of the same step has nothing to wait for.
  EXPECT_EQ(downloads->Take(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(downloads->Drain().ok());
}

TEST(GradientDownloadsTest, CopiesAfterBackwardEndedAreNotCountedAsTheBackwards) {
  std::vector<float> device0(8, 1.0f), device1(8, 2.0f), host0(8), host1(8);
  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  std::unique_ptr<GradientDownloads> downloads =
      GradientDownloads::Create({.copies = copies.get(),
                                 .device = {Tensor(device0.data(), DType::kF32, {8}),
                                            Tensor(device1.data(), DType::kF32, {8})},
                                 .host = {Tensor(host0.data(), DType::kF32, {8}),
                                          Tensor(host1.data(), DType::kF32, {8})}})
          .value();
  for (int step = 0; step < 2; ++step) {
    downloads->Enqueue(1, {});  // the last unit's reduction, during the backward
    downloads->BackwardEnded();
    downloads->Enqueue(0, {});  // stage 1: reduced after the backward
    ASSERT_TRUE(downloads->Take(1).ok());
    ASSERT_TRUE(downloads->Take(0).ok());
    ASSERT_TRUE(downloads->Drain().ok());
  }
  EXPECT_EQ(host0, device0);
  EXPECT_EQ(host1, device1);
  EXPECT_EQ(downloads->stats().enqueued_during_backward, 2);
  EXPECT_EQ(downloads->stats().copies, 4);
}

TEST(GradientDownloadsTest, RefusesAHostBufferSmallerThanTheGradient) {
  std::vector<float> device(8), host(4);
  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  absl::StatusOr<std::unique_ptr<GradientDownloads>> d =
      GradientDownloads::Create({.copies = copies.get(),
                                 .device = {Tensor(device.data(), DType::kF32, {8})},
                                 .host = {Tensor(host.data(), DType::kF32, {4})}});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("unit 0"), std::string::npos) << d.status();
}

// The delayed update's double buffering: copies go to the bank chosen when they are enqueued,
// so the next step's copies never overwrite the bank a delayed host step reads.
TEST(GradientDownloadsTest, TwoBanksKeepOneStepsGradientsWhileTheNextLandsInTheOther) {
  std::vector<float> device(8), bank0(8, -1.0f), bank1(8, -1.0f);
  std::unique_ptr<DeviceCopyEngine> copies = MakeHostCopyEngine(Device{});
  std::unique_ptr<GradientDownloads> downloads =
      GradientDownloads::Create({.copies = copies.get(),
                                 .device = {Tensor(device.data(), DType::kF32, {8})},
                                 .host = {Tensor(bank0.data(), DType::kF32, {8})},
                                 .host_bank1 = {Tensor(bank1.data(), DType::kF32, {8})}})
          .value();
  EXPECT_EQ(downloads->bank(), 0);
  std::fill(device.begin(), device.end(), 1.0f);  // step t's gradient
  downloads->Enqueue(0, {});
  ASSERT_TRUE(downloads->Drain().ok());
  ASSERT_TRUE(downloads->UseBank(1).ok());
  std::fill(device.begin(), device.end(), 2.0f);  // step t+1's, while step t's is read
  downloads->Enqueue(0, {});
  // The bank cannot change under a copy that may still be in flight.
  const absl::Status busy = downloads->UseBank(0);
  ASSERT_TRUE(downloads->Drain().ok());
  if (!busy.ok()) EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(bank0, std::vector<float>(8, 1.0f));
  EXPECT_EQ(bank1, std::vector<float>(8, 2.0f));
  const std::vector<Tensor> views = downloads->HostGradients(1);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].raw(), bank1.data());
  EXPECT_EQ(views[0].numel(), 8);
  // A single bank has no bank 1.
  std::unique_ptr<GradientDownloads> single =
      GradientDownloads::Create({.copies = copies.get(),
                                 .device = {Tensor(device.data(), DType::kF32, {8})},
                                 .host = {Tensor(bank0.data(), DType::kF32, {8})}})
          .value();
  EXPECT_EQ(single->UseBank(1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(single->HostGradients(1).empty());
  // Bank 1 must match bank 0's units.
  EXPECT_EQ(GradientDownloads::Create({.copies = copies.get(),
                                       .device = {Tensor(device.data(), DType::kF32, {8})},
                                       .host = {Tensor(bank0.data(), DType::kF32, {8})},
                                       .host_bank1 = {Tensor(bank1.data(), DType::kF32, {8}),
                                                      Tensor(bank1.data(), DType::kF32, {8})}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zt
