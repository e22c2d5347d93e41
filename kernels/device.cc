#include "kernels/device.h"

#include <omp.h>

#include "absl/strings/str_cat.h"

namespace zt {

std::string DeviceName(const Device& d) {
  return absl::StrCat(d.kind == DeviceKind::kCpu ? "cpu:" : "cuda:", d.index);
}

DeviceContext CpuContext(int threads) {
  DeviceContext ctx;
  ctx.num_threads = threads > 0 ? threads : omp_get_num_procs();
  return ctx;
}

}  // namespace zt
