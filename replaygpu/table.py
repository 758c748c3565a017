"""The table protocol: what the learner, samplers, checkpoints and the server ask of a table.

Two classes implement it: `ReplayTable` (one ring on one device) and `ShardedReplayTable` (one
`ReplayTable` per replica of a `tf.distribute.Strategy`). Code that works on "a table" uses
only these members, so it needs no branch on the kind: a plain table is a table of one shard,
``shards == [table]``, with no strategy, sampled by replica 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import tensorflow as tf

from replaygpu.specs import NestedSpec, Spec

if TYPE_CHECKING:
    from replaygpu.storage import ReplayTable


@runtime_checkable
class Table(Protocol):
    """A replay table, plain or sharded.

    Attributes:
        name: the table's name, as clients address it over gRPC.
        spec: the flat spec ``{leaf path: tf.TensorSpec}``.
        capacity: rows kept in total (over all shards).
        device: where the counters a learner reads live (replica 0's device).
        size_var, inserted_var: int64 scalar variables: filled rows and rows ever appended, in
            total over the shards.
        served_at: the address of the server writing into the table, or None.
        shards: the `ReplayTable` of each replica (``[self]`` for a plain table).
        strategy: the `tf.distribute.Strategy` whose replicas sample the shards, or None.
        shard_by: the integer field that routes rows to shards, or None (round-robin, or one
            shard).
        stream_contiguous: whether every stream's rows stay together, in append order, in one
            shard: always for a plain table, only with ``shard_by`` for a sharded one. Views that
            read consecutive rows of one stream (n-step, frame stacks, sequences) need it.
    """

    name: str
    spec: Spec
    capacity: int
    device: str
    size_var: tf.Variable
    inserted_var: tf.Variable
    served_at: str | None

    @property
    def shards(self) -> list[ReplayTable]: ...

    @property
    def num_shards(self) -> int: ...

    @property
    def strategy(self) -> tf.distribute.Strategy | None: ...

    @property
    def shard_by(self) -> str | None: ...

    @property
    def stream_contiguous(self) -> bool: ...

    @property
    def structure(self) -> NestedSpec: ...

    @property
    def size(self) -> int: ...

    @property
    def total_inserted(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def append(self, batch: Any) -> int: ...

    def local_index(self) -> int:
        """The index of the shard the calling replica samples (0 for a plain table)."""
        ...

    def min_shard_size(self) -> tf.Tensor:
        """The smallest shard's filled rows (int64 scalar, usable inside graphs)."""
        ...

    def flatten(self, batch: Any) -> Any: ...

    def pack(self, batch: Mapping[str, Any]) -> Any: ...

    def unpack(self, batch: Any) -> dict[str, Any]: ...
