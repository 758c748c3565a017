"""The sequence ledger: the last committed append seq of each actor, checkpointed with the table.

Exactly-once appends rest on it: a batch whose seq is not above its actor's last committed seq
was already written, so it is acknowledged and dropped. The ledger is a `tf.Module` holding one
string variable (the map as JSON), so ``rg.Checkpointer(..., ledger=ledger)`` saves and
restores it together with the table, all or nothing. Only the committing thread advances it.

It remembers at most ``max_actors`` actors: past that, the actor that committed least recently
is forgotten (logged). Exactly-once then no longer holds for that actor: should it come back
and resend a batch that was already committed, the batch is inserted again (a new client under
that id starts again at seq 1, which is safe). Keep ``max_actors`` above the number of actor ids
in use; the map is rewritten once per commit round, so its size is the per-commit cost.

In durable mode it also holds the journal segment the checkpoint starts after
(`journal_segment`), so that a restarted server can tell whether its journal still reaches
back to the checkpoint it restored (`replaygpu.service.learner.journal.Journal.resume_after`).
Saved as ``{"actors": {...}, "journal_segment": N}`` then; without one, as the bare map.
"""

from __future__ import annotations

import collections
import json
import logging
import threading

import tensorflow as tf

from replaygpu.errors import ConfigError

logger = logging.getLogger(__name__)


class _ActorSeqs(collections.OrderedDict[str, int]):
    """``actor -> seq``, least recently committed first. A subclass, so that tf.Module keeps
    it as it is (it would wrap a plain dict for checkpoint tracking)."""


class SequenceLedger(tf.Module):
    """``actor_id -> last committed seq`` (0 for an actor never seen; seqs start at 1).

    Args:
        name: the module name.
        max_actors: actors remembered at most; the one idle longest is forgotten past it (see
            the module docstring for what that means for exactly-once).
    """

    def __init__(self, name: str = "sequence_ledger", max_actors: int = 10_000) -> None:
        super().__init__(name=name)
        if isinstance(max_actors, bool) or not isinstance(max_actors, int) or max_actors < 1:
            raise ConfigError(f"SequenceLedger.max_actors: got {max_actors!r}, expected >= 1")
        self.max_actors = max_actors
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
        """The last committed seq of ``actor_id``.

        ``sync=False`` skips re-reading the variable (a restore since the last `sync` goes
        unseen); the committer syncs once per round and then reads without it.
        """
        with self._lock:
            if sync:
                self._sync_from_variable()
            return self._seqs.get(actor_id, 0)

    def sync(self) -> None:
        """Pick up a checkpoint restore of the variable."""
        with self._lock:
            self._sync_from_variable()

    def snapshot(self) -> dict[str, int]:
        """A copy of the whole map, least recently committed actor first."""
        with self._lock:
            self._sync_from_variable()
            return {str(k): int(v) for k, v in self._seqs.items()}

    def actors(self) -> int:
        """How many actors the ledger holds."""
        with self._lock:
            self._sync_from_variable()
            return len(self._seqs)

    def advance(self, actor_id: str, seq: int) -> None:
        """Record ``seq`` as committed for ``actor_id`` (in memory; `write` persists it)."""
        with self._lock:
            if seq > self._seqs.get(actor_id, 0):
                self._seqs[actor_id] = int(seq)
                self._seqs.move_to_end(actor_id)
                self._evict()

    @property
    def journal_segment(self) -> int:
        """The journal segment the last checkpoint saved or restored starts after: the journal
        from it on holds what came after that checkpoint (0: none noted)."""
        with self._lock:
            self._sync_from_variable()
            return self._segment

    def mark_journal(self, segment: int) -> None:
        """Note ``segment`` (from ``Journal.rotate``) for the checkpoint about to be saved."""
        with self._lock:
            self._sync_from_variable()
            self._segment = int(segment)
        self.write()

    def write(self) -> None:
        """Copy the map into the checkpointed variable (call after a group of commits)."""
        with self._lock:
            state = {"actors": self._seqs, "journal_segment": self._segment}
            value = json.dumps(state if self._segment else self._seqs).encode()
            if value != self._written:
                self.state.assign(value)
                self._written = value
