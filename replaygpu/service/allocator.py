"""Process-wide glibc malloc tuning for processes that churn multi-megabyte buffers.

Both ends of the service allocate and free a few large buffers per request: the actor one
serialized request per batch (kept until acknowledged), the learner the received request bytes
and the tensors TensorFlow converts them to. By default glibc serves and frees such blocks with
``mmap``/``munmap`` (or trims them off the heap), and the first touch of every page of a fresh
block faults, which on a VM costs more than copying the data. Imports no TensorFlow.
"""

from __future__ import annotations

import ctypes
import platform

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
