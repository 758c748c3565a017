"""A replay table split into one shard per `tf.distribute` replica, each on its replica's device.

One `ReplayTable` per replica (``MirroredStrategy`` over GPUs, or logical CPUs in tests). An
append is one graph call routing each row to a shard: by default round-robin over the table's
whole history (row ``g`` to shard ``g % replicas``: even fill, whatever the batch sizes); with
``shard_by="field"``, by that integer field (actor or stream id) modulo the replicas, so each
stream's rows stay in one shard in order, as n-step, sequence and frame-stack views need.

No row crosses devices. ``inserted_var`` and ``size_var`` are totals over the shards, so a rate
limiter and the service see one table.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.reductions import reduce_min_int
from replaygpu.specs import NestedSpec, batch_signature
from replaygpu.table import ReplayTable, Table

logger = logging.getLogger(__name__)


class ShardedReplayTable(Table, tf.Module):
    """A fixed-capacity ring of transitions split over the replicas of ``strategy``; `ConfigError`
    when R does not divide the capacity, or ``shard_by`` is not an integer scalar field.

    Args:
        spec: as for `ReplayTable`.
        capacity: transitions in total, a multiple of R; each shard holds ``capacity / R``.
        strategy: one replica per local device.
        shard_by: None for round-robin, or an integer field picking the shard (module doc).
        **table_kwargs: passed to each shard's `ReplayTable` (e.g. ``storage_dtypes``).

    Attributes:
        shards: the per-replica `ReplayTable` s, shard i on replica i's device.
        inserted_var, size_var: int64 totals over the shards (read by rate limiters).
    """

    def __init__(
        self,
        spec: NestedSpec,
        capacity: int,
        strategy: tf.distribute.Strategy,
        shard_by: str | None = None,
        name: str = "replay",
        **table_kwargs: Any,
    ) -> None:
        super().__init__(name=name)
        if not isinstance(strategy, tf.distribute.Strategy):
            raise ConfigError(
                f"strategy: got {type(strategy).__name__}, expected a tf.distribute.Strategy "
                "(e.g. tf.distribute.MirroredStrategy(['/gpu:0', '/gpu:1']))"
            )
        if tf.distribute.has_strategy():
            raise ConfigError(
                "ShardedReplayTable: made inside strategy.scope(), where every variable would be "
                "mirrored on all devices; make the table (and its samplers) outside the scope, "
                "and only the networks and optimizers inside it"
            )
        self._init_spec(spec)
        devices = list(strategy.extended.worker_devices)
        replicas = len(devices)
        if replicas != strategy.num_replicas_in_sync:
            raise ConfigError(
                f"strategy: {strategy.num_replicas_in_sync} replicas in sync over "
                f"{replicas} local devices; ShardedReplayTable needs one replica per local "
                "device (MirroredStrategy or OneDeviceStrategy)"
            )
        if not isinstance(capacity, (int, np.integer)) or capacity < replicas:
            raise ConfigError(
                f"capacity: got {capacity!r}, expected an integer >= {replicas} (the replicas)"
            )
        if capacity % replicas:
            raise ConfigError(
                f"capacity: got {capacity}, expected a multiple of the {replicas} replicas "
                "(each shard holds capacity / replicas rows); try "
                f"{capacity // replicas * replicas}"
            )
        if shard_by is not None:
            leaf = self.spec.get(shard_by)
            if leaf is None or not leaf.dtype.is_integer or leaf.shape.rank != 0:
                raise ConfigError(
                    f"shard_by: got {shard_by!r}, expected the name of an integer scalar field "
                    f"of the spec (fields: {sorted(self.spec)}), e.g. the actor's stream id"
                )
        self.strategy = strategy
        self.shard_by = shard_by
        self.capacity = int(capacity)
        self.num_shards = replicas
        self.shards = [
            ReplayTable(
                self.structure,
                self.capacity // replicas,
                device=dev,
                name=f"{name}_{i}",
                **table_kwargs,
            )
            for i, dev in enumerate(devices)
        ]
        #: the device of replica 0 (the learner's counters live there)
        self.device = self.shards[0].device
        with tf.device("/CPU:0"):  # host-side totals: the rate limiter and Info read them
            self.size_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="size")
            self.inserted_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="inserted")
        self._init_append()
        logger.info(
            "sharded table %s: capacity %d in %d shards (%s), %.1f MiB",
            name,
            self.capacity,
            replicas,
            "rows round-robin" if shard_by is None else f"by {shard_by!r}",
            self.nbytes / 2**20,
        )

    @property
    def nbytes(self) -> int:
        """Bytes held by the field variables of all shards."""
        return sum(shard.nbytes for shard in self.shards)

    @property
    def stream_contiguous(self) -> bool:
        """Whether each stream's rows stay in one shard in order: only with ``shard_by``."""
        return self.shard_by is not None

    @property
    def shard_sizes(self) -> list[int]:
        """Filled rows of each shard."""
        return [shard.size for shard in self.shards]

    def min_shard_size(self) -> tf.Tensor:
        """The smallest shard's size (int64 scalar, usable inside graphs)."""
        return reduce_min_int(tf.stack([s.size_var.read_value() for s in self.shards]))

    def local_index(self) -> int:
        """The calling replica's shard (`ConfigError` outside this strategy's ``run``)."""
        return replica_index(self.strategy)

    def gather(self, indices: tf.Tensor) -> dict[str, tf.Tensor]:
        """Rows ``indices`` of the calling replica's shard (inside ``strategy.run``)."""
        return self.shards[self.local_index()].gather(indices)

    def _append_signature(self) -> Any:
        return [batch_signature(self.spec) for _ in self.shards]

    def _route(self, batch: dict[str, Any]) -> list[dict[str, np.ndarray]]:
        """Each shard's rows, in order, split on the host where the batch already is: each
        part travels to its device alone, and no GPU needs a uint8 partition or gather (it has
        neither)."""
        columns = {k: np.asarray(v) for k, v in batch.items()}
        n = len(next(iter(columns.values())))
        if self.shard_by is None:  # round robin, continuing from the rows appended so far
            shard_ids = (int(self.inserted_var.numpy()) + np.arange(n)) % self.num_shards
        else:
            shard_ids = np.mod(columns[self.shard_by].astype(np.int64), self.num_shards)
        return [{k: v[shard_ids == i] for k, v in columns.items()} for i in range(self.num_shards)]

    def _append_graph(self, parts: list[dict[str, tf.Tensor]]) -> None:
        n = tf.constant(0, tf.int64)
        for shard, part in zip(self.shards, parts, strict=True):
            with tf.device(shard.device):
                shard._append_graph(part)
            n += tf.shape(next(iter(part.values())), out_type=tf.int64)[0]
        self.inserted_var.assign_add(n)
        self.size_var.assign(tf.add_n([s.size_var.read_value() for s in self.shards]))


_STRATEGIES: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def mirrored_strategy(devices: str | list[str]) -> tf.distribute.MirroredStrategy:
    """The process's `MirroredStrategy` over ``devices`` (``"/gpu:0,/gpu:1"`` or a list).

    One per device set: two strategies over the same devices share collective keys and
    TensorFlow mixes up their all-reduces ("Collective instance N expected type ...").

    Extra CPU devices split the CPU into logical devices, possible only before TensorFlow's
    first op; for trying the data-parallel path without GPUs (no faster: shared cores).
    `ConfigError` for an empty list, an unknown device, or a CPU split asked for too late."""
    names = [d.strip() for d in devices.split(",")] if isinstance(devices, str) else list(devices)
    names = [d if d.startswith("/") else f"/{d}" for d in names if d]
    if not names:
        raise ConfigError(f"devices: got {devices!r}, expected e.g. '/gpu:0,/gpu:1'")
    specs = [tf.DeviceSpec.from_string(d) for d in names]
    cpus = [s.device_index or 0 for s in specs if (s.device_type or "").upper() == "CPU"]
    cpu = tf.config.list_physical_devices("CPU")[0]
    split = tf.config.get_logical_device_configuration(cpu)  # does not start the runtime
    if cpus and max(cpus) >= (len(split) if split else 1):
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(max(cpus) + 1)]
            )
        except RuntimeError:
            raise ConfigError(
                f"devices: {names} needs {max(cpus) + 1} logical CPU devices, but TensorFlow "
                "has started and can no longer split the CPU; make the strategy before any "
                "other TensorFlow call"
            ) from None
    have = {
        ((spec := tf.DeviceSpec.from_string(d.name)).device_type, spec.device_index): d.name
        for d in tf.config.list_logical_devices()
    }
    for name, spec in zip(names, specs, strict=True):
        if ((spec.device_type or "").upper(), spec.device_index or 0) not in have:
            raise ConfigError(
                f"devices: {name!r} does not exist here; expected some of {sorted(have.values())}"
            )
    key = tuple(tf.DeviceSpec.from_string(n).to_string() for n in names)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = tf.distribute.MirroredStrategy(names)
    return _STRATEGIES[key]


def replica_index(strategy: tf.distribute.Strategy) -> int:
    """The calling replica's index (a Python int) inside ``strategy.run``; `ConfigError` outside
    ``strategy``'s replica context, or with no static replica id (TPU)."""
    ctx = tf.distribute.get_replica_context()
    if ctx is None or tf.distribute.get_strategy() is not strategy:
        raise ConfigError(
            "a sharded table's shard is chosen by the replica calling: call this inside "
            "strategy.run(...) of the table's strategy (rg.Learner does) or use table.shards[i]"
        )
    index = tf.get_static_value(ctx.replica_id_in_sync_group)
    if index is None:
        raise ConfigError(
            f"{type(strategy).__name__} gives no static replica id; ShardedReplayTable supports "
            "MirroredStrategy and OneDeviceStrategy"
        )
    return int(index)
