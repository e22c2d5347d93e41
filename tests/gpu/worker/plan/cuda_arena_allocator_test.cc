// The CUDA arena allocator: device categories in device memory and pinned host in page-locked
// host memory, every byte zeroed, a plan larger than the GPU refused naming its category, and
// (without a GPU too) an unusable device refused.
#if ZT_HAVE_CUDA

#include "worker/plan/cuda/cuda_arena_allocator.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;

cudaMemoryType TypeOf(const void* p) {
  cudaPointerAttributes attributes{};
  EXPECT_EQ(cudaPointerGetAttributes(&attributes, p), cudaSuccess);
  return attributes.type;
}

TEST(CudaArenaAllocatorTest, DeviceCategoriesOnTheGpuPinnedHostPageLockedAllZeroed) {
  ZT_SKIP_WITHOUT_GPU();
  MemoryPlan plan;
  plan.buffers = {
      {.name = "w", .category = MemoryCategory::kParameters, .dtype = DType::kBF16, .shape = {1000}},
      {.name = "a", .category = MemoryCategory::kActivations, .dtype = DType::kF32, .shape = {4096}},
      {.name = "staging", .category = MemoryCategory::kPinnedHost, .dtype = DType::kF32, .shape = {64}},
  };
  auto allocator = MakeCudaArenaAllocator(0);
  ASSERT_TRUE(allocator.ok()) << allocator.status();
  auto arenas = Arenas::Create(plan, std::move(*allocator));
  ASSERT_TRUE(arenas.ok()) << arenas.status();
  const Tensor w = (*arenas)->Get("w").value(), a = (*arenas)->Get("a").value();
  const Tensor staging = (*arenas)->Get("staging").value();
  EXPECT_EQ(w.device(), gpu_test::Gpu0());
  EXPECT_EQ(staging.device(), Device{});
  EXPECT_EQ(TypeOf(w.raw()), cudaMemoryTypeDevice);
  EXPECT_EQ(TypeOf(a.raw()), cudaMemoryTypeDevice);
  EXPECT_EQ(TypeOf(staging.raw()), cudaMemoryTypeHost);
  for (float v : gpu_test::ToHostFloats(a)) ASSERT_EQ(v, 0.0f);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(staging.data<float>()[i], 0.0f);
}

TEST(CudaArenaAllocatorTest, APlanLargerThanTheGpuIsRefusedNamingTheCategory) {
  ZT_SKIP_WITHOUT_GPU();
  MemoryPlan plan;
  plan.buffers = {{.name = "huge", .category = MemoryCategory::kOptimizerState,
                   .dtype = DType::kF32, .shape = {int64_t{1} << 40}}};  // 4 TiB
  auto arenas = Arenas::Create(plan, MakeCudaArenaAllocator(0).value());
  ASSERT_FALSE(arenas.ok());
  EXPECT_EQ(arenas.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(arenas.status().message(), HasSubstr("for optimizer"));
}

TEST(CudaArenaAllocatorTest, AnUnusableDeviceIsRefused) {
  // Runs everywhere: device 4096 exists on no machine, and without a driver none does.
  auto allocator = MakeCudaArenaAllocator(4096);
  EXPECT_EQ(allocator.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(allocator.status().message(), HasSubstr("CUDA device 4096 is not usable"));
}

}  // namespace
}  // namespace zt

#endif  // ZT_HAVE_CUDA
