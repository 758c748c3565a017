"""The sequence ledger: the last committed append seq of each actor, checkpointed with the table.

Exactly-once appends rest on it: a batch whose seq is not above its actor's last committed seq
was already written, so it is acknowledged and dropped. The ledger is a `tf.Module` holding one
string variable (the map as JSON), so ``rg.Checkpointer(..., ledger=ledger)`` saves and
restores it together with the table, all or nothing. Only the committing thread advances it.
"""

from __future__ import annotations

import json
import threading

import tensorflow as tf


class SequenceLedger(tf.Module):
    """``actor_id -> last committed seq`` (0 for an actor never seen; seqs start at 1)."""

    def __init__(self, name: str = "sequence_ledger") -> None:
        super().__init__(name=name)
        with tf.device("/CPU:0"):
            self.state = tf.Variable(b"{}", dtype=tf.string, trainable=False, name="state")
        self._lock = threading.Lock()
        self._written = b"{}"
        self._seqs: dict[str, int] = {}

    def _sync_from_variable(self) -> None:
        value = self.state.numpy()
        if value != self._written:  # restored from a checkpoint since we last wrote
            self._seqs = {str(k): int(v) for k, v in json.loads(value.decode()).items()}
            self._written = value

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
        """A copy of the whole map."""
        with self._lock:
            self._sync_from_variable()
            return {str(k): int(v) for k, v in self._seqs.items()}

    def advance(self, actor_id: str, seq: int) -> None:
        """Record ``seq`` as committed for ``actor_id`` (in memory; `write` persists it)."""
        with self._lock:
            if seq > self._seqs.get(actor_id, 0):
                self._seqs[actor_id] = int(seq)

    def write(self) -> None:
        """Copy the map into the checkpointed variable (call after a group of commits)."""
        with self._lock:
            value = json.dumps(dict(self._seqs), sort_keys=True).encode()
            if value != self._written:
                self.state.assign(value)
                self._written = value
