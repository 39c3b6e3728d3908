// The allocator of a long-running server: bounded, and giving back what it no longer uses.
//
// The server binary links jemalloc: its per-thread caches replace glibc's arena locks and
// consolidation, which took a fifth of the server's CPU under order load. It is configured in
// memory.cpp (malloc_conf) and gives freed pages back from a thread of its own.
//
// Builds without it (the sanitizers', whose runtimes own malloc) tune glibc instead. glibc's
// defaults suit short programs: each of up to 8 arenas per core keeps what its threads freed,
// and the mmap threshold rises after the first large free, so later large buffers (request
// bodies up to the limit) come from the arenas and stay there; a flood of large malformed
// requests left a server at 197 MiB for good. TuneAllocator() caps the arenas and fixes the
// threshold; ReturnFreeMemory(), run every few seconds, hands free pages back.
#pragma once

namespace idemsaga::common {

// Call first thing in main(), before any thread starts.
void TuneAllocator();

// Returns free heap pages to the kernel (glibc: malloc_trim; jemalloc does it on its own).
// Cheap when there is nothing to return.
void ReturnFreeMemory();

}  // namespace idemsaga::common
