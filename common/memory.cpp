#include "common/memory.hpp"

#include <malloc.h>

namespace common {

void TuneAllocator() {
  // Two arenas for 2 cores' worth of threads: contention on them is far below the cost of the
  // memory that 16 arenas hold.
  mallopt(M_ARENA_MAX, 2);
  // Buffers of 64 KiB and more (bodies near the limit, OTLP batches) are mapped and unmapped
  // on their own; setting the threshold also stops glibc from raising it.
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
}

void ReturnFreeMemory() { malloc_trim(0); }

}  // namespace common
