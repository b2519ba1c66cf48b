#pragma once
// Training allocates and frees the same CPU tensors every step. With glibc's defaults, blocks of
// 128 KiB and more go back to the kernel when freed (munmap, heap trimming), so every step
// page-faults them in again: on a small model that is a quarter of the step time. PyTorch's CPU
// performance advice is a caching allocator (jemalloc, tcmalloc); keeping glibc's freed memory
// gets most of that without one.

#include <cstddef>

namespace cxxlaunch {

// Raises glibc's mmap and trim thresholds so that freed tensor memory stays in the process for
// the next step. Does nothing when the user tunes malloc through the environment
// (GLIBC_TUNABLES with glibc.malloc.*, or MALLOC_TRIM_THRESHOLD_ / MALLOC_MMAP_THRESHOLD_ /
// MALLOC_TOP_PAD_), on a C library other than glibc, or in a sanitizer's build (whose allocator
// replaces glibc's). Returns whether it changed anything.
bool keepFreedHostMemory();

// Where memory is the point (parameters sharded at rest, nvme offload): freed memory beyond
// 64 MiB at the top of the heap goes back to the kernel again, so a unit's gathered parameters
// leave when they are freed. The mmap threshold stays fixed. Same conditions as above.
bool returnFreedHostMemory();

// Gives freed heap memory back to the kernel once (malloc_trim), after a one-off release such as
// a model's parameters moving into flat buffers: kept, they would stay resident for the whole run.
void releaseFreedHostMemory();

// Faults in the pages of [data, data + bytes) for writing, in one call (MADV_POPULATE_WRITE,
// Linux 5.14), where the kernel has it; else does nothing and the pages fault one by one as they
// are first written. For memory about to be filled at once, such as a checkpoint's arrays read
// into fresh tensors: a read into untouched memory faults every page inside the copy, which
// costs more than the copy itself (more still in a virtual machine), and one call per range
// costs about a third less. Pages that are already there cost next to nothing. The range's
// whole 2 MiB extents are advised as transparent huge pages first (MADV_HUGEPAGE): in this
// project's VMs (paravirtualized paging) a fresh 4 KiB page costs a fault in the guest and one in
// the host, and its first write from user space is slow again; a huge page is one of each for
// 512 of them. A warm DDP load (1.2 GB at world 2) went from 4.6-6.7 s to 2.7-3.0 s.
void prefaultForWriting(void* data, size_t bytes);

}  // namespace cxxlaunch
