"""Published weights: versioned host snapshots that the service hands to actors.

`Learner.publish_weights` copies the variables to numpy on the learner thread and bumps the
version; gRPC threads read the latest snapshot without touching TensorFlow.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


class WeightStore:
    """Holds the latest `WeightSnapshot`; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: WeightSnapshot | None = None

    @property
    def version(self) -> int:
        """The latest version, 0 before the first publication."""
        latest = self._latest
        return latest.version if latest is not None else 0

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
            version = self.version + 1
            self._latest = WeightSnapshot(version, names, arrays)
        return version

    def latest(self, newer_than: int = 0) -> WeightSnapshot | None:
        """The latest snapshot when its version is above ``newer_than``, else None."""
        latest = self._latest
        if latest is None or latest.version <= newer_than:
            return None
        return latest
