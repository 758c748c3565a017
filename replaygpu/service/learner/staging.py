"""The bounded queue between the gRPC handlers and the thread that writes the table.

Handlers put whole decoded batches; the learner thread (or the server's background committer)
takes them all at once between train calls. The queue is bounded in batches and in bytes;
a put that finds it full waits up to a deadline and then fails with RESOURCE_EXHAUSTED naming
the limit, marked retryable (`StagingFullError`), so a stalled learner pushes back on actors
(their clients keep the batch, back off and resend) instead of growing memory.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from replaygpu.service.wire.status import ServiceUnavailableError, StagingFullError


@dataclass
class StagedBatch:
    """One validated AppendRequest waiting to be committed.

    ``done(ack_fields)`` is called after commit (or duplicate detection) with the ack's
    values; ``fail(error)`` when it can no longer be committed (shutdown). ``raw`` is the
    request as received, kept only when the server journals acknowledged batches.
    """

    actor_id: str
    seq: int
    columns: dict[str, np.ndarray]
    transitions: int
    nbytes: int
    done: Callable[[dict[str, Any]], None]
    fail: Callable[[BaseException], None]
    raw: bytes | None = None


class StagingQueue:
    """A FIFO of `StagedBatch` bounded by ``max_batches`` and ``max_bytes``.

    A single batch larger than ``max_bytes`` is still admitted when the queue is empty, so the
    byte bound cannot deadlock a batch that fits the message size limit.
    """

    def __init__(self, max_batches: int, max_bytes: int, put_timeout_s: float) -> None:
        self.max_batches = int(max_batches)
        self.max_bytes = int(max_bytes)
        self.put_timeout_s = float(put_timeout_s)
        self._items: collections.deque[StagedBatch] = collections.deque()
        self._bytes = 0
        self._closed = False
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        """Bytes of the staged batches."""
        return self._bytes

    def _fits(self, nbytes: int) -> bool:
        if not self._items:
            return True
        return len(self._items) < self.max_batches and self._bytes + nbytes <= self.max_bytes

    def try_put(self, item: StagedBatch) -> bool:
        """Stage a batch if there is room now; returns whether it was staged.

        Raises:
            ServiceUnavailableError: the queue was closed (server shutting down).
        """
        with self._cond:
            if self._closed:
                raise ServiceUnavailableError("server shutting down; retry", seq=item.seq)
            if not self._fits(item.nbytes):
                return False
            self._items.append(item)
            self._bytes += item.nbytes
            self._cond.notify_all()
            return True

    def full_error(self, seq: int) -> StagingFullError:
        """The error for a batch that found the queue full for ``put_timeout_s`` (a
        RESOURCE_EXHAUSTED that clients retry)."""
        return StagingFullError(
            f"staging queue full for staging_timeout_s={self.put_timeout_s:g}: "
            f"{len(self._items)} batches / {self._bytes} bytes staged, limits "
            f"staging_max_batches={self.max_batches}, staging_max_bytes={self.max_bytes}; the "
            "learner is not draining appends (a served learner commits them in its training "
            "loop: call replaygpu.service.learner.loop.run or .step, not learner.train alone)",
            seq=seq,
        )

    def take_all(self) -> list[StagedBatch]:
        """Remove and return every staged batch."""
        with self._cond:
            items = list(self._items)
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            return items

    def wait_nonempty(self, timeout: float) -> bool:
        """Wait until something is staged (or the queue is closed)."""
        with self._cond:
            return bool(self._cond.wait_for(lambda: self._items or self._closed, timeout))

    def notify(self) -> None:
        """Wake waiters (after a batch was taken and committed)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """Whether `close` was called (puts are refused)."""
        return self._closed

    def close(self) -> list[StagedBatch]:
        """Refuse further puts; returns what was still staged (to be failed or committed)."""
        with self._cond:
            self._closed = True
            return self.take_all()


class BufferPool:
    """Reusable 64-byte aligned buffers for the arrays of staged batches.

    The Append handlers copy a request's arrays into buffers taken here (aligned,
    so TensorFlow wraps them without another copy), and the committer gives them back after
    the table write. Reusing them spares the handlers a fresh multi-megabyte allocation per
    request, whose pages fault on first touch (glibc unmaps emptied per-thread heaps whatever
    ``keep_freed_memory`` says). A buffer is only reused when nothing else still refers to it
    (CPython reference counts), e.g. a tensor TensorFlow has not released yet; free buffers are
    kept up to ``max_bytes``.
    """

    def __init__(self, max_bytes: int, alignment: int = 64) -> None:
        self.max_bytes = int(max_bytes)
        self.alignment = int(alignment)
        self._free: dict[int, list[np.ndarray]] = collections.defaultdict(list)
        self._free_bytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _size_class(nbytes: int) -> int:
        step = 1 << max(12, nbytes.bit_length() - 3)  # at most 1/8 of slack
        return -(-nbytes // step) * step

    def copy(self, array: np.ndarray) -> np.ndarray:
        """A C-contiguous, aligned copy of ``array`` in a pooled buffer."""
        out = self.empty(array.shape, array.dtype)
        np.copyto(out, array)
        return out

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous, aligned array in a pooled buffer."""
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * math.prod(shape)
        size = self._size_class(max(1, nbytes))
        with self._lock:
            free = self._free.get(size)
            raw = free.pop() if free else None
            if raw is not None:
                self._free_bytes -= raw.nbytes
        if raw is None:
            raw = np.empty(size + self.alignment, np.uint8)
        start = -raw.ctypes.data % self.alignment
        return raw[start : start + nbytes].view(dtype).reshape(shape)

    def release(self, columns: dict[str, np.ndarray]) -> None:
        """Empty ``columns`` (arrays made by `copy`) and keep their buffers for reuse.

        The caller must hold no other reference to the arrays.
        """
        raws = [a.base for a in columns.values()]
        columns.clear()
        with self._lock:
            for raw in raws:
                # referenced by `raws`, `raw` and getrefcount's argument: nobody else
                if raw is None or sys.getrefcount(raw) != 3:
                    continue
                if self._free_bytes + raw.nbytes > self.max_bytes:
                    break
                self._free[raw.nbytes - self.alignment].append(raw)
                self._free_bytes += raw.nbytes
