"""The replay table: one `tf.Variable` per spec field, held on the learner's device.

Rows are written in a ring: the write cursor advances by the number of appended transitions and
wraps at ``capacity``. Filled rows are always ``[0, size)``, so samplers draw from that range.
Writes are one `scatter_update` per field with 1-D int64 indices, never a slice assignment
(which would copy the whole variable), so they stay cheap on GPU and CPU alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.device import resolve_device
from replaygpu.errors import ConfigError
from replaygpu.specs import Spec, batch_signature, normalize_spec, validate_batch

logger = logging.getLogger(__name__)


class ReplayTable(tf.Module):
    """A fixed-capacity ring of transitions in device memory.

    Args:
        spec: ``{field: tf.TensorSpec}`` of one transition (see `specs_from_env`).
        capacity: number of transitions kept; the oldest are overwritten first.
        device: where the variables live; None picks the first GPU, else the CPU.
        name: the table's name, as clients address it over gRPC (a Python identifier).

    The storage of field ``f`` is a variable of shape ``[capacity] + spec[f].shape``.
    """

    def __init__(
        self,
        spec: Mapping[str, tf.TensorSpec],
        capacity: int,
        device: str | None = None,
        name: str = "replay",
    ) -> None:
        super().__init__(name=name)
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise ConfigError(f"capacity: got {capacity!r}, expected an integer >= 1")
        self.spec: Spec = normalize_spec(spec)
        self.capacity = int(capacity)
        self.device = resolve_device(device)
        with tf.device(self.device):
            self.storage = {
                k: tf.Variable(
                    tf.zeros([self.capacity, *v.shape], v.dtype), trainable=False, name=k
                )
                for k, v in self.spec.items()
            }
            self.cursor = tf.Variable(0, dtype=tf.int64, trainable=False, name="cursor")
            self.size_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="size")
            self.inserted_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="inserted")
        self._append_fn = tf.function(
            self._append_graph, input_signature=[batch_signature(self.spec)]
        )
        #: address of the server that writes appends into this table, or None (set by serve)
        self.served_at: str | None = None
        logger.info(
            "table %s: capacity %d on %s, %.1f MiB",
            name,
            self.capacity,
            self.device,
            self.nbytes / 2**20,
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the field variables."""
        return sum(
            self.capacity * max(1, v.shape.num_elements()) * v.dtype.size
            for v in self.spec.values()
        )

    @property
    def size(self) -> int:
        """Number of filled rows (at most ``capacity``)."""
        return int(self.size_var.numpy())

    @property
    def total_inserted(self) -> int:
        """Transitions appended since the table was made (or restored), overwritten ones too."""
        return int(self.inserted_var.numpy())

    def __len__(self) -> int:
        return self.size

    def append(self, batch: Mapping[str, Any]) -> int:
        """Write ``n >= 1`` transitions; when ``n > capacity`` only the newest ``capacity`` stay.

        Args:
            batch: ``{field: [n] + spec[field].shape}`` numpy arrays, tensors or lists.

        Returns:
            n, the number of transitions appended.

        Raises:
            BatchError: when the batch does not match the spec; the table is left unchanged.
        """
        checked = validate_batch(self.spec, batch)
        n = int(np.shape(next(iter(checked.values())))[0])
        self._append_fn(checked)
        return n

    def _append_graph(self, batch: dict[str, tf.Tensor]) -> None:
        first = next(iter(batch.values()))
        n = tf.shape(first, out_type=tf.int64)[0]
        capacity = tf.constant(self.capacity, tf.int64)
        skip = tf.maximum(n - capacity, 0)  # rows that would be overwritten within this batch
        kept = n - skip
        indices = (self.cursor + skip + tf.range(kept, dtype=tf.int64)) % capacity
        for name, var in self.storage.items():
            var.scatter_update(tf.IndexedSlices(batch[name][skip:], indices))
        self.cursor.assign((self.cursor + n) % capacity)
        self.size_var.assign(tf.minimum(self.size_var + n, capacity))
        self.inserted_var.assign_add(n)

    def gather(self, indices: tf.Tensor) -> dict[str, tf.Tensor]:
        """Rows at ``indices`` ([B] int64) as ``{field: [B] + shape}``; usable inside graphs."""
        return {k: tf.gather(v, indices) for k, v in self.storage.items()}
