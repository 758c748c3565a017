"""The journal's files on disk: segment names, record format, reading and checking records,
the directory lock, the segment a `Journal` appends to and opening a journal's segments, cutting a
torn tail off the last (the rules of torn tails are in `journal`). No TensorFlow. Segments
``journal-000001.log``, ``journal-000002.log``, ... and a ``journal.lock`` held with ``flock``
while a `Journal` is open (one server per directory). A record is
``[magic "RGJ1"][u32 length][u32 crc32(payload)][u32 crc32(the 12 bytes before)][payload]``,
little-endian; the header checksum makes a flipped length bit corruption, not a short record.

An `OpenSegment` is rolled back to its synced end after an `Outage`. That is safe: bytes before
`OpenSegment.synced` were fsynced, bytes after it belong to records nobody acknowledged (an ack
waits for `sync`). Cutting to `synced` and fsyncing drops exactly those, whatever a failed write
or fsync left in the page cache."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from replaygpu.disk import describe_space, free_bytes, fsync_path, is_full
from replaygpu.errors import ConfigError, ReplayError, StorageFullError

logger = logging.getLogger(__name__)

MAGIC = b"RGJ1"
_PREFIX = struct.Struct("<4sII")  # magic, payload length, crc32 of the payload
_HEADER = struct.Struct("<4sIII")  # ... and crc32 of the prefix
HEADER_BYTES = _HEADER.size
MAX_RECORD_BYTES = 2**32 - 1
LOCK_NAME = "journal.lock"
_SEGMENT = re.compile(r"journal-(\d{6,})\.log")
_IOV_MAX = 1024  # buffers per writev: IOV_MAX on Linux and macOS
_datasync = getattr(os, "fdatasync", os.fsync)


class JournalError(ReplayError, RuntimeError):
    """The journal cannot be used: it is closed, or a write or fsync failed earlier."""


class JournalFullError(JournalError, StorageFullError):
    """The journal's file system is full: appends are refused until space is freed, then
    resume by themselves."""


class JournalCorruptError(JournalError):
    """A journal segment holds bytes that are not a valid record, and not as a torn tail;
    ``offset``: byte offset of the first bad record (the bytes before it are valid)."""

    def __init__(self, path: Path, offset: int, reason: str, detail: str = "") -> None:
        super().__init__(
            f"journal segment {path} is corrupt at byte offset {offset}: {reason}"
            f"{f' ({detail})' if detail else ''}. Nothing was skipped or truncated. To keep "
            f"the records before it, truncate the file to {offset} bytes; to start over from "
            f"the checkpoint alone, move the journal directory aside. Either way the records "
            f"from that offset on are lost."
        )
        self.path = path
        self.offset = offset
        self.reason = reason


def segment_name(number: int) -> str:
    return f"journal-{number:06d}.log"


def segment_numbers(directory: Path) -> list[int]:
    """Ascending; `JournalCorruptError` if one is missing between the first and the last."""
    matches = (_SEGMENT.fullmatch(name) for name in os.listdir(directory))
    numbers = sorted(int(m[1]) for m in matches if m and segment_name(int(m[1])) == m[0])
    for expected, number in enumerate(numbers, start=numbers[0] if numbers else 0):
        if number != expected:
            raise JournalCorruptError(
                directory / segment_name(expected),
                0,
                "the segment is missing",
                f"found {number} after it",
            )
    return numbers


def record_header(payload: memoryview) -> bytes:
    """``payload``: a byte view under `MAX_RECORD_BYTES`."""
    prefix = _PREFIX.pack(MAGIC, payload.nbytes, zlib.crc32(payload))
    return prefix + struct.pack("<I", zlib.crc32(prefix))


def frame_records(
    records: Iterable[bytes | bytearray | memoryview],
) -> list[tuple[bytes, memoryview]]:
    """``(header, payload)`` per record; `ConfigError` if not bytes-like or 4 GiB or more."""
    frames = []
    for index, record in enumerate(records):
        try:
            view = memoryview(record).cast("B")
        except TypeError as exc:
            raise ConfigError(
                f"Journal.append: record {index} is {type(record).__name__}, expected "
                f"contiguous bytes-like (bytes, bytearray, memoryview); nothing was written"
            ) from exc
        if view.nbytes > MAX_RECORD_BYTES:
            raise ConfigError(
                f"Journal.append: record {index} is {view.nbytes} bytes, over the "
                f"{MAX_RECORD_BYTES}-byte limit of a journal record; nothing was written"
            )
        frames.append((record_header(view), view))
    return frames


class BadRecord(NamedTuple):
    """Why there is no valid record at an offset."""

    reason: str
    torn: bool  # only a write cut short makes this (a partial header, or a payload past EOF)


def record_at(view: memoryview, offset: int, end: int) -> tuple[int, int] | BadRecord:
    """``(start, stop)`` of the payload at ``offset``, or why there is none."""
    if end - offset < HEADER_BYTES:
        return BadRecord(f"a partial record header of {end - offset} bytes", torn=True)
    magic, length, crc, header_crc = _HEADER.unpack_from(view, offset)
    if magic != MAGIC:
        return BadRecord(f"no record magic (found {magic!r}, expected {MAGIC!r})", torn=False)
    if zlib.crc32(view[offset : offset + _PREFIX.size]) != header_crc:
        return BadRecord("the record header fails its checksum", torn=False)
    start = offset + HEADER_BYTES
    if start + length > end:
        return BadRecord(f"a record of {length} bytes runs past the end at {end}", torn=True)
    if zlib.crc32(view[start : start + length]) != crc:
        return BadRecord(f"the {length}-byte record fails its checksum", torn=False)
    return start, start + length


def _valid_record_after(mm: mmap.mmap, view: memoryview, offset: int, end: int) -> int | None:
    pos = offset
    while (pos := mm.find(MAGIC, pos + 1, end)) >= 0:
        if not isinstance(record_at(view, pos, end), BadRecord):
            return pos
    return None


@contextlib.contextmanager
def _mapped(path: Path, size: int) -> Iterator[tuple[mmap.mmap, memoryview]]:
    """``size`` > 0."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            yield mm, view
        finally:
            view.release()


def segment_records(path: Path, size: int) -> Iterator[bytes]:
    """Raises `JournalCorruptError` at a bad record."""
    if size == 0:
        return
    with _mapped(path, size) as (_, view):
        offset = 0
        while offset < size:
            record = record_at(view, offset, size)
            if isinstance(record, BadRecord):
                raise JournalCorruptError(path, offset, record.reason)
            yield bytes(view[record[0] : record[1]])
            offset = record[1]


def valid_end(path: Path, size: int) -> tuple[int, BadRecord | None]:
    """Where the last segment's valid records end, and what follows (None: the end).
    `JournalCorruptError` for a bad record a valid one follows (not a torn tail)."""
    offset = 0
    if size == 0:
        return offset, None
    with _mapped(path, size) as (mm, view):
        while offset < size:
            record = record_at(view, offset, size)
            if isinstance(record, BadRecord):
                later = None if record.torn else _valid_record_after(mm, view, offset, size)
                if later is not None:
                    raise JournalCorruptError(
                        path, offset, record.reason, f"a valid record follows at {later}"
                    )
                return offset, record
            offset = record[1]
    return offset, None


def lock_directory(directory: Path) -> int:
    """The descriptor of ``journal.lock``, locked; `ConfigError` when another holds it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ConfigError(
            f"journal directory {directory} is in use by another journal (process {holder}); "
            f"two servers cannot share one journal: give each its own directory, or stop the "
            f"other one first"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    with contextlib.suppress(OSError):  # informative only: a full disk must not stop a start
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


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
