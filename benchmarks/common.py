"""What the replay benchmarks share: the vector DQN transition, random tables of it, and the
in-graph sample-only loop.

The scripts beside it import it as ``common`` (a script's own folder is first on ``sys.path``);
``peers/prioritized.py`` puts this folder on the path. Only numpy is imported at the top, so
that the peers' venvs, which have no TensorFlow, can import `random_transitions`; the helpers
that need TensorFlow and replaygpu import them when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf

    import replaygpu as rg

#: rows appended per call when a table is filled
CHUNK = 100_000


def dqn_spec(obs_dim: int) -> dict[str, tf.TensorSpec]:
    """A vector DQN transition: ``obs`` and ``next_obs`` ``[obs_dim]`` float32, an int64
    ``action``, a float32 ``reward``, bool ``terminated`` and ``truncated``."""
    import tensorflow as tf

    return {
        "obs": tf.TensorSpec([obs_dim], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec([obs_dim], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
        "truncated": tf.TensorSpec([], tf.bool),
    }


def random_transitions(rng: np.random.Generator, n: int, obs_dim: int) -> dict[str, np.ndarray]:
    """``n`` random `dqn_spec` transitions as numpy columns (normal observations and rewards,
    4 actions, 1% terminal)."""
    return {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "action": rng.integers(0, 4, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "terminated": rng.random(n) < 0.01,
        "truncated": np.zeros(n, bool),
    }


def filled_table(capacity: int, obs_dim: int, seed: int = 0, **table_kwargs: Any) -> rg.ReplayTable:
    """A `rg.ReplayTable` of ``capacity`` `random_transitions` (numpy seed ``seed``), appended
    `CHUNK` rows at a time; ``table_kwargs`` go to the table (e.g. ``storage_dtypes``)."""
    import replaygpu as rg

    table = rg.ReplayTable(dqn_spec(obs_dim), capacity, **table_kwargs)
    rng = np.random.default_rng(seed)
    for start in range(0, capacity, CHUNK):
        table.append(random_transitions(rng, min(CHUNK, capacity - start), obs_dim))
    return table


def sample_loop(sampler: Any, batch: int, xla: bool) -> Callable[[tf.Tensor], tf.Tensor]:
    """``loop(n)``: ``n`` draws of ``batch`` `dqn_spec` rows from ``sampler`` in one
    `tf.while_loop` (compiled with XLA if ``xla``), every field reduced into the checksum it
    returns, so that nothing is pruned."""
    import tensorflow as tf

    @tf.function(jit_compile=xla)
    def loop(n: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            _, rows = sampler.sample(batch)
            checksum = (
                tf.reduce_sum(rows["obs"])
                + tf.reduce_sum(rows["next_obs"])
                + tf.reduce_sum(rows["reward"])
                + tf.cast(tf.reduce_sum(rows["action"]), tf.float32)
                + tf.cast(tf.math.count_nonzero(rows["terminated"]), tf.float32)
                + tf.cast(tf.math.count_nonzero(rows["truncated"]), tf.float32)
            )
            return i + 1, acc + checksum

        return tf.while_loop(lambda i, _: i < n, body, (tf.constant(0, tf.int64), 0.0))[1]

    return loop
