"""The replay table: one `tf.Variable` per spec field, held on the learner's device.

A ring: the cursor advances by each append and wraps at ``capacity``; filled rows are always
``[0, size)``. Writes are one `scatter_update` per field with 1-D int64 indices, never a slice
assignment (which copies the whole variable), cheap on GPU and CPU. Bools are stored as
`memory.BOOL_STORAGE`; a float field may be stored as float16/bfloat16 (``storage_dtypes``):
cast on append, cast back by `ReplayTable.read`, so all outside the table keeps the spec dtype.
A table checks its bytes against the device's free memory before allocating (`replaygpu.memory`).
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
from replaygpu.table import Table

logger = logging.getLogger(__name__)


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
