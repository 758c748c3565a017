"""The replay table: one `tf.Variable` per spec field, held on the learner's device.

Rows are written in a ring: the write cursor advances by the number of appended transitions and
wraps at ``capacity``. Filled rows are always ``[0, size)``, so samplers draw from that range.
Writes are one `scatter_update` per field with 1-D int64 indices, never a slice assignment
(which would copy the whole variable), so they stay cheap on GPU and CPU alike. Bool fields are
stored as uint8 0/1 (`memory.BOOL_STORAGE`): a GPU has no bool scatter for int64 indices.

A float field may be stored narrower than its spec dtype (``storage_dtypes``, float16 or
bfloat16): appends cast on write inside the append graph and `ReplayTable.read` casts back, so
everything outside the table (the spec, the wire protocol, samplers' batches) keeps the spec
dtype. Before allocating, a table checks its bytes against its device's free memory
(`replaygpu.memory`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from replaygpu.device import resolve_device
from replaygpu.errors import check_int
from replaygpu.memory import check_table_fits, describe, resolve_storage_dtypes, row_bytes
from replaygpu.specs import NestedSpec
from replaygpu.table import TableBase

logger = logging.getLogger(__name__)


class ReplayTable(TableBase, tf.Module):
    """A fixed-capacity ring of transitions in device memory.

    Args:
        spec: ``{field: tf.TensorSpec}`` of one transition (see `specs_from_env`), or any nest
            of `tf.TensorSpec` (dicts, tuples, namedtuples, nested): the table then stores one
            variable per leaf, keyed by leaf path (``obs/image``) in ``spec``, keeps the nest in
            ``structure``, accepts batches in it and its samplers return batches in it.
        capacity: number of transitions kept; the oldest are overwritten first.
        device: where the variables live; None picks the first GPU, else the CPU.
        name: the table's name, as clients address it over gRPC (a Python identifier).
        storage_dtypes: ``{field: tf.float16 or tf.bfloat16}``: float fields to store in half
            the bytes. The spec, appends, the wire protocol and every sampled batch keep the
            spec dtype; values are rounded on write. Precision lost: float16 keeps about 3
            significant decimal digits (11-bit significand) and its largest value is 65504:
            larger magnitudes are stored as +-inf; below 6.1e-5 precision thins out
            (subnormals) and below 3e-8 values become 0.
            bfloat16 keeps float32's range (no overflow) but only about 2-3 significant digits
            (8-bit significand). Fine for observations of moderate scale (CartPole, MuJoCo
            states, normalised features); keep rewards, returns and anything summed or
            compared exactly in float32.
        check_memory: check the table's bytes against its device's free memory before
            allocating (see `replaygpu.memory`); False skips the check.

    Fields are leaf paths: ``spec``, ``storage``, ``storage_dtypes`` and the wire are keyed by
    them (a flat dict spec's keys are its paths). The storage of field ``f`` is a variable of
    shape ``[capacity] + spec[f].shape`` and of dtype ``table.storage_dtypes[f]``: the spec
    dtype, a narrowed float, or uint8 for a bool (TensorFlow's GPU scatter of bools takes int32
    indices only). Read fields through `read` or `gather`, which cast back to the spec dtype.

    Raises:
        ConfigError: for a bad capacity, device or storage dtype.
        OutOfDeviceMemoryError: (a ConfigError) when the table would take more than 95% of its
            device's free memory; it names the capacity that would fit. Nothing is allocated.
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

    # The table protocol (`replaygpu.table.Table`): a plain table is a table of one shard, its
    # own, with no strategy and no shard_by; its rows stay in append order.
    @property
    def shards(self) -> list[ReplayTable]:
        return [self]

    @property
    def num_shards(self) -> int:
        return 1

    @property
    def strategy(self) -> None:
        return None

    @property
    def shard_by(self) -> None:
        return None

    @property
    def stream_contiguous(self) -> bool:
        return True

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
        """Rows at ``indices`` ([B] int64) as flat ``{field: [B] + shape}`` in the spec dtypes
        (samplers pack them into the structure); usable inside graphs."""
        return {k: self.read(k, indices) for k in self.storage}

    def read(self, field: str, indices: tf.Tensor) -> tf.Tensor:
        """Field ``field`` at rows ``indices`` (int64 of any shape ``[...]``) as
        ``[...] + shape`` in the spec dtype; usable inside graphs.

        Read any field that may be stored narrower through this (or `gather`) rather than
        ``storage[field]``, so it comes back in its spec dtype; the samplers do.
        """
        values = tf.gather(self.storage[field], indices)
        dtype = self.spec[field].dtype
        return values if values.dtype == dtype else tf.cast(values, dtype)
