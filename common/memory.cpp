#include "common/memory.hpp"

#include <malloc.h>

#include <cstddef>

// jemalloc's control call. Weak: in a build without jemalloc (the sanitizer builds, whose
// runtimes bring their own allocator; the test binaries) it is null and glibc is tuned instead.
extern "C" int mallctl(const char* name, void* oldp, std::size_t* oldlenp, void* newp,
                       std::size_t newlen) __attribute__((weak));

// jemalloc reads this at its first allocation. Two arenas for 2 cores; small per-thread caches
// (some 170 threads, most of them idle workers); freed pages go back to the kernel after half a
// second, from jemalloc's own thread, so an idle server shrinks too.
extern "C" {
const char* malloc_conf =  // NOLINT: the name and type are jemalloc's
    "narenas:2,tcache_max:1024,lg_tcache_nslots_mul:-2,dirty_decay_ms:500,muzzy_decay_ms:0,"
    "background_thread:true";
}

namespace idemsaga::common {
namespace {

bool UsingJemalloc() { return mallctl != nullptr; }

}  // namespace

void TuneAllocator() {
  if (UsingJemalloc()) return;  // malloc_conf above
  // Two arenas for 2 cores' worth of threads: contention on them is far below the cost of the
  // memory that 16 arenas hold.
  mallopt(M_ARENA_MAX, 2);
  // Buffers of 64 KiB and more (bodies near the limit, OTLP batches) are mapped and unmapped
  // on their own; setting the threshold also stops glibc from raising it.
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
}

void ReturnFreeMemory() {
  if (UsingJemalloc()) return;  // its background thread purges on its own
  malloc_trim(0);
}

}  // namespace idemsaga::common
