"""The Info and Weights replies' messages, built on the servicer's Info thread, never on the
event loop (they read TensorFlow variables, and weights are megabytes)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replaygpu.fields import HostSpec
from replaygpu.learner.weights import WeightSnapshot
from replaygpu.service.wire import codec
from replaygpu.v1 import replay_pb2

if TYPE_CHECKING:
    from replaygpu.learner.learner import Learner
    from replaygpu.table import Table


def table_info(table: Table, spec: HostSpec, learner: Learner | None) -> Any:
    """With the learner's sampled count and rate limiter when there is one."""
    info = replay_pb2.TableInfo(
        name=table.name,
        capacity=table.capacity,
        size=table.size,
        inserted=table.total_inserted,
        device=", ".join(t.device for t in table.shards),
    )
    for name, (dtype, shape) in spec.items():
        info.spec.add(name=name, dtype=dtype, shape=shape)
    if learner is None:
        return info
    info.sampled = int(learner.steps.numpy()) * learner.batch_size
    limiter = learner.rate_limiter
    if limiter is not None:
        info.rate_limiter.kind = type(limiter).__name__
        info.rate_limiter.samples_per_insert = limiter.samples_per_insert
        info.rate_limiter.min_size_to_sample = limiter.min_size_to_sample
        info.rate_limiter.error_buffer = limiter.error_buffer
        info.rate_limiter.sampled = int(limiter.sampled.numpy())
    return info


def weights_message(snapshot: WeightSnapshot) -> Any:
    message = replay_pb2.Weights(version=snapshot.version, named=snapshot.names is not None)
    names = snapshot.names or tuple(str(i) for i in range(len(snapshot.arrays)))
    for name, array in zip(names, snapshot.arrays, strict=True):
        entry = message.tensors.add()
        entry.name = name
        codec.encode_tensor(array, entry.tensor)
    return message
