"""Published weights: versioned host snapshots that the service hands to actors.

`Learner.publish_weights` copies the variables to numpy on the learner thread and bumps the
version; gRPC threads read the latest snapshot without touching TensorFlow. The version counter
can live in a checkpointed variable (``Learner.weights_version``), so a restarted learner
continues numbering where its checkpoint left off instead of starting again at 1. This module
imports no TensorFlow; the counter is any object with ``numpy()`` and ``assign(int)``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class WeightSnapshot:
    """One published set of weights.

    Attributes:
        version: 1 for the first publication, then +1 each time.
        names: the keys when published as a mapping, else None (a list).
        arrays: host copies, in publication order.
    """

    version: int
    names: tuple[str, ...] | None
    arrays: tuple[np.ndarray, ...]

    def value(self) -> dict[str, np.ndarray] | list[np.ndarray]:
        """The weights in the structure they were published in."""
        if self.names is None:
            return list(self.arrays)
        return dict(zip(self.names, self.arrays, strict=True))


def _as_array(value: Any) -> np.ndarray:
    numpy = getattr(value, "numpy", None)
    array = numpy() if callable(numpy) else np.asarray(value)
    return np.array(array, copy=True, order="C")


class VersionCounter(Protocol):
    """Where the version is kept across restarts (e.g. an int64 ``tf.Variable``)."""

    def numpy(self) -> Any:
        """The stored version."""

    def assign(self, value: int) -> Any:
        """Store ``value``."""


class WeightStore:
    """Holds the latest `WeightSnapshot`; thread-safe.

    Args:
        counter: keeps the version (checkpoint it to continue numbering after a restart);
            None keeps it in memory only.
    """

    def __init__(self, counter: VersionCounter | None = None) -> None:
        self._lock = threading.Lock()
        self._latest: WeightSnapshot | None = None
        self._counter = counter
        self._version = 0
        self.sync()

    @property
    def version(self) -> int:
        """The latest version: 0 before the first publication, or the restored counter's value
        until the first publication after a restore."""
        return self._version

    def sync(self) -> None:
        """Pick up a checkpoint restore of the counter (call from the learner side, not from
        gRPC threads)."""
        if self._counter is not None:
            self._version = int(self._counter.numpy())

    def publish(self, variables: Any) -> int:
        """Snapshot ``variables`` and make them the latest version.

        Args:
            variables: a mapping ``{name: variable or array}``, a sequence of them, or an
                object with a ``variables`` (tf.Module) or ``weights`` (Keras) list.

        Returns:
            the new version.

        Raises:
            TypeError: for anything else.
        """
        names: tuple[str, ...] | None = None
        if isinstance(variables, Mapping):
            names = tuple(str(k) for k in variables)
            values = list(variables.values())
        elif isinstance(variables, Sequence) and not isinstance(variables, (str, bytes)):
            values = list(variables)
        else:
            found = getattr(variables, "weights", None)
            if found is None:
                found = getattr(variables, "variables", None)
            if found is None:
                raise TypeError(
                    f"publish_weights: got {type(variables).__name__}, expected a dict or list "
                    "of variables/arrays, a tf.Module or a Keras model"
                )
            values = list(found)
        arrays = tuple(_as_array(v) for v in values)
        with self._lock:
            self.sync()
            version = self._version + 1
            if self._counter is not None:
                self._counter.assign(version)
            self._latest = WeightSnapshot(version, names, arrays)
            self._version = version
        return version

    def latest(self, newer_than: int = 0) -> WeightSnapshot | None:
        """The latest snapshot for a caller holding version ``newer_than``, or None.

        None when nothing was published or the latest version equals ``newer_than``. A caller
        ahead of this store (``newer_than`` above its version) holds a version of an earlier
        run of the learner (a restart from an older checkpoint, or without one): it gets the
        latest snapshot, whose version is then lower than its own.
        """
        latest = self._latest
        if latest is None:
            return None
        if latest.version <= newer_than <= self._version:
            return None
        return latest
