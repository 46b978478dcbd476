"""Keep freed host memory in the process, so that timings measure ops rather than page faults.

glibc's ``malloc`` serves large blocks (≥ 128 KiB at first) with ``mmap`` and returns them to the kernel on
``free``; it also trims the top of its heap once more than a threshold lies free there. Memory that went back
to the kernel faults again, page by page, on its next first touch. On the virtual machines these benchmarks
ran on a minor page fault costs ~2 µs, so a 1.7 MB tensor (L=6 × B=8 × Q=900 × D=10 float32, 422 pages)
costs ~1 ms of faults whenever the allocator happens to hand out fresh pages — more than the op that fills it.
Whether it does depends on the history of earlier allocations (glibc adapts its thresholds), so the same op
measured twice ran 0.2 ms or 3 ms. :func:`retain_freed_memory` raises both thresholds so that freed blocks
stay in the heap and are reused warm, as a caching allocator (PyTorch's on CUDA, jemalloc or tcmalloc on the
host) does in a long training run. PyTorch's CPU tuning guides recommend jemalloc/tcmalloc for the same
reason; ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` set the same glibc knobs from the environment.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "retain_freed_memory"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB): blocks
# below it come from the heap. The heap keeps up to 1 GiB of freed memory at its top instead of trimming it.
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; returns False where there is no glibc ``mallopt``
    (macOS, musl) or it refused, and the allocator stays as it was.

    Affects allocations made after the call. Freed memory stays mapped in the process (up to 1 GiB at the
    top of the heap), so its resident size no longer shrinks after a peak.
    """
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
