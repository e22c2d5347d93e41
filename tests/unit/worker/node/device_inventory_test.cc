// DetectNodeInfo: the CPU devices' count, names, memory and peak from the documented formula,
// the host's figures, NVMe free space against statvfs, and bad options refused by name.
#include "worker/node/device_inventory.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

TEST(DeviceInventory, AnnouncesCpuDevicesSharingTheCores) {
  const std::string nvme = std::filesystem::temp_directory_path().string();
  absl::StatusOr<zerotrain::NodeInfo> info = DetectNodeInfo({.node_id = "",
                                                             .cpu_devices = 3,
                                                             .device_memory_bytes = 123456789,
                                                             .nvme_path = nvme,
                                                             .metrics_addr = "127.0.0.1:9400",
                                                             .force_cpu = true});
  ASSERT_TRUE(info.ok()) << info.status();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(info->hostname(), host);
  EXPECT_EQ(info->id(), host) << "the id defaults to the hostname";
  EXPECT_EQ(info->cpu_cores(), AvailableCores());
  EXPECT_GT(info->host_memory_bytes(), 0);
  EXPECT_EQ(info->metrics_addr(), "127.0.0.1:9400");
  const int per_device = std::max(1, AvailableCores() / 3);
  ASSERT_EQ(info->devices_size(), 3);
  for (int d = 0; d < 3; ++d) {
    const zerotrain::DeviceInfo& device = info->devices(d);
    EXPECT_EQ(device.index(), d);
    EXPECT_EQ(device.kind(), zerotrain::ResourceConfig::CPU);
    EXPECT_EQ(device.name(),
              absl::StrCat("cpu (", per_device, " of ", AvailableCores(), " cores)"));
    EXPECT_EQ(device.memory_bytes(), 123456789);
    EXPECT_EQ(device.peak_flops(), CpuPeakFlops(per_device));
  }
  // Peak scales with cores, and per core it is at least 8 FLOP/cycle at ≥ 0.5 GHz.
  EXPECT_DOUBLE_EQ(CpuPeakFlops(4), 4 * CpuPeakFlops(1));
  EXPECT_GE(CpuPeakFlops(1), 8 * 0.5e9);
  // Free space moves with other processes' writes: within 1 GiB of statvfs's figure.
  struct statvfs fs {};
  ASSERT_EQ(statvfs(nvme.c_str(), &fs), 0);
  EXPECT_EQ(info->nvme_path(), nvme);
  EXPECT_NEAR(static_cast<double>(info->nvme_free_bytes()),
              static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize), 1 << 30);
}

TEST(DeviceInventory, DefaultDeviceMemoryIsAShareOfAvailableMemory) {
  absl::StatusOr<zerotrain::NodeInfo> one =
      DetectNodeInfo({.node_id = "n", .cpu_devices = 1, .force_cpu = true});
  absl::StatusOr<zerotrain::NodeInfo> four =
      DetectNodeInfo({.node_id = "n", .cpu_devices = 4, .force_cpu = true});
  ASSERT_TRUE(one.ok() && four.ok());
  EXPECT_EQ(one->id(), "n");
  // 90% of MemAvailable, which is below MemTotal; four devices split it (MemAvailable moves
  // between the two calls with other processes: 5% slack).
  EXPECT_LT(one->devices(0).memory_bytes(), one->host_memory_bytes());
  EXPECT_NEAR(static_cast<double>(four->devices(0).memory_bytes()) * 4,
              static_cast<double>(one->devices(0).memory_bytes()),
              0.05 * static_cast<double>(one->devices(0).memory_bytes()));
}

TEST(DeviceInventory, BadOptionsAreRefusedByName) {
  EXPECT_THAT(DetectNodeInfo({.cpu_devices = 0}).status().message(), HasSubstr("--cpu-devices"));
  EXPECT_THAT(DetectNodeInfo({.device_memory_bytes = -1}).status().message(),
              HasSubstr("--device-memory"));
  EXPECT_THAT(DetectNodeInfo({.nvme_path = "/no/such/dir"}).status().message(),
              HasSubstr("--nvme-path /no/such/dir"));
}

}  // namespace
}  // namespace zt
