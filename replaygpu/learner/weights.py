"""Published weights: versioned host snapshots that the service hands to actors.

Publishing copies the source's variables to numpy on the learner thread and bumps the version;
gRPC threads read the latest snapshot without touching TensorFlow. A checkpointed counter
(``Learner.weights_version``) lets a restarted learner continue its numbering. No TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from replaygpu.errors import ConfigError


@dataclass(frozen=True)
class WeightSnapshot:
    """One published set of weights: ``version`` (1, 2, ...), ``names`` (the keys of a
    mapping, else None) and ``arrays`` (host copies, in publication order)."""

    version: int
    names: tuple[str, ...] | None
    arrays: tuple[np.ndarray, ...]


def read_source(source: Any) -> tuple[tuple[str, ...] | None, list[Any]]:
    """``(names or None, values)`` of a publication source (see `WeightStore.publish`), read
    now: its variables (or arrays) themselves, not copies."""
    if callable(source) and not hasattr(source, "weights") and not hasattr(source, "variables"):
        source = source()
    if isinstance(source, Mapping):
        return tuple(str(k) for k in source), list(source.values())
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        return None, list(source)
    for attribute in ("weights", "variables"):  # Keras model, then tf.Module
        found = getattr(source, attribute, None)
        if found is not None and not callable(found):
            return None, list(found)
    raise ConfigError(
        f"publish_weights: got {type(source).__name__}, expected a Keras model, a tf.Module, "
        "a dict or list of variables or arrays, or a callable returning one"
    )


class VersionCounter(Protocol):
    """Where the version is kept across restarts (e.g. an int64 ``tf.Variable``)."""

    def numpy(self) -> Any: ...

    def assign(self, value: int) -> Any: ...


class WeightStore:
    """Holds the latest `WeightSnapshot`; thread-safe. ``counter`` keeps the version (checkpoint
    it to continue numbering after a restart); None: in memory only."""

    def __init__(self, counter: VersionCounter | None = None) -> None:
        self._lock = threading.Lock()
        self._latest: WeightSnapshot | None = None
        self._counter = counter
        self._version = 0
        self.sync()

    @property
    def version(self) -> int:
        """The latest version (0, or the restored counter's, before a publication)."""
        return self._version

    def sync(self) -> None:
        """Pick up a restored counter (learner side, not gRPC threads)."""
        if self._counter is not None:
            self._version = int(self._counter.numpy())

    def publish(self, source: Any) -> int:
        """Snapshot ``source``'s variables now as the latest version; the new version.

        ``source``: a Keras model (``weights``), a `tf.Module` (``variables``), a mapping ``{name:
        variable or array}``, a sequence of them, or a callable returning one; `ConfigError` for
        anything else, or when it holds no variables. Pass the model itself: a Keras model has no
        variables before its first call."""
        names, values = read_source(source)
        if not values:
            raise ConfigError(
                f"publish_weights: {type(source).__name__} holds no variables, so actors "
                "would get nothing; a Keras model has none before it is first called (call it "
                "once, or model.build(input_shape)), then publish the model itself"
            )
        arrays = tuple(
            np.array(v.numpy() if callable(getattr(v, "numpy", None)) else v, copy=True, order="C")
            for v in values
        )
        with self._lock:
            self.sync()
            version = self._version + 1
            if self._counter is not None:
                self._counter.assign(version)
            self._latest = WeightSnapshot(version, names, arrays)
            self._version = version
        return version

    def latest(self, newer_than: int = 0) -> WeightSnapshot | None:
        """The latest snapshot, or None if none or the caller holds it (``newer_than``). A caller
        ahead of this store holds an earlier run's version (restart from an older checkpoint)
        and gets the latest, lower-numbered, snapshot."""
        latest = self._latest
        if latest is None or latest.version <= newer_than <= self._version:
            return None
        return latest
