// A floor under the stack size any library asks for its threads, linked into `ztd` only.
//
// Why: prometheus-cpp serves /metrics through civetweb, and Debian builds civetweb with
// 100 KiB worker stacks (USE_STACK_SIZE). OpenBLAS links libgfortran, which loads libquadmath,
// whose constructor registers printf hooks (%Q); with any hook registered, glibc formats every
// printf through printf_positional, whose buffers overflow such a stack: the first /metrics
// request crashed the daemon (SIGSEGV in civetweb's "%.*s/%s" snprintf). Raising the floor to
// 1 MiB costs address space only (stacks are mapped lazily) and leaves larger requests as they
// are. The executable exports this definition (--export-dynamic-symbol), so it interposes on
// glibc's for every library; the real function is found with RTLD_NEXT.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const auto real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kFloor = size_t{1} << 20;
  return real(attr, size < kFloor ? kFloor : size);
}
