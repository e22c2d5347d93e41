// What a node on a GPU machine announces (worker/node/device_inventory.h): every CUDA device
// with the name, memory and compute capability the runtime reports, and a bf16 peak from its
// SM count and clock, so the coordinator can place CUDA jobs and plan them with the device's
// memory. Skipped, with the reason, where no GPU is present.
// The inventory finds GPUs only in a build with CUDA and NCCL (device_inventory.cc).
#if ZT_HAVE_CUDA && ZT_HAVE_NCCL

#include "worker/node/device_inventory.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace zt {
namespace {

TEST(DeviceInventoryGpuTest, AnnouncesEveryCudaDeviceWithItsComputeCapability) {
  ZT_SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  absl::StatusOr<zerotrain::NodeInfo> info = DetectNodeInfo({.node_id = "gpu-node"});
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->devices_size(), count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, d), cudaSuccess);
    const zerotrain::DeviceInfo& device = info->devices(d);
    EXPECT_EQ(device.index(), d);
    EXPECT_EQ(device.kind(), zerotrain::ResourceConfig::CUDA);
    EXPECT_EQ(device.name(), prop.name);
    EXPECT_EQ(device.memory_bytes(), static_cast<int64_t>(prop.totalGlobalMem));
    EXPECT_EQ(device.compute_capability(), absl::StrCat(prop.major, ".", prop.minor));
    // An H100 SXM's datasheet dense bf16 peak is ~989 TFLOP/s at its 1.83 GHz boost; the
    // formula takes the runtime's (maximum) clock, so a Hopper lands within ~10% above it.
    // Any device: positive and below 10 PFLOP/s.
    EXPECT_GT(device.peak_flops(), 0);
    EXPECT_LT(device.peak_flops(), 1e16);
    if (prop.major == 9 && prop.multiProcessorCount == 132) {
      EXPECT_NEAR(device.peak_flops() / 989e12, 1.0, 0.12) << device.peak_flops();
    }
  }
  // A forced CPU inventory on the same machine announces CPU devices only.
  absl::StatusOr<zerotrain::NodeInfo> cpu =
      DetectNodeInfo({.node_id = "gpu-node", .cpu_devices = 2, .force_cpu = true});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_EQ(cpu->devices_size(), 2);
  EXPECT_EQ(cpu->devices(0).kind(), zerotrain::ResourceConfig::CPU);
  EXPECT_TRUE(cpu->devices(0).compute_capability().empty());
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA && ZT_HAVE_NCCL
