#include "worker/plan/arena.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/status_macros.h"

namespace zt {
namespace {

class HostArenaAllocator : public ArenaAllocator {
 public:
  Device DeviceOf(MemoryCategory) const override { return Device{}; }

  absl::StatusOr<void*> Allocate(MemoryCategory category, int64_t bytes) override {
    // aligned_alloc wants a multiple of the alignment.
    const int64_t rounded = AlignedBytes(bytes);
    void* p = std::aligned_alloc(kBufferAlignment, static_cast<size_t>(rounded));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory plan: cannot allocate ", bytes, " bytes for ", MemoryCategoryName(category)));
    }
    std::memset(p, 0, static_cast<size_t>(rounded));
    return p;
  }

  void Free(MemoryCategory, void* data) override { std::free(data); }
};

}  // namespace

std::unique_ptr<ArenaAllocator> MakeHostArenaAllocator() {
  return std::make_unique<HostArenaAllocator>();
}

absl::StatusOr<std::unique_ptr<Arenas>> Arenas::Create(const MemoryPlan& plan,
                                                       std::unique_ptr<ArenaAllocator> allocator) {
  std::unique_ptr<Arenas> a(new Arenas());
  a->plan_ = plan;
  a->allocator_ = allocator != nullptr ? std::move(allocator) : MakeHostArenaAllocator();
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    const int64_t bytes = a->plan_.CategoryBytes(category);
    if (bytes == 0 || category == MemoryCategory::kNvme) continue;
    ZT_ASSIGN_OR_RETURN(a->base_[c], a->allocator_->Allocate(category, bytes));
  }
  for (const BufferSpec& spec : a->plan_.buffers) {
    const int c = static_cast<int>(spec.category);
    if (spec.category == MemoryCategory::kNvme) {
      a->by_name_.emplace(spec.name, Entry{nullptr, &spec});
      continue;
    }
    void* data = static_cast<char*>(a->base_[c]) + a->in_use_[c];
    a->in_use_[c] += AlignedBytes(spec.bytes());
    a->by_name_.emplace(spec.name, Entry{data, &spec});
  }
  return a;
}

Arenas::~Arenas() {
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    if (base_[c] != nullptr) allocator_->Free(static_cast<MemoryCategory>(c), base_[c]);
  }
}

absl::StatusOr<Tensor> Arenas::Get(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("memory plan: no buffer named '", name, "'"));
  }
  const BufferSpec& s = *it->second.spec;
  if (s.category == MemoryCategory::kNvme) {
    return absl::FailedPreconditionError(
        absl::StrCat("memory plan: buffer '", name,
                     "' lives in the NVMe swap store (offload.nvme_path), not in an arena"));
  }
  it->second.claimed = true;
  const auto& d = s.shape;
  const Device device = allocator_->DeviceOf(s.category);
  switch (d.size()) {
    case 1:
      return Tensor(it->second.data, s.dtype, {d[0]}, device);
    case 2:
      return Tensor(it->second.data, s.dtype, {d[0], d[1]}, device);
    case 3:
      return Tensor(it->second.data, s.dtype, {d[0], d[1], d[2]}, device);
    default:
      return Tensor(it->second.data, s.dtype, {s.numel()}, device);
  }
}

absl::StatusOr<const BufferSpec*> Arenas::Spec(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("memory plan: no buffer named '", name, "'"));
  }
  it->second.claimed = true;
  return it->second.spec;
}

std::vector<std::string> Arenas::UnclaimedBuffers() const {
  std::vector<std::string> names;
  for (const BufferSpec& spec : plan_.buffers) {
    if (!by_name_.at(spec.name).claimed) names.push_back(spec.name);
  }
  return names;
}

int64_t Arenas::TotalBytesInUse() const {
  int64_t total = 0;
  for (int64_t b : in_use_) total += b;
  return total;
}

}  // namespace zt
