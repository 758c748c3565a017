"""Process-wide memory tuning for the service: glibc malloc, and the garbage collector.

Both ends allocate and free a few large buffers per request. glibc serves such blocks with
``mmap``/``munmap`` (or trims them off the heap), and the first touch of each page of a fresh
block faults, which on a VM costs more than copying the data. Imports no TensorFlow."""

from __future__ import annotations

import ctypes
import gc
import platform
import time

_kept_bytes = 0


def keep_freed_memory(trim_bytes: int) -> bool:
    """Let glibc reuse freed multi-megabyte buffers instead of unmapping them.

    mmap threshold at glibc's maximum (32 MiB); up to ``trim_bytes`` (the largest any caller
    asked for) of freed heap kept. On 7 MB frame batches: commits 3x faster, an actor's page
    faults per request gone. Returns False (a no-op) off glibc."""
    global _kept_bytes
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    _kept_bytes = max(_kept_bytes, int(min(trim_bytes, 2**31 - 1)))
    ok = libc.mallopt(m_mmap_threshold, 32 * 2**20) == 1
    return ok and libc.mallopt(m_trim_threshold, _kept_bytes) == 1


def freeze_long_lived_objects() -> float:
    """Collect garbage once, then exempt every object alive now from later collections.

    A learner holds hundreds of thousands of long-lived objects (TensorFlow's graphs, modules);
    ingest triggers full collections, each walking them all under the GIL: 0.4 s per pass with
    4e5 objects measured, health checks and Info stalled 2-7 s with 512 streams appending.
    Call once setup is done; returns the seconds the collection took."""
    started = time.monotonic()
    gc.collect()
    gc.freeze()
    return time.monotonic() - started
