"""An append-only journal of raw AppendRequest bytes, for acknowledgements that mean "on disk".

In durable mode the committer, per commit round, calls ``journal.append(records)`` and then
``journal.sync()`` (one fdatasync per round) before it acknowledges; after a checkpoint of the
table is durably saved it calls ``journal.checkpointed()``. On restart, after restoring the
checkpoint, the server feeds ``journal.replay()`` back through its exactly-once path (records
already in the checkpoint are dropped there as duplicates by ``(actor, seq)``). No TensorFlow.

The files (segments, the record format, how records are read and checked, the directory
lock) are described in `journal_files`; this module holds the `Journal` that writes them.

Guarantees and limits:

- Writes go through ``os.writev`` on an ``O_APPEND`` descriptor (no Python buffering). A segment
  is fsynced before it is closed for rotation and the directory is fsynced when one is created,
  so once `sync` returns every record appended before it survives a crash or a power cut.
- Opening scans the last segment. A torn tail there (a partial header, a record cut short, or a
  bad record with no whole valid record after it: what a kill -9 or a power cut leaves behind
  from a write that was never synced) is truncated with a warning. Anything else that does not
  check out raises `JournalCorruptError` naming the file and offset, and nothing is skipped:
  from the constructor for the last segment, from `replay` for the earlier ones (a closed
  segment was synced whole, so no torn tail is tolerated there). A checksum failure in the very
  last record of the last segment cannot be told from a torn write and is truncated too; a
  power cut that persisted an unsynced record but not the one before it is reported as
  corruption (the error says how to truncate by hand).
- Disk use is bounded by what was appended since the last checkpoint (plus 16 bytes a record):
  `checkpointed` starts a new segment and deletes every earlier one, so checkpoint regularly.
  Segments rotate at ``JournalConfig.segment_bytes``; a larger record gets a segment of its own.
- After a failed write or fsync the journal refuses further appends (`JournalError`): what the
  kernel reports once about a failed fsync it may not report again, so nothing written since
  the last good `sync` may be acknowledged. Reopen it (restart the server) to recover.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from replaygpu.errors import ConfigError
from replaygpu.service.learner.journal_files import (
    HEADER_BYTES,
    MAX_RECORD_BYTES,
    JournalError,
    fsync_dir,
    lock_directory,
    record_header,
    segment_name,
    segment_numbers,
    segment_records,
    valid_end,
)

logger = logging.getLogger(__name__)

MiB = 2**20
_IOV_MAX = 1024  # buffers per writev: IOV_MAX on Linux and macOS
_datasync = getattr(os, "fdatasync", os.fsync)


@dataclass(frozen=True)
class JournalConfig:
    """Settings of a `Journal`.

    Attributes:
        segment_bytes: start a new segment once the current one would grow past this many
            bytes. Smaller segments free disk sooner after a checkpoint; each rotation costs
            one extra fsync.
    """

    segment_bytes: int = 256 * MiB

    def __post_init__(self) -> None:
        value = self.segment_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"JournalConfig.segment_bytes: got {value!r}, expected an int >= 1")


class Journal:
    """An open journal directory: append and sync records, replay them, drop checkpointed ones.

    Appends come from one thread; `checkpointed`, `rotate` and the metric properties may be
    called from others (a lock orders them).

    Args:
        directory: the journal directory; created (with its parents) when missing.
        config: segment size; `JournalConfig()` when None.

    Raises:
        ConfigError: another `Journal` holds the directory, or ``directory`` is not one.
        JournalCorruptError: the last segment is corrupt before its end (see the module
            docstring), or a segment is missing between the first and the last.
    """

    def __init__(self, directory: str | os.PathLike[str], config: JournalConfig | None = None):
        if config is None:
            config = JournalConfig()
        if not isinstance(config, JournalConfig):
            raise ConfigError(
                f"Journal.config: got {type(config).__name__}, expected JournalConfig"
            )
        self.config = config
        self._dir = Path(directory)
        try:
            if not self._dir.is_dir():
                self._dir.mkdir(parents=True)
                fsync_dir(self._dir.resolve().parent)
        except OSError as exc:
            raise ConfigError(f"journal directory {self._dir}: cannot create it: {exc}") from exc
        self._lock = threading.Lock()
        self._gc_lock = threading.Lock()
        self._lock_fd = lock_directory(self._dir)
        self._fd = -1
        self._sizes: dict[int, int] = {}  # segment number -> bytes, the current one last
        self._current = 0
        self._dirty = False
        self._closed = False
        self._failed: str | None = None
        self._records = self._bytes = self._truncated = 0
        try:
            self._open_segments()
        except BaseException:
            if self._fd >= 0:
                os.close(self._fd)
            os.close(self._lock_fd)
            raise
        logger.info(
            "journal %s: opened, %d segment(s), %d bytes since the last checkpoint",
            self._dir,
            len(self._sizes),
            sum(self._sizes.values()),
        )

    def _path(self, number: int) -> Path:
        return self._dir / segment_name(number)

    def _open_segments(self) -> None:
        numbers = segment_numbers(self._dir)
        if not numbers:
            self._create(1)
            return
        self._sizes = {number: self._path(number).stat().st_size for number in numbers}
        last = numbers[-1]
        path = self._path(last)
        size = self._sizes[last]
        end, bad = valid_end(path, size)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self._current = last
        if bad is not None:
            logger.warning(
                "journal segment %s: torn tail at byte offset %d (%s), left by a write cut "
                "short before it was synced; truncated %d bytes",
                path,
                end,
                bad.reason,
                size - end,
            )
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
            self._sizes[last] = end
            self._truncated = size - end

    def _create(self, number: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC
        self._fd = os.open(self._path(number), flags, 0o600)
        self._current = number
        self._sizes[number] = 0
        fsync_dir(self._dir)

    def _usable(self) -> None:
        if self._closed:
            raise JournalError(f"journal {self._dir} is closed")
        if self._failed is not None:
            raise JournalError(
                f"journal {self._dir} failed earlier ({self._failed}); records appended since "
                f"the last successful sync may not be on disk and must not be acknowledged. "
                f"Reopen the journal (restart the server) to recover"
            )

    def _fail(self, what: str, exc: OSError) -> JournalError:
        self._failed = f"{what} {self._path(self._current)}: {exc}"
        logger.error("journal %s: %s", self._dir, self._failed)
        return JournalError(
            f"journal {self._dir}: {self._failed}; nothing appended since the last successful "
            f"sync may be acknowledged, and the journal refuses further use until reopened"
        )

    # -- writing --------------------------------------------------------------------------------

    def append(self, records: Iterable[bytes | bytearray | memoryview]) -> int:
        """Write ``records`` (raw AppendRequest bytes) in order; durable only after `sync`.

        Returns:
            The bytes written, headers included.

        Raises:
            ConfigError: a record is not bytes-like or is 4 GiB or larger; nothing was written.
            JournalError: the journal is closed or failed, or this write failed (then it is
                failed from now on).
        """
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
        with self._lock:
            self._usable()
            written = 0
            try:
                group: list[tuple[bytes, memoryview]] = []
                size = self._sizes[self._current]
                for header, view in frames:
                    framed = HEADER_BYTES + view.nbytes
                    if size > 0 and size + framed > self.config.segment_bytes:
                        written += self._write(group)
                        group = []
                        self._rotate()
                        size = 0
                    group.append((header, view))
                    size += framed
                return written + self._write(group)
            except OSError as exc:
                raise self._fail("writing", exc) from exc

    def _write(self, frames: list[tuple[bytes, memoryview]]) -> int:
        """Write ``frames`` to the current segment, all of them (writev may write fewer)."""
        buffers = [memoryview(b) for frame in frames for b in frame if len(b)]
        total = sum(b.nbytes for b in buffers)
        first = 0
        while first < len(buffers):
            done = os.writev(self._fd, buffers[first : first + _IOV_MAX])
            if done == 0:
                raise OSError(errno.EIO, "writev wrote nothing")
            self._sizes[self._current] += done
            self._dirty = True
            while done > 0 and done >= buffers[first].nbytes:
                done -= buffers[first].nbytes
                first += 1
            if done:
                buffers[first] = buffers[first][done:]
        self._records += len(frames)
        self._bytes += total
        return total

    def sync(self) -> None:
        """Make every record appended so far durable: one fdatasync, when anything is new.

        Acknowledge a record only after this returns.

        Raises:
            JournalError: the journal is closed or failed, or the fsync failed (then it is
                failed from now on).
        """
        with self._lock:
            self._usable()
            if self._dirty:
                try:
                    _datasync(self._fd)
                except OSError as exc:
                    raise self._fail("syncing", exc) from exc
                self._dirty = False

    def _rotate(self) -> None:
        """Sync and close the current segment and create the next (callers hold the lock)."""
        if self._dirty:
            _datasync(self._fd)
            self._dirty = False
        os.close(self._fd)
        self._fd = -1
        self._create(self._current + 1)

    def rotate(self) -> int:
        """Sync and close the current segment and start a new one, unless it is empty.

        Returns:
            The number of the segment now being written: every record appended before this
            call is in a segment numbered below it (pass it to `checkpointed`).
        """
        with self._lock:
            self._usable()
            if self._sizes[self._current] > 0:
                try:
                    self._rotate()
                except OSError as exc:
                    raise self._fail("rotating", exc) from exc
            return self._current

    def checkpointed(self, before: int | None = None) -> int:
        """Delete the segments a durably saved checkpoint covers: those numbered below
        ``before``, by default all but a new current one (``before = rotate()``).

        Without ``before``, call it while no append can run between the checkpoint's snapshot
        of the table and this call (inside the server's commit-exclusive section, right after
        the save): every record appended before it is taken to be in the checkpoint. With it,
        take ``before = rotate()`` in that section before saving and call this any time after.
        Make the checkpoint durable (fsynced) first: what is deleted here exists nowhere else.

        Returns:
            The number of segments deleted.

        Raises:
            ConfigError: ``before`` is above the segment being written.
            JournalError: the journal is closed or failed, or a deletion failed (that segment
                and the later ones are kept).
        """
        if before is None:
            before = self.rotate()
        with self._lock:
            self._usable()
            if isinstance(before, bool) or not isinstance(before, int) or before > self._current:
                raise ConfigError(
                    f"Journal.checkpointed: before={before!r}, expected an int <= "
                    f"{self._current}, the segment being written (take it from rotate())"
                )
            doomed = sorted(number for number in self._sizes if number < before)
            for number in doomed:
                del self._sizes[number]
        with self._gc_lock:  # oldest first, each durably, so a crash leaves no gap behind
            for done, number in enumerate(doomed):
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path(number))
                    fsync_dir(self._dir)
                except OSError as exc:
                    with self._lock:
                        for kept in doomed[done:]:
                            with contextlib.suppress(OSError):
                                self._sizes[kept] = self._path(kept).stat().st_size
                    raise JournalError(
                        f"journal {self._dir}: deleting checkpointed segment "
                        f"{segment_name(number)} failed: {exc}; it and the later ones are kept"
                    ) from exc
        if doomed:
            logger.info("journal %s: deleted %d checkpointed segment(s)", self._dir, len(doomed))
        return len(doomed)

    # -- reading --------------------------------------------------------------------------------

    def replay(self) -> Iterator[bytes]:
        """Yield every record in the journal, in write order, checksums verified.

        It reads what was appended before iteration starts; do not call `checkpointed` until it
        is done (a deleted segment cannot be read).

        Raises:
            JournalCorruptError: a record fails its checks; the records before it were yielded.
            JournalError: the journal is closed or failed, or a segment was deleted meanwhile.
        """
        with self._lock:
            self._usable()
            plan = [(self._path(number), size) for number, size in sorted(self._sizes.items())]
        for path, size in plan:
            try:
                yield from segment_records(path, size)
            except FileNotFoundError as exc:
                raise JournalError(
                    f"journal segment {path} was deleted during replay (checkpointed() ran); "
                    f"replay the journal before checkpointing"
                ) from exc

    # -- metrics and lifecycle ------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        """The journal directory."""
        return self._dir

    @property
    def nbytes(self) -> int:
        """Bytes on disk in all segments: what was appended since the last checkpoint."""
        with self._lock:
            return sum(self._sizes.values())

    @property
    def segments(self) -> int:
        """Segment files on disk, the one being written included."""
        with self._lock:
            return len(self._sizes)

    @property
    def truncated_bytes(self) -> int:
        """Bytes of a torn tail cut off the last segment when this journal was opened."""
        return self._truncated

    @property
    def records_written(self) -> int:
        """Records appended since this journal was opened."""
        return self._records

    @property
    def bytes_written(self) -> int:
        """Bytes appended since this journal was opened, headers included."""
        return self._bytes

    def close(self) -> None:
        """Sync what was appended (unless the journal failed) and release the directory.

        Idempotent.

        Raises:
            JournalError: the final fsync failed.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._dirty and self._failed is None:
                    _datasync(self._fd)
            except OSError as exc:
                raise self._fail("syncing", exc) from exc
            finally:
                if self._fd >= 0:
                    os.close(self._fd)
                    self._fd = -1
                os.close(self._lock_fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
