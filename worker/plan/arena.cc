#include "worker/plan/arena.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace zt {

absl::StatusOr<std::unique_ptr<Arenas>> Arenas::Create(const MemoryPlan& plan) {
  std::unique_ptr<Arenas> a(new Arenas());
  a->plan_ = plan;
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    const auto category = static_cast<MemoryCategory>(c);
    const int64_t bytes = a->plan_.CategoryBytes(category);
    if (bytes == 0) continue;
    void* p = std::aligned_alloc(kBufferAlignment, static_cast<size_t>(bytes));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "memory plan: cannot allocate ", bytes, " bytes for ", MemoryCategoryName(category)));
    }
    std::memset(p, 0, static_cast<size_t>(bytes));
    a->base_[c] = p;
  }
  for (const BufferSpec& spec : a->plan_.buffers) {
    const int c = static_cast<int>(spec.category);
    void* data = static_cast<char*>(a->base_[c]) + a->in_use_[c];
    a->in_use_[c] += AlignedBytes(spec.bytes());
    a->by_name_.emplace(spec.name, Entry{data, &spec});
  }
  return a;
}

Arenas::~Arenas() {
  for (void* p : base_) std::free(p);
}

absl::StatusOr<Tensor> Arenas::Get(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat("memory plan: no buffer named '", name, "'"));
  }
  it->second.claimed = true;
  const BufferSpec& s = *it->second.spec;
  const auto& d = s.shape;
  switch (d.size()) {
    case 1:
      return Tensor(it->second.data, s.dtype, {d[0]});
    case 2:
      return Tensor(it->second.data, s.dtype, {d[0], d[1]});
    case 3:
      return Tensor(it->second.data, s.dtype, {d[0], d[1], d[2]});
    default:
      return Tensor(it->second.data, s.dtype, {s.numel()});
  }
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
