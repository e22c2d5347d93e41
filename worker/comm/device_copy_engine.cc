#include "worker/comm/device_copy_engine.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zt {
namespace {

class HostCopyEngine : public DeviceCopyEngine {
 public:
  explicit HostCopyEngine(Device device) : device_(device) {}

  Device device() const override { return device_; }

  absl::StatusOr<void*> AllocateStaging(int64_t bytes) override {
    if (bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("staging of ", bytes, " bytes"));
    }
    // 64-byte aligned, as the arenas are, so f32 and 16-bit views of any offset are aligned.
    auto& block = blocks_.emplace_back(static_cast<size_t>((bytes + 63) / 64 + 1));
    return static_cast<void*>(block.data());
  }

  absl::StatusOr<IssueMark> MarkIssue() override { return IssueMark(); }

  absl::Status CopyToHost(const IssueMark&, void* host, const void* device,
                          int64_t bytes) override {
    if (bytes > 0) std::memcpy(host, device, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status CopyToDevice(const IssueMark&, void* device, const void* host,
                            int64_t bytes) override {
    if (bytes > 0) std::memcpy(device, host, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

 private:
  struct alignas(64) Line {
    unsigned char bytes[64] = {};
  };
  Device device_;
  std::vector<std::vector<Line>> blocks_;
};

}  // namespace

std::unique_ptr<DeviceCopyEngine> MakeHostCopyEngine(Device device) {
  return std::make_unique<HostCopyEngine>(device);
}

}  // namespace zt
