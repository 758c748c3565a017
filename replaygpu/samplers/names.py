"""The sampler names users know, each a `Sampler` with its distribution and view fixed.

=====================  ==========================================================
name                   is
=====================  ==========================================================
`UniformSampler`       ``Sampler(table, Uniform(), Transition())``
`PrioritizedSampler`   ``Sampler(table, Prioritized(...), Transition())``
`NStepSampler`         a sampler's indexes with ``NStep(n, gamma, stream_field)``
`FrameStackSampler`    ``Sampler(table, Uniform(), FrameStack(stack, n_step, gamma))``
`SequenceSampler`      ``Sampler(table, Uniform(), Sequence(length, burn_in, ...))``
=====================  ==========================================================

Combinations without a name of their own are written with `Sampler` directly, e.g. prioritized
frame stacks with 3-step returns: ``rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4,
n_step=3))``. On a `ShardedReplayTable` every name builds one index per shard.
"""

from __future__ import annotations

from typing import Any, cast

import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.samplers.frame_stack import FrameStack
from replaygpu.samplers.nstep import NStep
from replaygpu.samplers.prioritized import BetaSchedule, Prioritized, PrioritizedIndex
from replaygpu.samplers.sampler import Sampler
from replaygpu.samplers.sequence import Sequence
from replaygpu.samplers.uniform import Uniform
from replaygpu.samplers.view import Transition
from replaygpu.table import Table


class UniformSampler(Sampler):
    """Draws rows uniformly from the filled rows, as stored.

    Args:
        table: the table to sample from.
        seed: seed of the random stream; None for a nondeterministic one.
    """

    def __init__(self, table: Table, seed: int | None = None) -> None:
        super().__init__(table, Uniform(), Transition(), seed, name="uniform_sampler")


class PrioritizedSampler(Sampler):
    """Draws rows in proportion to their priority (see `Prioritized` for the arguments); the
    batch adds ``"importance_weights"`` ([B] float32).

    Attributes (of a plain table's index, for inspection): ``tree``, ``max_leaf``,
    ``sample_count``, ``nonfinite_priorities``, ``epsilon`` and ``current_beta()``.
    """

    def __init__(
        self,
        table: Table,
        alpha: float = 0.6,
        beta: float | BetaSchedule = 0.4,
        seed: int | None = None,
        epsilon: float = 1e-6,
        sync_chunk: int = 4096,
        tree_fanout: int = 8,
        xla: bool = True,
    ) -> None:
        distribution = Prioritized(alpha, beta, epsilon, sync_chunk, tree_fanout, xla)
        super().__init__(table, distribution, Transition(), seed, name="prioritized_sampler")

    @property
    def prioritized_index(self) -> PrioritizedIndex:
        """The plain table's `PrioritizedIndex` (a sharded table has ``indexes[i]``)."""
        return cast(PrioritizedIndex, self.index)  # built by Prioritized

    @property
    def tree(self) -> Any:
        return self.prioritized_index.tree

    @property
    def max_leaf(self) -> tf.Variable:
        return self.prioritized_index.max_leaf

    @property
    def sample_count(self) -> tf.Variable:
        return self.prioritized_index.sample_count

    @property
    def nonfinite_priorities(self) -> tf.Variable:
        return self.prioritized_index.nonfinite_priorities

    @property
    def epsilon(self) -> float:
        return self.distribution.epsilon  # type: ignore[attr-defined]

    def current_beta(self) -> tf.Tensor:
        """Beta for the next minibatch (float64 scalar)."""
        return self.prioritized_index.current_beta()


class NStepSampler(Sampler):
    """N-step transitions drawn by another sampler's indexes (uniform or prioritized).

    Args:
        base: the sampler whose distribution and indexes draw the first rows (they are shared:
            its random stream, its priorities), or a table (then a `UniformSampler` with
            ``seed`` is made).
        n: number of steps, >= 1 (1 gives the ordinary transitions plus ``discount``).
        gamma: discount factor in ``[0, 1]``.
        seed: seed of the `UniformSampler` made when ``base`` is a table.
        stream_field: optional integer field naming the stream (actor) of each row.

    See `NStep` for the batch.
    """

    def __init__(
        self,
        base: Sampler | Table,
        n: int = 3,
        gamma: float = 0.99,
        seed: int | None = None,
        stream_field: str | None = None,
    ) -> None:
        if not isinstance(base, Sampler):
            if not isinstance(base, Table):
                raise ConfigError(
                    f"base: got {type(base).__name__}, expected a ReplayTable or an rg.Sampler "
                    "(UniformSampler, PrioritizedSampler); pass the table or a sampler made on it"
                )
            base = UniformSampler(base, seed=seed)
        super().__init__(
            base.table,
            base.distribution,
            NStep(n, gamma, stream_field),
            spare_draws=base.spare_draws,
            indexes=base.indexes,
            name="nstep_sampler",
        )
        self.base = base

    def accumulate(self, indices: tf.Tensor, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Replace the one-step fields of the flat ``batch`` (rows ``indices`` of a plain
        table) by n-step ones."""
        view = cast(NStep, self.view)
        return view.accumulate(self.table.shards[0], indices, batch)


class FrameStackSampler(Sampler):
    """Draws transition rows of a frame table uniformly; rebuilds their ``[k, H, W]`` stacks.

    Args:
        table: a table with `make_frame_spec` fields, appended with `frame_rows`.
        stack: frames per stack k >= 1.
        seed: seed of the random stream; None for a nondeterministic one.
        spare_draws: spare rows per minibatch row for rows that cannot be drawn; see `Sampler`.
        n_step, gamma: n-step transitions; see `FrameStack`.
    """

    def __init__(
        self,
        table: Table,
        stack: int = 4,
        seed: int | None = None,
        spare_draws: int = 4,
        n_step: int = 1,
        gamma: float = 0.99,
    ) -> None:
        view = FrameStack(stack, n_step, gamma)
        super().__init__(table, Uniform(), view, seed, spare_draws, name="frame_stack_sampler")


class SequenceSampler(Sampler):
    """Draws ``[B, T]`` windows of consecutive rows uniformly; see `Sequence`.

    Args:
        table: the table, appended in time order.
        length: window length T >= 1.
        seed: seed of the random stream; None for a nondeterministic one.
        pad: allow windows that run past the episode end, with a mask.
        start_field: bool field marking the first row of each episode.
        spare_draws: spare starts per window for starts that are not valid; a window left
            without one is returned padded (``pad=False``).
        burn_in: rows before the start to prepend (``[B, burn_in + T]``).
        state_field, state_start_field: the stored recurrent state, returned at each window's
            first real row (``[B, ...]``), and the bool field marking rows that hold one.
    """

    def __init__(
        self,
        table: Table,
        length: int,
        seed: int | None = None,
        pad: bool = False,
        start_field: str | None = None,
        spare_draws: int = 4,
        burn_in: int = 0,
        state_field: str | None = None,
        state_start_field: str | None = None,
    ) -> None:
        view = Sequence(
            length,
            burn_in,
            pad=pad,
            start_field=start_field,
            state_field=state_field,
            state_start_field=state_start_field,
        )
        super().__init__(table, Uniform(), view, seed, spare_draws, name="sequence_sampler")

    @property
    def short_windows(self) -> tf.Tensor:
        """Windows returned padded because no spare draw was a valid start."""
        return self.invalid_draws
