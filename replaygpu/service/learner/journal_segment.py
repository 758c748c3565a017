"""The segment a `Journal` appends to, rolled back to its synced end after an `Outage`; and opening
a journal's segments, cutting a torn tail off the last. No TensorFlow. Rolling back is safe: bytes
before `OpenSegment.synced` were fsynced, bytes after it belong to records nobody acknowledged (an
ack waits for `sync`). Cutting to `synced` and fsyncing drops exactly those, whatever a failed write
or fsync left in the page cache."""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from replaygpu.disk import describe_space, free_bytes, fsync_path, is_full
from replaygpu.service.learner.journal_files import (
    JournalError,
    JournalFullError,
    segment_name,
    segment_numbers,
    valid_end,
)

logger = logging.getLogger(__name__)

_IOV_MAX = 1024  # buffers per writev: IOV_MAX on Linux and macOS
_datasync = getattr(os, "fdatasync", os.fsync)


class OpenSegment:
    """Segment ``number``, open for appending at its end (created empty when ``create``);
    ``synced``: bytes known to be on disk: its size when opened, created or last synced.

    Raises:
        OSError: the file cannot be opened or created (nothing was changed).
    """

    def __init__(self, path: Path, number: int, create: bool) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self.fd = os.open(path, flags, 0o600)
        self.path = path
        self.number = number
        self.size = self.synced = 0 if create else os.fstat(self.fd).st_size

    @property
    def dirty(self) -> bool:
        return self.size != self.synced

    def write(self, buffers: list[memoryview]) -> int:
        """Returns the bytes written; an `OSError` leaves `size` counting those written before."""
        buffers = [b for b in buffers if b.nbytes]
        total = sum(b.nbytes for b in buffers)
        first = 0
        while first < len(buffers):
            done = os.writev(self.fd, buffers[first : first + _IOV_MAX])
            if done == 0:
                raise OSError(errno.EIO, "writev wrote nothing")
            self.size += done
            while done > 0 and done >= buffers[first].nbytes:
                done -= buffers[first].nbytes
                first += 1
            if done:
                buffers[first] = buffers[first][done:]
        return total

    def sync(self) -> None:
        if self.dirty:
            _datasync(self.fd)
            self.synced = self.size

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        os.fsync(self.fd)
        self.size = self.synced = size

    def roll_back(self) -> int:
        """Cut what was written since the last sync; returns the bytes cut. Raises `OSError`."""
        cut = self.size - self.synced
        self.truncate(self.synced)
        return cut

    def close(self) -> None:
        """Without syncing."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Outage:
    """A failed write, fsync or rotation of a journal, until it recovers; ``full``: ENOSPC or
    EDQUOT; ``needed``: bytes the failed write wanted (a full disk recovers once they are free)."""

    what: str
    full: bool
    needed: int

    @classmethod
    def of(cls, what: str, exc: OSError, needed: int) -> Outage:
        return cls(f"{what} failed: {exc.strerror or exc}", is_full(exc), needed)

    def may_recover(self, directory: Path) -> bool:
        """Not for a full disk that still lacks the room."""
        free = free_bytes(directory)
        return not self.full or free is None or free >= self.needed

    def error(self, directory: Path) -> JournalError:
        """The error appends get while it lasts."""
        if self.full:
            return JournalFullError(
                f"journal {directory}: its file system is full ({self.what}; "
                f"{describe_space(directory)}, {self.needed} needed); appends are refused "
                "until space is freed, then resume by themselves"
            )
        return JournalError(
            f"journal {directory}: {self.what}; nothing appended since the last successful "
            "sync may be acknowledged; the next append tries again from there"
        )


def open_segments(directory: Path) -> tuple[dict[int, int], OpenSegment, int]:
    """Open the last segment for appending (creating the first), truncating a torn tail.

    Returns:
        ``({closed segment number: bytes}, the last segment, bytes truncated off it)``.

    Raises:
        JournalCorruptError: the last segment is corrupt before its end, or a segment is
            missing between the first and the last.
    """
    numbers = segment_numbers(directory)
    if not numbers:
        segment = OpenSegment(directory / segment_name(1), 1, create=True)
        fsync_path(directory)
        return {}, segment, 0
    *closed, last = numbers
    sizes = {number: (directory / segment_name(number)).stat().st_size for number in closed}
    path = directory / segment_name(last)
    segment = OpenSegment(path, last, create=False)
    try:
        end, bad = valid_end(path, segment.size)
        if bad is None:
            return sizes, segment, 0
        logger.warning(
            "journal segment %s: torn tail at byte offset %d (%s), left by a write cut short "
            "before it was synced; truncated %d bytes",
            path,
            end,
            bad.reason,
            segment.size - end,
        )
        truncated = segment.size - end
        segment.truncate(end)
        return sizes, segment, truncated
    except BaseException:
        segment.close()
        raise
