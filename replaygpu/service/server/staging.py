"""The bounded queue (in batches and bytes) between the gRPC handlers and the thread that writes the
table; a put that finds it full past a deadline fails retryably (`StagingFullError`), so a stalled
learner pushes back on actors (they keep the batch and resend) instead of growing memory."""

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
    """One validated AppendRequest waiting to be committed: ``done(ack_fields)`` after commit (or
    as a duplicate), ``fail(error)`` when it cannot be; ``raw``: the request as received, kept
    only in durable mode."""

    actor_id: str
    seq: int
    columns: dict[str, np.ndarray]
    transitions: int
    nbytes: int
    done: Callable[[dict[str, Any]], None]
    fail: Callable[[BaseException], None]
    raw: bytes | None = None


class StagingQueue:
    """A FIFO of `StagedBatch`; a batch over ``max_bytes`` is admitted into an empty queue, so
    the byte bound cannot deadlock."""

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
        return self._bytes

    def _fits(self, nbytes: int) -> bool:
        if not self._items:
            return True
        return len(self._items) < self.max_batches and self._bytes + nbytes <= self.max_bytes

    def try_put(self, item: StagedBatch) -> bool:
        """Returns whether there was room; `ServiceUnavailableError` once closed."""
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
        """For a batch that found the queue full for ``put_timeout_s``."""
        return StagingFullError(
            f"staging queue full for staging_timeout_s={self.put_timeout_s:g}: "
            f"{len(self._items)} batches / {self._bytes} bytes staged, limits "
            f"staging_max_batches={self.max_batches}, staging_max_bytes={self.max_bytes}; the "
            "learner is not draining appends (a served learner commits them in its training "
            "loop: call replaygpu.service.server.loop.run or .step, not learner.train alone)",
            seq=seq,
        )

    def take_all(self) -> list[StagedBatch]:
        with self._cond:
            items = list(self._items)
            self._items.clear()
            self._bytes = 0
            self._cond.notify_all()
            return items

    def wait_nonempty(self, timeout: float) -> bool:
        """Or the queue is closed."""
        with self._cond:
            return bool(self._cond.wait_for(lambda: self._items or self._closed, timeout))

    def notify(self) -> None:
        """After a batch was taken and committed."""
        with self._cond:
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> list[StagedBatch]:
        """Refuse further puts; returns what was still staged."""
        with self._cond:
            self._closed = True
            return self.take_all()


class BufferPool:
    """Reusable 64-byte aligned buffers for the arrays of staged batches.

    Aligned, so TensorFlow wraps them without another copy; reused, to spare a fresh
    multi-megabyte allocation per request whose pages fault on first touch (glibc unmaps
    emptied per-thread heaps whatever ``keep_freed_memory`` says). Reused only when nothing
    else refers to it (CPython reference counts: e.g. an unreleased tensor); free buffers are
    kept up to ``max_bytes``."""

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
        out = self.empty(array.shape, array.dtype)
        np.copyto(out, array)
        return out

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Uninitialised, C-contiguous and aligned."""
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
        """Empty ``columns`` (made by `copy`), keeping the buffers; hold no other reference."""
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
