"""Checkpoints of a whole learner: table contents, sampler RNG, counters, networks, optimizer.

Built on `tf.train.Checkpoint`; `checkpoint_files` keeps the folder. A restore is all or
nothing: every live variable's shape and dtype is checked against the saved object graph before
anything is read, and all but the table storage are snapshotted and put back if the read fails.

A checkpoint counts once sealed (see `checkpoint_files`), so a kill mid-save leaves a leftover,
removed (logged) at start and before each save; numbers are never reused. A failed save raises
`CheckpointSaveError` and leaves nothing. A restore skips a corrupt newest checkpoint (with a
warning) for the previous one; with none intact, `CheckpointCorruptError` names the files.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from replaygpu import checkpoint_files, checkpoint_graph
from replaygpu.disk import describe_space
from replaygpu.errors import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointSaveError,
    ConfigError,
)
from replaygpu.table import ReplayTable, Table

logger = logging.getLogger(__name__)

_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
#: what reading a damaged checkpoint raises (TensorFlow's CRC and length checks; its reader's
#: "Read less bytes than requested" is an IndexError)
_DAMAGED = (tf.errors.DataLossError, tf.errors.OutOfRangeError, IndexError)


def check_writable(directory: str) -> None:
    """Make ``directory`` if missing; `ConfigError` if this process cannot write into it."""
    who = f"uid {os.getuid()} gid {os.getgid()}"
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"checkpoint folder {directory!r} cannot be made by {who}: {err.strerror or err}; "
            "pass a `directory` in a folder that exists and is writable, or make it first"
        ) from None
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-check-"):
            pass
    except OSError as err:
        owner = ""
        with contextlib.suppress(OSError):
            st = os.stat(directory)
            owner = f" (owned by uid {st.st_uid}, gid {st.st_gid}, mode {st.st_mode & 0o777:o})"
        raise ConfigError(
            f"checkpoint folder {directory!r}{owner} is not writable by {who}: "
            f"{err.strerror or err}; make it writable (chown {os.getuid()} {directory}, or run "
            "as its owner), or pass another `directory`"
        ) from None


class CheckpointSchedule:
    """Due every ``every_s`` seconds (None: never); a failed checkpoint never stops the caller.

    On `CheckpointSaveError`, `run` logs one line and retries after ``retry_s`` seconds (or the
    period, if shorter): training goes on, and a durable server's journal keeps acknowledged
    batches.
    """

    def __init__(self, every_s: float | None, retry_s: float = 30.0) -> None:
        self.every_s = every_s
        self.retry_s = retry_s
        self.failures = 0
        self.restart()

    def wait_s(self) -> float:
        """Seconds until the next checkpoint is due (0 when it is; inf: never)."""
        return max(0.0, self._next - time.monotonic())

    def due(self) -> bool:
        """Whether a checkpoint is due now."""
        return self.wait_s() == 0.0

    def restart(self) -> None:
        """Count the period from now (after a restore, or a save made elsewhere)."""
        self._next = time.monotonic() + (self.every_s if self.every_s is not None else math.inf)

    def run(self, save: Callable[[], str | None]) -> str | None:
        """``save()``; its path, or None when it failed (logged; retried after ``retry_s``)."""
        try:
            path = save()
        except CheckpointSaveError as err:
            self.failures += 1
            retry = min(self.retry_s, self.every_s or self.retry_s)
            self._next = time.monotonic() + retry
            logger.error("%s; training goes on, next try in %.0f s", err, retry)
            return None
        self.restart()
        return path


class Checkpointer:
    """Saves and restores a learner and anything trackable beside it.

    Args:
        directory: folder of the checkpoints (made if missing).
        sampler: its sampler (the RNG state makes restored sampling exact).
        learner: the learner (step counter, rate-limiter counters).
        max_to_keep: sealed checkpoints kept on disk.
        **extra: more trackables: networks, optimizers, the service's sequence ledger, ...

    One `Checkpointer` per folder: an unsealed checkpoint there is a leftover, and removed.
    `ConfigError`: nothing to save, or a folder that is not writable.

    Example::

        ckpt = rg.Checkpointer("/tmp/run", table=table, sampler=sampler, learner=learner,
                               q_net=q_net, optimizer=opt)
        ckpt.restore()          # no-op when the folder has no checkpoint yet
        ...
        ckpt.save()
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        table: Table | None = None,
        sampler: Any = None,
        learner: Any = None,
        max_to_keep: int = 3,
        **extra: Any,
    ) -> None:
        named = {"table": table, "sampler": sampler, "learner": learner, **extra}
        self.objects = {k: v for k, v in named.items() if v is not None}
        if not self.objects:
            raise ConfigError("Checkpointer: nothing to save; pass table=, learner= or others")
        self.directory = os.fspath(directory)
        check_writable(self.directory)  # now, not at the first save hours later
        self.table = table if table is not None else getattr(learner, "table", None)
        self._table_prefix = "table/" if table is not None else "learner/table/"
        if max_to_keep < 1:
            raise ConfigError(
                f"Checkpointer: max_to_keep={max_to_keep}, expected at least 1 (the newest is "
                "what a restart restores); pass max_to_keep=1 or more"
            )
        self.max_to_keep = max_to_keep
        self._checkpoint = tf.train.Checkpoint(**self.objects)
        self._pending: str | None = None  # a save not sealed yet
        # numbers go on above what the folder held, leftovers included: never reused
        self._next_number = checkpoint_files.next_number(self.directory)
        self._remove_leftovers()

    @property
    def latest(self) -> str | None:
        """Path prefix of the newest sealed checkpoint, or None."""
        newest = checkpoint_files.sealed(self.directory)
        return newest[0] if newest else None

    def save(self, step: int | None = None, *, seal: bool = True) -> str:
        """Write and seal a checkpoint; its path prefix. Removes leftovers first, prunes after.

        Args:
            step: its number (default: above every number the folder held, leftovers included).
            seal: False leaves fsync, manifest and pruning to `seal`, e.g. after a lock held for
                the write is released (a server's commits wait only for TensorFlow's write).
                Until then a restart skips it.

        Raises:
            CheckpointSaveError: it could not be written (the message names the folder, the
                reason and the free bytes); nothing of it is left, earlier ones are untouched.
            ConfigError: ``step`` is not above every number in the folder.
        """
        number = max(self._next_number, checkpoint_files.next_number(self.directory))
        self._remove_leftovers()
        if step is not None and step < number:
            raise ConfigError(
                f"Checkpointer.save: step={step}, but {self.directory} held number {number - 1}; "
                "a save never writes over, or numbers below, a checkpoint in its folder. "
                "Pass a step above it, or none (the next number)"
            )
        number = number if step is None else step
        prefix = os.path.join(self.directory, f"ckpt-{number}")
        self._next_number = number + 1
        self._pending = prefix
        try:
            path = self._checkpoint.write(prefix)
        except (OSError, tf.errors.OpError) as err:
            raise self._failed(err) from err
        if seal:
            self.seal(path)
        return path

    def seal(self, path: str) -> None:
        """Seal a ``save(seal=False)`` checkpoint, record TensorFlow's state file, prune.
        Raises `CheckpointSaveError` as `save` does."""
        try:
            checkpoint_files.seal(path)
        except OSError as err:
            raise self._failed(err) from err
        self._pending = None
        logger.info("saved checkpoint %s", path)
        try:
            checkpoint_files.record_state(self.directory)
            checkpoint_files.prune(self.directory, self.max_to_keep)
        except OSError as err:  # the new one is sealed: what is at stake is tried again
            logger.warning(
                "checkpoint %s saved, but TensorFlow's state file or the deletion of older "
                "ones failed (tried again at the next save): %s",
                path,
                err,
            )

    def _remove_leftovers(self) -> None:
        removed, nbytes = checkpoint_files.remove_leftovers(
            self.directory, self.max_to_keep, keep=self._pending
        )
        if removed:
            logger.warning(
                "removed %d leftovers of interrupted checkpoint saves from %s (%.1f MB): %s",
                len(removed),
                self.directory,
                nbytes / 1e6,
                ", ".join(removed),
            )

    def _failed(self, err: BaseException) -> CheckpointSaveError:
        """Undo the save in progress (its files); the error to raise."""
        prefix, self._pending = self._pending, None
        checkpoint_files.discard(prefix)
        self._next_number = int(prefix.rsplit("-", 1)[1])  # nothing of it is left
        return CheckpointSaveError(
            f"checkpoint {prefix}: cannot write it ({_reason(err)}; "
            f"{describe_space(self.directory)}); nothing of it was kept and the "
            "checkpoints before it are untouched"
        )

    def restore(self, path: str | None = None) -> str | None:
        """Restore ``path``, or the newest intact sealed checkpoint; the path, or None if none.

        Raises:
            CheckpointMismatchError: when the checkpoint does not fit (another table spec or
                capacity, other network shapes); every object keeps its old state.
            CheckpointCorruptError: ``path``, or every checkpoint in the folder, is corrupt
                (the message names the files); nothing was restored.
        """
        candidates = (
            [path] if path else checkpoint_files.restorable(self.directory, self.max_to_keep)
        )
        problems: list[str] = []
        for candidate in candidates:
            sealed = checkpoint_files.has_manifest(candidate)  # else TensorFlow's checks only
            problem = checkpoint_files.verify(candidate) if sealed else None
            if problem is None:
                try:
                    self._restore(candidate)
                except CheckpointCorruptError as err:
                    problem = str(err)
            if problem is None:
                if problems:
                    logger.warning(
                        "restored %s, the newest intact checkpoint in %s, after skipping: %s",
                        candidate,
                        self.directory,
                        "; ".join(problems),
                    )
                return candidate
            problems.append(problem)
        if problems:
            raise CheckpointCorruptError(
                f"checkpoint folder {self.directory} holds no intact checkpoint: "
                f"{'; '.join(problems)}. Nothing was restored; put intact files back from a "
                "backup, or move the folder aside to start afresh"
            )
        return None

    def _restore(self, path: str) -> None:
        try:
            reader = tf.train.load_checkpoint(path)
            if self.table is not None:
                self._check_table(path, reader)
            mismatches = checkpoint_graph.mismatched_variables(self._checkpoint, reader)
        except _DAMAGED as err:
            raise CheckpointCorruptError(f"{path}: unreadable ({_reason(err)})") from err
        if mismatches:
            raise CheckpointMismatchError(
                f"checkpoint {path} does not fit the objects it was restored into: "
                f"{'; '.join(mismatches[:8])}"
                f"{f' (and {len(mismatches) - 8} more)' if len(mismatches) > 8 else ''}. "
                "Nothing was restored; build the networks and table as in the saved run."
            )
        shards = self.table.shards if self.table is not None else []
        skip = {id(v) for shard in shards for v in shard.storage.values()}
        found = [v for obj in self.objects.values() for v in checkpoint_graph.variables_of(obj)]
        others = list({id(v): v for v in found if id(v) not in skip}.values())
        snapshot = [tf.identity(v) for v in others]
        try:
            self._checkpoint.read(path).expect_partial().assert_existing_objects_matched()
        except (ValueError, AssertionError, IndexError, tf.errors.OpError) as err:
            for var, old in zip(others, snapshot, strict=True):
                var.assign(old)
            if isinstance(err, _DAMAGED):
                raise CheckpointCorruptError(f"{path}: unreadable ({_reason(err)})") from err
            raise CheckpointMismatchError(
                f"checkpoint {path} does not fit the objects it was restored into: {err}; "
                "nothing was restored. Build the networks and table as in the saved run."
            ) from err
        logger.info("restored checkpoint %s", path)

    def _check_table(self, path: str, reader: Any) -> None:
        """Each shard's fields against the checkpoint; shards are not re-split."""
        table, prefix = self.table, self._table_prefix
        shapes = reader.get_variable_to_shape_map()
        dtypes = reader.get_variable_to_dtype_map()
        pattern = re.compile(f"^{re.escape(prefix)}((?:[^/]+/)*?)storage/")
        held = {m.group(1) for k in shapes if (m := pattern.match(k))}
        if len(held) != table.num_shards:
            raise CheckpointMismatchError(
                f"checkpoint {path} holds {f'{len(held)} shards' if held else 'no table'} under "
                f"'{prefix}', but table '{table.name}' has {table.num_shards} (one per replica); "
                f"nothing was restored. Restore onto a strategy with "
                f"{len(held) or 'the saved number of'} replicas: shards are not re-split"
            )
        paths = checkpoint_graph.object_paths(self._checkpoint, table.shards)
        for shard in table.shards:
            key = re.escape(paths[id(shard)])
            field = re.compile(f"^{key}storage/([^/]+){re.escape(_VALUE)}$")
            saved = {_unescape(m.group(1)): k for k in shapes if (m := field.match(k))}
            self._check_fields(shard, path, saved, shapes, dtypes)

    def _check_fields(
        self, table: ReplayTable, path: str, saved: dict[str, str], shapes: Any, dtypes: Any
    ) -> None:
        # the stored dtype: a field kept as float16/bfloat16 is saved so (storage_dtypes)
        want = {
            name: ([table.capacity, *leaf.shape.as_list()], table.storage_dtypes[name].name)
            for name, leaf in table.spec.items()
        }
        got = {name: (list(shapes[key]), dtypes[key].name) for name, key in saved.items()}
        if not saved:
            raise CheckpointMismatchError(
                f"checkpoint {path} holds no replay table under '{self._table_prefix}'; "
                "nothing was restored"
            )
        if got != want:
            bool_era = sorted(
                name
                for name, leaf in table.spec.items()
                if leaf.dtype == tf.bool and got.get(name, ("", ""))[1] == "bool"
            )
            if bool_era:
                raise CheckpointMismatchError(
                    f"checkpoint {path} stores bool fields {bool_era} as bool; this replaygpu "
                    "stores them as uint8 (a GPU has no bool scatter with int64 indices), and "
                    "before 1.0 it reads no older layout. Nothing was restored; resume the run "
                    "with the replaygpu that wrote it, or start a new checkpoint folder."
                )
            diffs = [
                f"'{name}': table has {want.get(name, 'nothing')}, checkpoint has "
                f"{got.get(name, 'nothing')}"
                for name in sorted(set(want) | set(got))
                if want.get(name) != got.get(name)
            ]
            raise CheckpointMismatchError(
                f"checkpoint {path} holds a table of another spec, capacity or storage dtype "
                f"([capacity, ...shape], stored dtype): {'; '.join(diffs)}. Nothing was "
                "restored; make the table with the saved spec, capacity and storage_dtypes."
            )


def _reason(err: BaseException) -> str:
    """An OS or TensorFlow error in a few words: TensorFlow's without its op decorations."""
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}: {err.filename}" if err.filename else err.strerror
    text = getattr(err, "message", None) or str(err)
    text = " ".join(re.sub(r"\{\{[^}]*\}\}|\[Op:\w+\]", "", text).split())
    path, sep, what = text.partition("; ")  # TensorFlow's file errors: "PATH; what happened"
    return f"{what}: {path}" if sep and os.sep in path and " " not in path else text


def _unescape(name: str) -> str:
    """Undo TensorFlow's key escaping (``'/'`` as ``'.S'``, ``'.'`` as ``'..'``): ``obs.Simage``
    is leaf ``obs/image``."""
    return re.sub(r"\.(.)", lambda m: "/" if m.group(1) == "S" else m.group(1), name)
