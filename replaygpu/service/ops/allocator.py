"""Process-wide memory tuning for the service: glibc malloc, and the garbage collector.

Both ends of the service allocate and free a few large buffers per request: the actor one
serialized request per batch (kept until acknowledged), the learner the received request bytes
and the tensors TensorFlow converts them to. By default glibc serves and frees such blocks with
``mmap``/``munmap`` (or trims them off the heap), and the first touch of every page of a fresh
block faults, which on a VM costs more than copying the data. Imports no TensorFlow.
"""

from __future__ import annotations

import ctypes
import gc
import platform
import time

_kept_bytes = 0


def keep_freed_memory(trim_bytes: int) -> bool:
    """Let glibc reuse freed multi-megabyte buffers instead of unmapping them.

    Raises the mmap threshold to glibc's maximum (32 MiB) and keeps up to ``trim_bytes`` of
    freed heap for reuse (the largest value any caller in this process asked for: the
    server's staging bound, a client's buffer bound). Measured on 7 MB frame batches: a commit
    3x faster, and an actor's page faults per request gone. A no-op returning False off glibc.
    """
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

    A learner process holds hundreds of thousands of long-lived Python objects (TensorFlow's
    traced graphs, modules, the table's metadata). Ingest allocates fast, which triggers full
    collections, and each full collection walks all of them while holding the GIL: measured here
    at 0.4 s per pass with 4e5 objects, and health checks and Info stalled 2-7 s behind a run of
    them with 512 streams appending. `gc.freeze` moves the objects alive now to a permanent
    generation that collections skip; objects made later are collected as before. Call it once
    setup is done (the server does when it starts). Returns the seconds the collection took.
    """
    started = time.monotonic()
    gc.collect()
    gc.freeze()
    return time.monotonic() - started
