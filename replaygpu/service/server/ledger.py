"""The sequence ledger: the last committed append seq of each actor, checkpointed with the table.
Exactly-once appends rest on it. A `tf.Module` with one string variable (the map as JSON), so
``rg.Checkpointer(..., ledger=ledger)`` restores it with the table, all or nothing. Only the
committing thread advances it.
Past ``max_actors`` the least recently committed actor is forgotten (logged): a batch it
resends from before is inserted again (a new client under that id restarts at seq 1, which is
safe). Keep ``max_actors`` above the actor ids in use; the map is rewritten once per commit
round, so its size is the per-commit cost.

In durable mode it also holds `journal_segment`, so a restarted server can tell whether its
journal reaches back to the restored checkpoint (`journal.Journal.resume_after`); saved as
``{"actors": {...}, "journal_segment": N}`` then, else as the bare map."""

from __future__ import annotations

import collections
import json
import logging
import threading

import tensorflow as tf

from replaygpu.errors import check_int

logger = logging.getLogger(__name__)


class _ActorSeqs(collections.OrderedDict[str, int]):
    """``actor -> seq``, least recently committed first; a subclass, which tf.Module does not
    wrap for checkpoint tracking."""


class SequenceLedger(tf.Module):
    """``actor_id -> last committed seq`` (0 for an actor never seen; seqs start at 1), for at
    most ``max_actors`` actors (see the module docstring)."""

    def __init__(self, name: str = "sequence_ledger", max_actors: int = 10_000) -> None:
        super().__init__(name=name)
        self.max_actors = check_int("SequenceLedger.max_actors", max_actors, 1)
        with tf.device("/CPU:0"):
            self.state = tf.Variable(b"{}", dtype=tf.string, trainable=False, name="state")
        self._lock = threading.Lock()
        self._written = b"{}"
        self._seqs = _ActorSeqs()
        self._segment = 0

    def _sync_from_variable(self) -> None:
        value = self.state.numpy()
        if value != self._written:  # restored from a checkpoint since we last wrote
            saved = json.loads(value.decode())  # in commit order, oldest first
            self._segment = 0
            if isinstance(saved.get("actors"), dict):  # seqs are ints: this is no actor
                self._segment = int(saved.get("journal_segment", 0))
                saved = saved["actors"]
            self._seqs = _ActorSeqs((str(k), int(v)) for k, v in saved.items())
            self._evict()
            self._written = value

    def _evict(self) -> None:
        while len(self._seqs) > self.max_actors:
            actor, seq = self._seqs.popitem(last=False)
            logger.warning(
                "sequence ledger: forgot actor '%s' (last seq %d), the one idle longest, to stay "
                "within max_actors=%d; a batch it resends from before is no longer recognised "
                "as a duplicate",
                actor,
                seq,
                self.max_actors,
            )

    def last(self, actor_id: str, sync: bool = True) -> int:
        """``sync=False`` misses a restore since the last `sync` (the committer syncs once per
        round)."""
        with self._lock:
            if sync:
                self._sync_from_variable()
            return self._seqs.get(actor_id, 0)

    def sync(self) -> None:
        with self._lock:
            self._sync_from_variable()

    def snapshot(self) -> dict[str, int]:
        """A copy, least recently committed actor first."""
        with self._lock:
            self._sync_from_variable()
            return {str(k): int(v) for k, v in self._seqs.items()}

    def actors(self) -> int:
        with self._lock:
            self._sync_from_variable()
            return len(self._seqs)

    def advance(self, actor_id: str, seq: int) -> None:
        """In memory; `write` persists it."""
        with self._lock:
            if seq > self._seqs.get(actor_id, 0):
                self._seqs[actor_id] = int(seq)
                self._seqs.move_to_end(actor_id)
                self._evict()

    @property
    def journal_segment(self) -> int:
        """The journal segment the last checkpoint starts after (0: none noted)."""
        with self._lock:
            self._sync_from_variable()
            return self._segment

    def mark_journal(self, segment: int) -> None:
        """``segment`` from ``Journal.rotate``, for the checkpoint about to be saved."""
        with self._lock:
            self._sync_from_variable()
            self._segment = int(segment)
        self.write()

    def write(self) -> None:
        """Into the checkpointed variable, after a group of commits."""
        with self._lock:
            state = {"actors": self._seqs, "journal_segment": self._segment}
            value = json.dumps(state if self._segment else self._seqs).encode()
            if value != self._written:
                self.state.assign(value)
                self._written = value
