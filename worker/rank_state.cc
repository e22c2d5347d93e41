#include "worker/rank_state.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/status_macros.h"
#include "worker/checkpoint/safetensors.h"

namespace zt {

std::vector<const BufferSpec*> CheckpointedBuffers(const MemoryPlan& plan) {
  std::vector<const BufferSpec*> out;
  for (const BufferSpec& b : plan.buffers) {
    const bool params = b.category == MemoryCategory::kParameters && b.name.ends_with(".params");
    if (params || b.category == MemoryCategory::kOptimizerState) out.push_back(&b);
  }
  return out;
}

absl::Status WriteRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas) {
  const std::vector<const BufferSpec*> buffers = CheckpointedBuffers(plan);
  std::vector<SafetensorsTensorSpec> specs;
  for (const BufferSpec* b : buffers) {
    specs.push_back({.name = b->name, .dtype = ToStDType(b->dtype), .shape = {b->numel()}});
  }
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                      SafetensorsWriter::Create(path, std::move(specs)));
  for (const BufferSpec* b : buffers) {
    ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(b->name));
    ZT_RETURN_IF_ERROR(
        writer->Write(b->name, absl::Span<const uint8_t>(static_cast<const uint8_t*>(t.raw()),
                                                         static_cast<size_t>(t.size_bytes()))));
  }
  return writer->Finish();
}

absl::Status ReadRankState(const std::string& path, const MemoryPlan& plan, const Arenas& arenas) {
  ZT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  for (const BufferSpec* b : CheckpointedBuffers(plan)) {
    const SafetensorsTensorInfo* info = file->Find(b->name);
    if (info == nullptr || info->dtype != ToStDType(b->dtype) || info->nbytes() != b->bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint file '", path, "': buffer ", b->name,
          info == nullptr ? " is missing" : " has another dtype or size",
          " — it was written for another parallel layout or model; resuming on another layout "
          "(resharding) is not supported yet"));
    }
    ZT_ASSIGN_OR_RETURN(Tensor t, arenas.Get(b->name));
    const absl::Span<const uint8_t> bytes = file->Bytes(*info);
    std::memcpy(t.raw(), bytes.data(), bytes.size());
  }
  return absl::OkStatus();
}

}  // namespace zt
