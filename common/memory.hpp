// The allocator of a long-running server: bounded, and giving back what it no longer uses.
//
// glibc's defaults suit short programs. Each of up to 8 arenas per core keeps what its
// threads freed, and the mmap threshold rises after the first large free, so later large
// buffers (request bodies up to the limit) come from the arenas and stay there: a flood of
// large malformed requests left a server at 197 MiB for good. TuneAllocator() caps the arenas
// and fixes the threshold; ReturnFreeMemory(), run every few seconds, hands free pages back.
#pragma once

namespace common {

// Call first thing in main(), before any thread starts.
void TuneAllocator();

// Returns free heap pages to the kernel (malloc_trim). Cheap when there is nothing to return.
void ReturnFreeMemory();

}  // namespace common
