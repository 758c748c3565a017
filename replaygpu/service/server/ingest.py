"""Committing staged appends to the table, exactly once per (actor, seq).

A served `Learner`'s table is written by its training loop (`loop`), calling `commit_pending`
between train calls, so sampling never sees a half-written table (n-step and frame-stack
validity depend on the cursor and size); a bare `ReplayTable` has a committer thread (`start`).
Every commit holds `lock`, so checkpoints taken under it see table and ledger agree.

A seq not above its actor's last committed one is acknowledged and dropped. A batch the table
refuses (`BatchError`) is answered INVALID_ARGUMENT, its actor's later seqs go on; any other
failed write is answered UNAVAILABLE and that actor's later seqs wait for its resend, so its
batches land in order. Acks carry the counters actors follow the samples-per-insert rule by."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import BatchError, StorageFullError
from replaygpu.service.server.journal import Journal
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.service.server.staging import BufferPool, StagedBatch, StagingQueue
from replaygpu.service.wire.status import (
    InvalidBatchError,
    ServiceUnavailableError,
    commit_failure,
)
from replaygpu.table import ReplayTable

logger = logging.getLogger(__name__)

#: staged batches are joined into one table write up to this many bytes
GROUP_BYTES = 64 * 2**20

try:  # wraps a 64-byte aligned numpy array without copying it; tf.constant always copies
    from tensorflow.python.eager import context as _tf_context
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - a TensorFlow without these internals
    _EagerTensor = None


def as_tensors(columns: dict[str, np.ndarray]) -> dict[str, Any]:
    """Eager tensors sharing the aligned arrays' memory (`staging.BufferPool.copy`): the table
    write is the only copy. Else (other TensorFlow internals, not eager) the arrays, copied twice.
    """
    if _EagerTensor is None or not tf.executing_eagerly():
        return columns
    ctx = _tf_context.context()
    ctx.ensure_initialized()
    device = ctx.device_name
    return {
        name: _EagerTensor(array, device, tf.as_dtype(array.dtype).as_datatype_enum)
        for name, array in columns.items()
    }


class Ingest:
    """Commits staged batches into ``table`` and advances ``ledger``.

    Args:
        buffers: the pool the staged arrays came from; they go back to it once committed.
        background: run a committer thread (`start`): for a bare table.
        sampled: the learner's sampled-transitions count, for the acks.
        journal: durable mode: batches are journalled and fsynced before the table write.
    """

    def __init__(
        self,
        table: ReplayTable,
        ledger: SequenceLedger,
        queue: StagingQueue,
        buffers: BufferPool,
        background: bool,
        sampled: Callable[[], int] = lambda: 0,
        journal: Journal | None = None,
    ) -> None:
        self.table = table
        self.buffers = buffers
        self.journal = journal
        self.ledger = ledger
        self.queue = queue
        self.background = background
        #: held by every commit; hold it (`exclusive`, `training_turn`) to keep commits out
        self.lock = threading.RLock()
        self._turns = threading.Condition()
        self._waiting = 0  # threads in `exclusive` waiting for the lock
        self._sampled = sampled
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: batches of the round being committed that failed, answered after its acks
        self._failures: list[tuple[StagedBatch, BaseException]] = []
        # actor -> seq whose commit failed; later seqs of that actor wait for its resend
        self._blocked: dict[str, int] = {}
        #: the run's budget of table rows (`ReplayServer.finish_at`); None: no budget
        self.row_limit: int | None = None
        #: `ReplayServer.finish_run` or ``row_limit`` reached: batches are acked, not inserted
        self.run_finished = False
        #: transitions of the batch that reached ``row_limit`` (the run's overshoot is less)
        self.finishing_rows = 0

    def start(self) -> None:
        """Start the background committer, if asked for; `close` stops it."""
        if self.background and self._thread is None:
            self._thread = threading.Thread(
                target=self._commit_loop, name="replaygpu-committer", daemon=True
            )
            self._thread.start()

    def commit_pending(self) -> int:
        """Returns the transitions inserted."""
        with self.lock:
            return self._commit(self.queue.take_all())

    def replay(self, items: list[StagedBatch]) -> int:
        """Commit batches read back from the journal; returns the transitions inserted."""
        with self.lock:
            return self._commit(items, journaled=False)

    def wait_for_data(self, timeout: float) -> bool:
        """As `ReplayServer.wait_for_data`; once closed: sleep, False."""
        if self.queue.closed:
            time.sleep(timeout)
            return False
        return self.queue.wait_nonempty(timeout)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the commit lock, ahead of the training loop's next turn (`training_turn`)."""
        with self._turns:
            self._waiting += 1
        try:
            self.lock.acquire()
        finally:
            with self._turns:
                self._waiting -= 1
                self._turns.notify_all()
        try:
            yield
        finally:
            self.lock.release()

    @contextlib.contextmanager
    def training_turn(self) -> Iterator[None]:
        """The commit lock, after any thread in `exclusive` (Python locks are not fair: a loop
        re-taking it at once would starve a checkpoint)."""
        with self._turns:
            self._turns.wait_for(lambda: not self._waiting, timeout=5.0)
        with self.lock:
            yield

    def counters(self) -> dict[str, int]:
        """The ack's table and learner fields (sampled 0 when unreadable: an ack never fails)."""
        try:
            sampled = int(self._sampled())
        except Exception:
            logger.exception("reading the learner's sampled count for the acks failed")
            sampled = 0
        table = self.table
        return {
            "table_size": table.size,
            "table_inserted": table.total_inserted,
            "sampled": sampled,
        }

    # -- committing ----------------------------------------------------------------------------

    def _commit(self, items: list[StagedBatch], journaled: bool = True) -> int:
        """Failures are answered after the round's acks: a stream ending on one sent them all."""
        self._failures = []
        try:
            return self._commit_round(items, journaled)
        except BaseException as err:  # a bug: answer everything still waiting, then raise
            answered = {id(item) for item, _ in self._failures}
            message = f"commit failed ({type(err).__name__}); resend"
            for item in items:
                if id(item) not in answered:
                    self._fail(item, ServiceUnavailableError(message, seq=item.seq))
            raise
        finally:
            failures, self._failures = self._failures, []
            for item, error in failures:
                item.fail(error)

    def _fail(self, item: StagedBatch, error: BaseException) -> None:
        self._failures.append((item, error))

    def _commit_round(self, items: list[StagedBatch], journaled: bool) -> int:
        """Journal and fsync the new batches, write them grouped (one scatter per field up to
        ``GROUP_BYTES``), write the ledger once, ack each. ``journaled=False``: a replay."""
        if not items:
            return 0
        try:
            self.ledger.sync()
        except Exception as err:
            self._fail_unavailable(items, "ledger read", err)
            self._release(items)
            return 0
        inserted = 0
        done: list[tuple[StagedBatch, bool]] = []
        dropped: list[StagedBatch] = []  # past the end of the run: acked, not inserted
        left = self._rows_left()
        later: list[StagedBatch] = []  # repeats of a seq staged earlier in this round
        fresh: list[StagedBatch] = []  # to be written, in order
        planned: dict[str, int] = {}  # actor -> highest seq in ``fresh``
        for item in items:
            actor = item.actor_id
            if item.seq <= self.ledger.last(actor, sync=False):
                done.append((item, True))
                continue
            if item.seq <= planned.get(actor, 0):
                later.append(item)
                continue
            blocked = self._blocked.get(actor)
            if blocked is not None and item.seq > blocked and planned.get(actor) != blocked:
                self._fail(item, self._waits_for(item, blocked))
                continue
            if left is not None and left <= 0:
                dropped.append(item)
                continue
            fresh.append(item)
            planned[actor] = item.seq
            left = None if left is None else left - item.transitions
        if fresh and journaled and self.journal is not None:
            try:  # on disk before it is in the table: a crash after the ack loses nothing
                self.journal.append([item.raw or b"" for item in fresh])
                self.journal.sync()
            except Exception as err:
                self._fail_unavailable(fresh, "journal write", err)
                fresh = []
        run: list[StagedBatch] = []
        run_bytes = 0
        for item in fresh:
            if run and run_bytes + item.nbytes > GROUP_BYTES:
                inserted += self._commit_run(run, done)
                run, run_bytes = [], 0
            run.append(item)
            run_bytes += item.nbytes
        inserted += self._commit_run(run, done)
        for item in later:  # acked as duplicates once the first copy is committed
            if item.seq <= self.ledger.last(item.actor_id, sync=False):
                done.append((item, True))
                continue
            message = (
                f"seq {item.seq} of actor '{item.actor_id}' was staged twice and the first copy "
                "failed; resend it"
            )
            self._fail(item, ServiceUnavailableError(message, seq=item.seq))
        if done:
            try:
                self.ledger.write()
            except Exception as err:
                # the in-memory ledger knows the rows: resends are acked as duplicates
                self._fail_unavailable([item for item, _ in done], "ledger write", err)
                done = []
        if (
            not self.run_finished
            and self.row_limit is not None
            and self.table.total_inserted >= self.row_limit
        ):
            self.run_finished = True  # before the acks: the last batch's says so
            self.finishing_rows = next(
                (item.transitions for item, dup in reversed(done) if not dup), 0
            )
        if done or dropped:
            counters = self.counters()
            acks = [(item, dup, 0 if dup else item.transitions) for item, dup in done]
            for item, duplicate, transitions in acks + [(item, False, 0) for item in dropped]:
                item.done(
                    {
                        "seq": item.seq,
                        "committed_seq": self.ledger.last(item.actor_id, sync=False),
                        "transitions": transitions,
                        "duplicate": duplicate,
                        **counters,
                    }
                )
        self._release(items)
        return inserted

    def _rows_left(self) -> int | None:
        """0 once the run is finished, None without a budget."""
        if self.run_finished:
            return 0
        return None if self.row_limit is None else self.row_limit - self.table.total_inserted

    def _commit_run(self, run: list[StagedBatch], done: list[tuple[StagedBatch, bool]]) -> int:
        """One table write of distinct (actor, seq); on failure batch by batch, so a bad batch
        only fails itself."""
        if len(run) > 1:
            joined = self._concatenate(run)
            try:
                self.table.append(as_tensors(joined))
            except Exception:
                logger.debug("grouped commit failed; committing batch by batch", exc_info=True)
            else:
                for item in run:
                    self._blocked.pop(item.actor_id, None)
                    self.ledger.advance(item.actor_id, item.seq)
                    done.append((item, False))
                return sum(item.transitions for item in run)
            finally:
                self.buffers.release(joined)
        return sum(self._commit_one(item, done) for item in run)

    def _concatenate(self, run: list[StagedBatch]) -> dict[str, np.ndarray]:
        out = {}
        for name, first in run[0].columns.items():
            parts = [item.columns[name] for item in run]
            shape = (sum(len(p) for p in parts), *first.shape[1:])
            out[name] = np.concatenate(parts, out=self.buffers.empty(shape, first.dtype))
        return out

    def _commit_one(self, item: StagedBatch, done: list[tuple[StagedBatch, bool]]) -> int:
        blocked = self._blocked.get(item.actor_id)
        if blocked is not None and item.seq > blocked:
            self._fail(item, self._waits_for(item, blocked))
            return 0
        try:
            self.table.append(as_tensors(item.columns))
        except BatchError as err:  # the batch itself is refused: the client drops it
            logger.warning("seq %d from %s refused: %s", item.seq, item.actor_id, err)
            self._blocked.pop(item.actor_id, None)
            message = f"table '{self.table.name}', seq {item.seq}: {err}"
            self._fail(item, InvalidBatchError(message, item.seq))
            return 0
        except Exception as err:  # e.g. a failed device write: the client resends it
            logger.exception("commit of seq %d from %s failed", item.seq, item.actor_id)
            self._blocked[item.actor_id] = item.seq
            message = (
                f"commit of seq {item.seq} of actor '{item.actor_id}' failed "
                f"({type(err).__name__}: {err}); resend it"
            )
            self._fail(item, ServiceUnavailableError(message, seq=item.seq))
            return 0
        self._blocked.pop(item.actor_id, None)
        self.ledger.advance(item.actor_id, item.seq)
        done.append((item, False))
        return item.transitions

    @staticmethod
    def _waits_for(item: StagedBatch, blocked: int) -> ServiceUnavailableError:
        return ServiceUnavailableError(
            f"seq {item.seq} of actor '{item.actor_id}' waits for seq {blocked}, whose commit "
            "failed; resend from there",
            seq=item.seq,
        )

    def _fail_unavailable(self, items: list[StagedBatch], what: str, err: Exception) -> None:
        """Retryable answers: RESOURCE_EXHAUSTED for a full disk (the journal logs it once),
        UNAVAILABLE otherwise."""
        if not isinstance(err, StorageFullError):
            logger.exception("%s failed; %d staged batches answered UNAVAILABLE", what, len(items))
        for item in items:
            message = (
                f"{what} failed while committing seq {item.seq} of actor '{item.actor_id}' "
                f"({type(err).__name__}: {err}); resend it"
            )
            self._fail(item, commit_failure(err, message, item.seq))

    def _release(self, items: list[StagedBatch]) -> None:
        for item in items:
            self.buffers.release(item.columns)
        if items:
            self.queue.notify()

    def _commit_loop(self) -> None:
        while not self._stopping.is_set():
            if self.queue.wait_nonempty(0.1):
                try:
                    self.commit_pending()
                except Exception:  # a bug: keep serving, make it loud
                    logger.exception("background commit failed")

    def close(self, commit_remaining: bool) -> None:
        """Stop the committer; commit (or fail UNAVAILABLE) what is staged; once the run is
        finished it is acked, not inserted: no later server would insert it either."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        leftover = self.queue.close()
        if commit_remaining or self.run_finished:
            with self.lock:
                self._commit(leftover)
        else:
            for item in leftover:
                item.fail(ServiceUnavailableError("server stopped; resend", seq=item.seq))
            self._release(leftover)
