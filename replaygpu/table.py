"""Replay tables: `Table`, what the learner, samplers, checkpoints and the server ask of a table,
and `ReplayTable`, one `tf.Variable` per spec field on the learner's device.

`ReplayTable` (one ring, one device) and `ShardedReplayTable` (one per replica, `sharded.py`)
are both a `Table`, so no caller branches on the kind: a plain table has ``shards == [table]``
and no strategy.

A ring: the cursor advances by each append and wraps at ``capacity``; filled rows are always
``[0, size)``. Writes are one `scatter_update` per field with 1-D int64 indices, never a slice
assignment (which copies the whole variable), cheap on GPU and CPU. Bools are stored as
`memory.BOOL_STORAGE`; a float field may be stored as float16/bfloat16 (``storage_dtypes``):
cast on append, cast back by `ReplayTable.read`, so all outside the table keeps the spec dtype.
A table checks its bytes against the device's free memory before allocating (`replaygpu.memory`).
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.device import resolve_device
from replaygpu.errors import check_int
from replaygpu.memory import check_table_fits, describe, resolve_storage_dtypes, row_bytes
from replaygpu.nest import Structure, flatten_batch, pack_batch
from replaygpu.specs import NestedSpec, Spec, batch_signature, normalize_structure, validate_batch
from replaygpu.writer import TableWriter

logger = logging.getLogger(__name__)


class Table:
    """A replay table, plain or sharded: what the learner, samplers, checkpoints and the server
    ask of one, and what both kinds share (nest, counters, checked append).

    Attributes:
        name: the table's name, as clients address it over gRPC.
        spec: the flat spec ``{leaf path: tf.TensorSpec}``.
        capacity: rows kept in total (over all shards).
        device: where the counters a learner reads live (replica 0's device).
        size_var, inserted_var: int64 totals of filled rows and rows ever appended.
        served_at: the address of the server writing into the table, or None.
        shards: the `ReplayTable` of each replica (``[self]`` for a plain table).
        num_shards: ``len(shards)``.
        strategy: the `tf.distribute.Strategy` sampling the shards, or None.
        shard_by: the integer field routing rows to shards, or None.
        stream_contiguous: each stream's rows stay in one shard in append order (plain: always;
            sharded: with ``shard_by``), as stream views (n-step, frames, sequences) need.
        nbytes: bytes held by the field variables.

    A subclass gives these, calls `_init_spec`, makes ``size_var`` and ``inserted_var``, then
    `_init_append` once the state its ``_append_graph`` (one graph: write ``{leaf path: [n,
    ...]}``, advance both counters) writes exists.
    """

    name: str
    spec: Spec
    capacity: int
    device: str
    size_var: tf.Variable
    inserted_var: tf.Variable
    served_at: str | None
    shards: list[Table]
    num_shards: int
    strategy: tf.distribute.Strategy | None
    shard_by: str | None
    stream_contiguous: bool
    nbytes: int

    def local_index(self) -> int:
        """The index of the shard the calling replica samples (0 for a plain table)."""
        raise NotImplementedError

    def min_shard_size(self) -> tf.Tensor:
        """The smallest shard's filled rows (int64 scalar, usable inside graphs)."""
        raise NotImplementedError

    def _init_spec(self, spec: NestedSpec) -> None:
        spec, structure = normalize_structure(spec)
        #: the flat spec ``{leaf path: tf.TensorSpec}``: what storage and the wire hold
        self.spec = spec
        # held outside tf.Module's attribute tracking, which would wrap the user's dicts
        self._structure = Structure(structure)

    def _init_append(self) -> None:
        self._append_fn = tf.function(
            self._append_graph, input_signature=[self._append_signature()]
        )
        self._writers: weakref.WeakSet[TableWriter] = weakref.WeakSet()
        #: address of the server that writes appends into this table, or None (set by serve)
        self.served_at: str | None = None

    def _append_signature(self) -> Any:
        """The input signature of `_append_graph`: one checked flat batch."""
        return batch_signature(self.spec)

    def _route(self, batch: dict[str, Any]) -> Any:
        """What `_append_graph` takes for the checked flat ``batch`` (prepared on the host)."""
        return batch

    def _append_graph(self, batch: Any) -> None:
        raise NotImplementedError

    @property
    def size(self) -> int:
        """Number of filled rows, over all shards (at most ``capacity``)."""
        return int(self.size_var.numpy())

    @property
    def total_inserted(self) -> int:
        """Transitions ever appended (since made or restored), overwritten ones too."""
        return int(self.inserted_var.numpy())

    def __len__(self) -> int:
        return self.size

    def append(self, batch: Any) -> int:
        """Write ``n >= 1`` transitions, return n; if ``n > capacity`` the newest ``capacity`` stay.

        ``batch`` is ``{field: [n] + spec[field].shape}`` arrays, tensors or lists; for a nested
        spec, in its structure or flat by leaf path.

        Raises:
            BatchError: the batch does not match the spec (naming the leaf path); every shard
                is left unchanged.
        """
        checked = validate_batch(self.spec, self.flatten(batch))
        n = int(np.shape(next(iter(checked.values())))[0])
        self._append_call(self._route(checked))
        return n

    @functools.cached_property  # set past tf.Module's attribute tracking
    def _append_call(self) -> Any:
        """The append graph's one concrete function: called directly, an append skips a
        tf.function call's input binding (measured 1.2 ms instead of 1.8 ms for 256 CPU rows)."""
        return self._append_fn.get_concrete_function()

    def writer(self, chunk: int = 1024) -> TableWriter:
        """A `TableWriter` that stages rows one at a time and appends ``chunk`` at a time; its
        staged rows are appended before each `Learner.train` over this table too."""
        writer = TableWriter(self, chunk)
        self._writers.add(writer)
        return writer

    def flush_writers(self) -> None:
        """Append the rows staged in this table's writers (`Learner.train` calls it first)."""
        for writer in list(self._writers):
            writer.flush()

    @property
    def structure(self) -> NestedSpec:
        """The user's nest of `tf.TensorSpec` (``spec`` itself for a flat dict spec)."""
        return self.spec if self._structure.flat else self._structure.value

    def flatten(self, batch: Any) -> Any:
        """A batch in this table's structure (or already flat) as ``{leaf path: value}``."""
        return batch if self._structure.flat else flatten_batch(self.spec, batch)

    def pack(self, batch: Mapping[str, Any]) -> Any:
        """A flat sampled batch in the table's structure (`replaygpu.nest.pack_batch`)."""
        return pack_batch(self.structure, batch)


class ReplayTable(Table, tf.Module):
    """A fixed-capacity ring of transitions in device memory.

    Args:
        spec: any nest of `tf.TensorSpec` (see `replaygpu.specs`); batches in and out keep
            its structure (``structure``).
        capacity: transitions kept; the oldest are overwritten first.
        device: None picks the first GPU, else the CPU.
        name: the table's name, as clients address it over gRPC (a Python identifier).
        storage_dtypes: ``{field: tf.float16 or tf.bfloat16}``: float fields stored in half the
            bytes, rounded on write. float16 keeps about 3 significant digits (11-bit
            significand), overflows to +-inf above 65504, thins out below 6.1e-5 and is 0 below
            3e-8; bfloat16 keeps float32's range but only 2-3 digits (8-bit significand). Fine
            for observations of moderate scale; keep rewards, returns and anything summed or
            compared exactly in float32.
        check_memory: False skips the free-memory check (`replaygpu.memory`).

    ``spec``, ``storage``, ``storage_dtypes`` and the wire are keyed by leaf path; ``storage[f]``
    is ``[capacity] + spec[f].shape`` of ``storage_dtypes[f]``. Read through `read` or `gather`,
    which cast back to the spec dtype.

    Raises:
        ConfigError: a bad capacity, device or storage dtype.
        OutOfDeviceMemoryError: (a ConfigError) the table would take more than 95% of the
            device's free memory; names the capacity that fits. Nothing is allocated.
    """

    def __init__(
        self,
        spec: NestedSpec,
        capacity: int,
        device: str | None = None,
        name: str = "replay",
        *,
        storage_dtypes: Mapping[str, Any] | None = None,
        check_memory: bool = True,
    ) -> None:
        super().__init__(name=name)
        self.capacity = check_int("capacity", capacity, 1)
        self._init_spec(spec)
        self.device = resolve_device(device)
        #: ``{field: dtype}`` as stored on the device (the spec dtype unless narrowed)
        self.storage_dtypes: dict[str, tf.DType] = resolve_storage_dtypes(self.spec, storage_dtypes)
        if check_memory:
            check_table_fits(name, self.spec, self.capacity, self.device, self.storage_dtypes)
        with tf.device(self.device):
            self.storage = {
                k: tf.Variable(
                    tf.zeros([self.capacity, *v.shape], self.storage_dtypes[k]),
                    trainable=False,
                    name=k,
                )
                for k, v in self.spec.items()
            }
            self.cursor = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor")
            self.size_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="size")
            self.inserted_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="inserted")
        self._init_append()
        narrowed = describe(self.spec, self.storage_dtypes)
        logger.info(
            "table %s: capacity %d on %s, %.1f MiB%s",
            name,
            self.capacity,
            self.device,
            self.nbytes / 2**20,
            f" (stored as {narrowed})" if narrowed else "",
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the field variables, as stored (narrowed fields count 2 per element)."""
        return self.capacity * row_bytes(self.spec, self.storage_dtypes)

    # `replaygpu.table.Table`: one shard, its own; no strategy, no shard_by.
    num_shards = 1
    strategy = None
    shard_by = None
    stream_contiguous = True

    @property
    def shards(self) -> list[ReplayTable]:
        return [self]

    def local_index(self) -> int:
        return 0

    def min_shard_size(self) -> tf.Tensor:
        return self.size_var.read_value()

    def _append_graph(self, batch: dict[str, tf.Tensor]) -> None:
        first = next(iter(batch.values()))
        n = tf.shape(first, out_type=tf.int64)[0]
        capacity = tf.constant(self.capacity, tf.int64)
        skip = tf.maximum(n - capacity, 0)  # rows that would be overwritten within this batch
        kept = n - skip
        indices = (self.cursor + skip + tf.range(kept, dtype=tf.int64)) % capacity
        for name, var in self.storage.items():
            rows = batch[name][skip:]
            if var.dtype != rows.dtype:  # a narrowed field: round on write
                rows = tf.cast(rows, var.dtype)
            var.scatter_update(tf.IndexedSlices(rows, indices))
        self.cursor.assign((self.cursor + n) % capacity)
        self.size_var.assign(tf.minimum(self.size_var + n, capacity))
        self.inserted_var.assign_add(n)

    def gather(self, indices: tf.Tensor) -> dict[str, tf.Tensor]:
        """Rows at ``indices`` ([B] int64) as flat ``{field: [B] + shape}`` in spec dtypes."""
        return {k: self.read(k, indices) for k in self.storage}

    def read(self, field: str, indices: tf.Tensor) -> tf.Tensor:
        """``field`` at rows ``indices`` (int64 ``[...]``) as ``[...] + shape`` in the spec
        dtype; use this, not ``storage[field]``, for fields that may be stored narrower."""
        values = tf.gather(self.storage[field], indices)
        dtype = self.spec[field].dtype
        return values if values.dtype == dtype else tf.cast(values, dtype)
