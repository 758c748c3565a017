"""An append-only journal of raw AppendRequest bytes, for acknowledgements that mean "on disk".

Per commit round the committer calls `Journal.append`, then `Journal.sync` (one fdatasync)
before it acknowledges; after a durable checkpoint, `Journal.checkpointed`. On restart the
server feeds `Journal.replay` through its exactly-once path, which drops records already in the
checkpoint by ``(actor, seq)``. The files and the segment being written are in `journal_files`.
No TensorFlow.

- Writes are ``os.writev`` on an ``O_APPEND`` descriptor (no Python buffering); a segment is
  fsynced before rotation and the directory when one is created, so records appended before a
  `sync` returns survive a crash or a power cut.
- Opening scans the last segment. A torn tail (partial header, record cut short, or a bad
  record with no valid one after it: an unsynced write cut by kill -9 or power loss) is
  truncated with a warning; a checksum failure in the very last record is taken for one too.
  Anything else raises `JournalCorruptError` naming file and offset, skipping nothing: from the
  constructor for the last segment, from `replay` for earlier (synced whole) ones. A power cut
  that kept an unsynced record but not the one before it is reported as corruption (the error
  says how to truncate by hand).
- `checkpointed` deletes only segments the checkpoint before the newest covers, so if the
  newest is corrupt the previous one plus the journal hold every acknowledged batch. Disk use:
  what was appended since then, plus 16 bytes a record. Segments rotate at
  ``JournalConfig.segment_bytes``; a larger record gets a segment of its own.
- A failed write or fsync fails that call (`JournalFullError` on a full file system, else
  `JournalError`); nothing since the last good `sync` may be acknowledged. The next call (or
  `check`) cuts the segment back to its last synced byte and goes on; on a full disk, once
  there is room for the failed write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from replaygpu.disk import describe_space, fsync_path
from replaygpu.errors import ConfigError, check_int
from replaygpu.service.server.journal_files import (
    HEADER_BYTES,
    JournalError,
    OpenSegment,
    Outage,
    frame_records,
    lock_directory,
    open_segments,
    segment_name,
    segment_records,
)

logger = logging.getLogger(__name__)

MiB = 2**20


@dataclass(frozen=True)
class JournalConfig:
    """``segment_bytes``: rotate before a segment grows past this. Smaller segments free disk
    sooner after a checkpoint; each rotation costs one extra fsync."""

    segment_bytes: int = 256 * MiB

    def __post_init__(self) -> None:
        check_int("JournalConfig.segment_bytes", self.segment_bytes, 1)


class Journal(contextlib.AbstractContextManager["Journal"]):
    """An open journal directory: append and sync records, replay them, drop checkpointed ones.

    Appends come from one thread; `checkpointed`, `rotate`, `check` and the metric properties
    may be called from others (a lock orders them). ``directory`` is created when missing.

    Raises:
        ConfigError: another `Journal` holds the directory, or ``directory`` is not one.
        JournalCorruptError: the last segment is corrupt before its end, or a segment is
            missing between the first and the last.
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
                fsync_path(self._dir.resolve().parent)
        except OSError as exc:
            raise ConfigError(f"journal directory {self._dir}: cannot create it: {exc}") from exc
        self._lock = threading.Lock()
        self._gc_lock = threading.Lock()
        self._lock_fd = lock_directory(self._dir)
        self._sizes: dict[int, int] = {}  # closed segment number -> bytes
        self._segment: OpenSegment | None = None  # None once closed
        self._marks: list[int] = []  # the segment each checkpoint starts after, oldest first
        self._outage: Outage | None = None
        try:
            self._sizes, self._segment, self._truncated = open_segments(self._dir)
        except BaseException:
            os.close(self._lock_fd)
            raise
        logger.info(
            "journal %s: opened, %d segment(s), %d bytes since the last checkpoint",
            self._dir,
            self.segments,
            self.nbytes,
        )

    def _path(self, number: int) -> Path:
        return self._dir / segment_name(number)

    @property
    def _current(self) -> OpenSegment:
        if self._segment is None:
            raise JournalError(f"journal {self._dir} is closed")
        return self._segment

    # -- failures and recovery ------------------------------------------------------------------

    def _usable(self) -> None:
        """Raise unless appends can go on, recovering first (callers hold the lock)."""
        if self._segment is None:
            raise JournalError(f"journal {self._dir} is closed")
        if self._outage is not None:
            self._recover()

    def _recover(self) -> None:
        outage = self._outage
        assert outage is not None
        if not outage.may_recover(self._dir):
            raise outage.error(self._dir)  # still full: no syscalls that would fail again
        segment = self._current
        try:
            cut = segment.roll_back()
            fsync_path(self._dir)
        except OSError as exc:
            raise self._fail(f"recovering (cutting {segment.path.name} back)", exc, 0) from exc
        self._outage = None
        logger.warning(
            "journal %s: appends resume (%s; cut %d unacknowledged bytes after %s)",
            self._dir,
            describe_space(self._dir),
            cut,
            outage.what,
        )

    def _fail(self, what: str, exc: OSError, needed: int) -> JournalError:
        """Record a failed write, fsync or rotation (callers hold the lock); the error to raise."""
        first = self._outage is None
        self._outage = Outage.of(what, exc, needed)
        if first:  # one line per outage, not one per refused round
            logger.warning("%s", self._outage.error(self._dir))
        return self._outage.error(self._dir)

    def check(self) -> str | None:
        """Recover from a failed write now; returns what still keeps appends out, or None."""
        with self._lock:
            if self._segment is None or self._outage is None:
                return None
            try:
                self._recover()
            except JournalError as exc:
                return str(exc)
            return None

    # -- writing --------------------------------------------------------------------------------

    def append(self, records: Iterable[bytes | bytearray | memoryview]) -> int:
        """Write raw AppendRequest bytes in order, durable after `sync`; returns bytes written.

        Raises:
            ConfigError: a record is not bytes-like or is 4 GiB or larger; nothing was written.
            JournalFullError: the file system is full; nothing of it will be replayed.
            JournalError: the journal is closed, or a write failed.
        """
        frames = frame_records(records)
        needed = sum(HEADER_BYTES + view.nbytes for _, view in frames)
        with self._lock:
            self._usable()
            written = 0
            try:
                group: list[tuple[bytes, memoryview]] = []
                size = self._current.size
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
                raise self._fail(f"writing {self._current.path.name}", exc, needed) from exc

    def _write(self, frames: list[tuple[bytes, memoryview]]) -> int:
        return self._current.write([memoryview(b) for frame in frames for b in frame])

    def sync(self) -> None:
        """One fdatasync, when anything is new; acknowledge a record only after it returns.
        `JournalError` when the journal is closed or failed, or the fsync failed."""
        with self._lock:
            self._usable()
            segment = self._current
            try:
                segment.sync()
            except OSError as exc:
                unsynced = segment.size - segment.synced
                raise self._fail(f"syncing {segment.path.name}", exc, unsynced) from exc

    def _rotate(self) -> None:
        """Callers hold the lock; a failure leaves the current one open (or the next, if made)."""
        old = self._current
        old.sync()
        self._segment = OpenSegment(self._path(old.number + 1), old.number + 1, create=True)
        self._sizes[old.number] = old.size
        old.close()
        fsync_path(self._dir)

    def rotate(self) -> int:
        """Start a new segment unless the current one is empty; returns the segment now being
        written: records appended before are all below it (pass it to `checkpointed`)."""
        with self._lock:
            self._usable()
            if self._current.size > 0:
                try:
                    self._rotate()
                except OSError as exc:
                    raise self._fail(f"rotating {self._current.path.name}", exc, 0) from exc
            return self._current.number

    @property
    def segment(self) -> int:
        with self._lock:
            return self._current.number

    def resume_after(self, mark: int) -> None:
        """The checkpoint restored at start covers segments below ``mark`` (0: unknown).

        Raises:
            JournalError: the journal's first segment is after ``mark``: acknowledged batches
                between the checkpoint and the journal are in neither (nothing is changed).
        """
        with self._lock:
            first = min([*self._sizes, self._current.number])
            if mark > self._current.number:  # a journal started afresh since: all of it counts
                mark = first
        if 0 < mark < first:
            raise JournalError(
                f"journal {self._dir} starts at {segment_name(first)}, but the restored "
                f"checkpoint needs {segment_name(mark)} and later: the batches acknowledged in "
                f"between are in neither, so the server does not start. Put the newer "
                f"checkpoint's files back, or move {self._dir} aside to start from the "
                "checkpoint alone and lose those batches"
            )
        if mark > 0:
            self._marks = [mark]

    def checkpointed(self, before: int | None = None) -> int:
        """Note a durable (fsynced) checkpoint covering segments below ``before``; returns how
        many segments the one before it covered, now deleted.

        Without ``before`` (= `rotate`), no append may run between the checkpoint's snapshot
        of the table and this call; otherwise take ``before = rotate()`` there, call any time.

        Raises:
            ConfigError: ``before`` is above the segment being written.
            JournalError: the journal is closed, or a deletion failed (that segment and the
                later ones are kept; the next call deletes them).
        """
        if before is None:
            before = self.rotate()
        with self._lock:
            current = self._current.number  # raises once closed
            if isinstance(before, bool) or not isinstance(before, int) or before > current:
                raise ConfigError(
                    f"Journal.checkpointed: before={before!r}, expected an int <= "
                    f"{current}, the segment being written (take it from rotate())"
                )
            cut = self._marks[-1] if self._marks else 0
            self._marks = [cut, before] if cut else [before]
            doomed = sorted(number for number in self._sizes if number < cut)
            sizes = {number: self._sizes.pop(number) for number in doomed}
        with self._gc_lock:  # oldest first, each durably, so a crash leaves no gap behind
            for done, number in enumerate(doomed):
                try:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self._path(number))
                    fsync_path(self._dir)
                except OSError as exc:
                    with self._lock:
                        self._sizes.update({kept: sizes[kept] for kept in doomed[done:]})
                    raise JournalError(
                        f"journal {self._dir}: deleting checkpointed segment "
                        f"{segment_name(number)} failed: {exc}; it and the later ones are kept"
                    ) from exc
        if doomed:
            logger.info("journal %s: deleted %d checkpointed segment(s)", self._dir, len(doomed))
        return len(doomed)

    # -- reading --------------------------------------------------------------------------------

    def replay(self) -> Iterator[bytes]:
        """Every record appended before iteration starts, in order, checksums verified; no
        `checkpointed` until done.

        Raises:
            JournalCorruptError: a record fails its checks; the records before it were yielded.
            JournalError: the journal is closed, or a segment was deleted meanwhile.
        """
        with self._lock:
            sizes = {**self._sizes, self._current.number: self._current.size}
            plan = [(self._path(number), size) for number, size in sorted(sizes.items())]
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
        return self._dir

    @property
    def nbytes(self) -> int:
        """Bytes on disk in all segments: what was appended since the previous checkpoint."""
        with self._lock:
            return sum(self._sizes.values()) + (self._segment.size if self._segment else 0)

    @property
    def segments(self) -> int:
        """Segment files on disk, the one being written included."""
        with self._lock:
            return len(self._sizes) + (self._segment is not None)

    @property
    def truncated_bytes(self) -> int:
        """Bytes of a torn tail cut off the last segment when this journal was opened."""
        return self._truncated

    def close(self) -> None:
        """Sync (unless failed) and release the directory. Idempotent; `JournalError` when the
        final fsync failed."""
        with self._lock:
            segment, self._segment = self._segment, None
            if segment is None:
                return
            try:
                if self._outage is None:
                    segment.sync()
            except OSError as exc:
                raise JournalError(f"journal {self._dir}: syncing at close failed: {exc}") from exc
            finally:
                segment.close()
                os.close(self._lock_fd)

    def __exit__(self, *exc: object) -> None:
        self.close()
