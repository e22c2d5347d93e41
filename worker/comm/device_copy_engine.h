// DeviceCopyEngine: moves bytes between one device's memory and host memory, off the compute
// stream, for the host-staged communicator (staged_communicator.h) and, later, the offload
// tier's copy queues.
//
// The ordering contract is the one a CUDA copy stream gives: MarkIssue(), called on the thread
// that issues work to the compute stream, records "everything enqueued so far"; a copy started
// with that mark runs only after that point of the compute stream, so a collective issued
// right after the kernel that wrote its buffer sends what the kernel wrote. Copies block the
// calling thread (the communicator's worker, never the step loop) until they are complete.
//
// Implementations: CudaCopyEngine (worker/comm/cuda/, a copy stream, events and pinned staging)
// and HostCopyEngine below, for ranks whose "device" memory is host memory (the tests of the
// staged communicator, and CPU devices with a memory budget of their own).
//
// Thread-safety: MarkIssue from the issuing thread; the copies and staging from one other
// thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace zt {

class DeviceCopyEngine {
 public:
  // A point of the compute stream; copies started with it run after it.
  using IssueMark = std::shared_ptr<const void>;

  virtual ~DeviceCopyEngine() = default;

  // The device whose memory the "device" side of every copy is in.
  virtual Device device() const = 0;

  // Host memory the engine can copy to and from at full speed (page-locked on CUDA), valid for
  // the engine's life. ResourceExhausted names the bytes when it cannot be had.
  virtual absl::StatusOr<void*> AllocateStaging(int64_t bytes) = 0;

  virtual absl::StatusOr<IssueMark> MarkIssue() = 0;

  // Copies `bytes` after `mark` and returns when they have arrived.
  virtual absl::Status CopyToHost(const IssueMark& mark, void* host, const void* device,
                                  int64_t bytes) = 0;
  virtual absl::Status CopyToDevice(const IssueMark& mark, void* device, const void* host,
                                    int64_t bytes) = 0;
};

// "Device" memory that is host memory: copies are memcpy, marks are empty, staging is plain
// (zeroed) host memory. `device` is what the tensors it copies say they are on.
std::unique_ptr<DeviceCopyEngine> MakeHostCopyEngine(Device device);

}  // namespace zt
