"""Sampling a `ShardedReplayTable`: one sampler per shard, each replica drawing from its own.

Any sampler made on a sharded table (``rg.UniformSampler(sharded_table, seed=0)``, a
`PrioritizedSampler`, an `NStepSampler` wrapping either, ...) is a `ShardedSampler`: it holds one
sampler of that class per shard, built with the same arguments on that shard (and a seed of its
own, derived from the given one), and forwards each call to the shard of the replica calling.
Inside `rg.Learner`'s loop each replica draws ``batch_size / replicas`` rows from its own shard;
rows never cross devices.

**Prioritized replay.** Each replica draws its share from its shard in proportion to priority,
so row ``i`` of shard ``s`` is drawn with probability ``p_i / (R * T_s)`` per draw (``T_s`` the
shard's total priority) instead of the single table's ``p_i / T``. The importance weights are
those of this actual distribution, normalised over *all* shards (one scalar all-gather per step):
``w_i = ((p_i / T_s) / min_s' (p_min_s' / T_s'))**-beta``, so with ``beta = 1`` the update is
unbiased exactly as single-device PER is. With rows dealt round-robin the shards hold the same
mix of priorities and ``T_s`` is close to ``T / R``; what the approximation changes is only how
strongly rows are favoured *across* shards, never which rows can be drawn.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError
from replaygpu.keys import IMPORTANCE_WEIGHTS
from replaygpu.samplers.base import Sampler
from replaygpu.sharded import ShardedReplayTable, replica_index

#: samplers that read consecutive rows of one stream: they need ``shard_by``.
_CONSECUTIVE = ("NStepSampler", "SequenceSampler", "FrameStackSampler")


class ShardedSampler(Sampler):
    """One ``sampler_cls`` per shard of a `ShardedReplayTable`; made by the sampler classes.

    Args:
        sampler_cls: the sampler class (e.g. `UniformSampler`).
        args, kwargs: its constructor arguments; the first is the `ShardedReplayTable`, or a
            `ShardedSampler` (for wrappers such as `NStepSampler`); a ``seed`` is turned into
            one seed per shard.

    Raises:
        ConfigError: for a sampler of consecutive rows on a table that deals rows round-robin.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> ShardedSampler:
        return object.__new__(cls)

    def __init__(
        self,
        sampler_cls: type[Sampler],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        super().__init__(name=f"sharded_{sampler_cls.__name__.lower()}")
        source = source_argument(sampler_cls, args, kwargs)
        if source is None:
            raise ConfigError(
                f"ShardedSampler: {sampler_cls.__name__}'s first argument is not a "
                "ShardedReplayTable or a sampler of one"
            )
        table = source if isinstance(source, ShardedReplayTable) else source.table
        if tf.distribute.has_strategy():
            raise ConfigError(
                f"{sampler_cls.__name__} of a sharded table: made inside strategy.scope(), where "
                "its variables would be mirrored on all devices; make samplers outside the scope"
            )
        if sampler_cls.__name__ in _CONSECUTIVE and table.shard_by is None:
            raise ConfigError(
                f"{sampler_cls.__name__} reads consecutive rows of a stream, but table "
                f"'{table.name}' deals rows round-robin to its {table.num_shards} shards; make "
                "it with shard_by='<integer stream field>' (e.g. the actor id) so each stream's "
                "rows stay in one shard"
            )
        self.table = table
        self.sampler_cls = sampler_cls
        bound = inspect.signature(sampler_cls.__init__).bind(None, *args, **kwargs)
        seed = bound.arguments.get("seed")
        seeds = _shard_seeds(seed, table.num_shards)
        self.per_shard: list[Sampler] = []
        for i in range(table.num_shards):
            arguments = dict(bound.arguments)
            arguments.pop("self")
            first = next(iter(arguments))
            arguments[first] = (
                source.shards[i] if isinstance(source, ShardedReplayTable) else source.per_shard[i]
            )
            if "seed" in arguments:
                arguments["seed"] = seeds[i]
            self.per_shard.append(_construct(sampler_cls, arguments))

    @property
    def keeps_priorities(self) -> bool:
        """Whether the per-shard samplers keep priorities."""
        return self.per_shard[0].keeps_priorities

    def local(self) -> Sampler:
        """The sampler of the calling replica's shard (inside ``strategy.run``)."""
        return self.per_shard[replica_index(self.table.strategy)]

    def sample(self, batch_size: int) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """This replica's ``(indices, batch)``: ``batch_size`` rows of its own shard.

        ``batch_size`` is the per-replica size (the `Learner` passes its batch size divided by
        the number of replicas). Call inside ``strategy.run``.
        """
        local = self.local()
        core = _prioritized_core(local)
        beta = core.current_beta() if core is not None else None  # the beta the draw uses
        indices, batch = local.sample(batch_size)
        if core is not None and IMPORTANCE_WEIGHTS in batch:
            batch[IMPORTANCE_WEIGHTS] = self._global_weights(core, beta, batch[IMPORTANCE_WEIGHTS])
        return indices, batch

    def loop_scope(self) -> contextlib.AbstractContextManager[None]:
        """Every shard sampler's loop scope, each on its shard's device."""
        return self._all_scopes()

    @contextlib.contextmanager
    def _all_scopes(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for shard, sampler in zip(self.table.shards, self.per_shard, strict=True):
                with tf.device(shard.device):
                    stack.enter_context(sampler.loop_scope())
            yield

    def update_priorities(self, indices: tf.Tensor, priorities: tf.Tensor) -> None:
        """Set priorities of this replica's rows (inside ``strategy.run``)."""
        self.local().update_priorities(indices, priorities)

    def _global_weights(self, core: Any, beta: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
        """Renormalise a shard's weights ``(p_i / p_min_s)**-beta`` over all shards.

        The result is ``((p_i / T_s) / m)**-beta`` with ``m = min_s (p_min_s / T_s)``, i.e. the
        weights of the probabilities the shards really sample with, normalised by the largest
        weight of any row in any shard.
        """
        root = core.tree.root()
        local_min = root[1] / tf.maximum(root[0], np.finfo(np.float64).tiny)
        ctx = tf.distribute.get_replica_context()
        all_min = ctx.all_gather(tf.reshape(local_min, [1]), axis=0)
        factor = tf.pow(local_min / tf.reduce_min(all_min), -beta)
        return weights * tf.cast(factor, weights.dtype)

    def __repr__(self) -> str:
        return f"ShardedSampler({self.sampler_cls.__name__} x {len(self.per_shard)})"


def source_argument(
    sampler_cls: type[Sampler], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """A sampler constructor's first argument when it asks for a `ShardedSampler`, else None."""
    if args:
        source = args[0]
    else:
        names = list(inspect.signature(sampler_cls.__init__).parameters)
        source = kwargs.get(names[1]) if len(names) > 1 else None
    return source if isinstance(source, (ShardedReplayTable, ShardedSampler)) else None


def _construct(sampler_cls: type[Sampler], arguments: dict[str, Any]) -> Sampler:
    params = inspect.signature(sampler_cls.__init__).parameters
    args, kwargs = [], {}
    for name, value in arguments.items():
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(value)
        else:
            kwargs[name] = value
    return sampler_cls(*args, **kwargs)


def _shard_seeds(seed: int | None, shards: int) -> list[int | None]:
    """Distinct seeds per shard from one seed (None stays nondeterministic)."""
    if seed is None:
        return [None] * shards
    return [
        int(np.random.SeedSequence([int(seed), i]).generate_state(1, np.uint32)[0])
        for i in range(shards)
    ]


def _prioritized_core(sampler: Sampler) -> Any:
    """The `PrioritizedSampler` at the bottom of a chain of wrappers, or None."""
    while sampler is not None:
        if hasattr(sampler, "tree") and hasattr(sampler, "current_beta"):
            return sampler
        sampler = getattr(sampler, "base", None)
    return None
