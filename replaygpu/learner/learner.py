"""The fused learner loop: many SGD steps per `tf.function` call.

`Learner.train(k)` is one graph execution of ``sample -> gather -> update_fn -> (priority
update)`` run ``n = min(k, allowed)`` times, metric sums carried as loop variables and read back
once as a float64 vector. ``k`` is a tensor, so one trace serves every step count. The call is
the concrete function itself, and the vector says whether every shard held rows, so a call
reads nothing from the device before it starts (an empty table raises after a call that ran no
step); its cost beyond the steps is a bare ``tf.function``'s (benchmarks/train_call_cost.py).

The steps run in loops XLA can count: ``n // C`` loops of exactly ``C = chunk_steps`` steps (a
constant bound, so the optimized HLO says ``known_trip_count`` and XLA:GPU queues every
iteration), then ``n % C`` steps in one loop whose bound is known only at run time (XLA:GPU reads
its predicate back on the host before each iteration). Same steps, same draws, same order as
one loop of ``n``.

On a `ShardedReplayTable` each step is one ``strategy.run``: each replica samples
``batch_size / replicas`` rows of its shard (only ``update_fn``'s gradient all-reduce crosses
devices); metrics are averaged. XLA cannot compile a loop spanning devices, so
``jit_compile=True`` compiles each replica's step instead, which TensorFlow supports (all-reduce
inside) only when every device is a GPU; on CPUs the step runs without XLA.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from replaygpu.errors import ConfigError, check_int
from replaygpu.keys import PRIORITIES
from replaygpu.learner import update_checks
from replaygpu.learner.rate_limiter import SampleToInsertRatio
from replaygpu.learner.weights import WeightStore
from replaygpu.samplers.sampler import Sampler, check_not_empty, empty_table_error
from replaygpu.table import Table

logger = logging.getLogger(__name__)

UpdateFn = Callable[[dict[str, tf.Tensor]], Mapping[str, tf.Tensor]]

#: the name of the fused loop's counted ``tf.while_loop`` of ``chunk_steps`` SGD steps; the
#: remainder loop's name begins with it too (both bodies are one SGD step)
SGD_LOOP = "sgd_steps"
#: the loop over whole chunks (its body is one counted `SGD_LOOP`)
CHUNK_LOOP = "sgd_chunks"
#: the last ``num_steps % chunk_steps`` steps of a call, in a loop XLA cannot count
REST_LOOP = f"{SGD_LOOP}_rest"
#: the most steps one ``train`` call runs: the loop counts with an int32 on the host
MAX_STEPS_PER_CALL = 2**31 - 1


class Learner(tf.Module):
    """Runs ``update_fn`` on in-graph minibatches, many steps per call; `ConfigError` for a batch
    size below 1, a sampler not an `rg.Sampler` of this table, or a Keras optimizer reachable
    from ``update_fn`` that is not built.

    Args:
        table: the replay table, or a `ShardedReplayTable` (one shard per replica; then make
            the networks and optimizers inside ``table.strategy.scope()`` and let ``update_fn``
            all-reduce its gradients, see docs/deployment/multi-gpu.md).
        sampler: draws ``(indices, batch)`` inside the graph (e.g. ``rg.Sampler(table)``).
        update_fn: ``update_fn({field: [B, ...]}) -> {name: scalar tensor}``, applying its own
            optimizer step; a ``[B]`` `replaygpu.keys.PRIORITIES` output goes to
            ``sampler.update_priorities``.
        batch_size: minibatch size B in total (each of R replicas draws B / R rows).
        rate_limiter: optional `SampleToInsertRatio`; without one every requested step runs.
        jit_compile: compile the whole loop with XLA (the largest CPU win for small networks).
        autograph: convert Python control flow in ``update_fn``; False skips it on the first
            call (measured: 4.8 s -> 2.0 s for the CartPole DQN update, tracing and XLA
            included) for an update without Python ``if``/``for``/``while`` on tensors.
        chunk_steps: the SGD steps of one loop with a constant trip count; pass the ``k`` you
            call ``train`` with. A call of ``k`` steps runs ``k // chunk_steps`` such loops and
            then ``k % chunk_steps`` steps in a loop whose bound is only known at run time. XLA
            counts the first kind, so XLA:GPU queues its iterations; the second reads its
            predicate back on the host before every step (docs/gpu.md, "Loops XLA can count").
        strict: raise a `ConfigError` where ``update_fn``'s first trace finds a trap that is
            otherwise a `replaygpu.errors.BroadcastWarning` (a ``[B]`` field against a
            ``[B, 1]`` output).

    Attributes:
        steps: total SGD steps run (int64 variable, checkpointed).
        weights_version: version of the last `publish_weights` (int64 variable on the CPU,
            checkpointed, so versions keep growing across restarts).
        weight_store: the published weights that a server hands to actors.
    """

    def __init__(
        self,
        table: Table,
        sampler: Sampler,
        update_fn: UpdateFn,
        batch_size: int = 256,
        rate_limiter: SampleToInsertRatio | None = None,
        jit_compile: bool = False,
        autograph: bool = True,
        chunk_steps: int = 100,
        strict: bool = False,
    ) -> None:
        super().__init__(name="learner")
        batch_size = check_int("batch_size", batch_size, 1)
        self.chunk_steps = check_int("chunk_steps", chunk_steps, 1)
        if not isinstance(sampler, Sampler):
            raise ConfigError(
                f"sampler: got {type(sampler).__name__}, expected an rg.Sampler, e.g. "
                "rg.Sampler(table, rg.Prioritized()); a sampler of your own subclasses rg.Sampler"
            )
        if sampler.table is not table:
            raise ConfigError(
                "sampler: it samples another table than the learner's; pass one "
                "made with this table"
            )
        self.strategy = table.strategy
        replicas = table.num_shards
        if batch_size % replicas:
            raise ConfigError(
                f"batch_size: got {batch_size}, expected a multiple of the table's {replicas} "
                f"shards (each replica draws batch_size / {replicas} rows); try "
                f"{max(replicas, batch_size // replicas * replicas)}"
            )
        self.table = table
        self.sampler = sampler
        self.rate_limiter = rate_limiter
        self.batch_size = batch_size
        #: rows each replica draws per step (batch_size on one device)
        self.replica_batch_size = self.batch_size // replicas
        self.jit_compile = bool(jit_compile)
        self.autograph = bool(autograph)
        unbuilt = update_checks.unbuilt_optimizers(update_fn)
        if unbuilt:
            raise ConfigError(
                f"update_fn uses Keras optimizers that are not built: {', '.join(unbuilt)}; build "
                "each before making the Learner (optimizer.build(model.trainable_variables)): one "
                "first built inside a trace that fails keeps broken variables"
            )
        self.strict = bool(strict)
        self._update_fn = update_fn
        self._replica_steps: list[Callable[[], tf.Tensor]] = []
        if self.strategy is not None:
            all_gpus = all("GPU" in shard.device.upper() for shard in table.shards)
            # A nested tf.function may hold an all-reduce only when XLA compiles it on GPUs
            # (elsewhere MirroredStrategy all-reduces by merge_call, which needs the outer graph).
            self._replica_steps = [
                tf.function(self._replica_step, jit_compile=True, autograph=self.autograph)
                if self.jit_compile and all_gpus
                else self._replica_step
                for _ in table.shards
            ]
            if self.jit_compile and not all_gpus:
                logger.info(
                    "sharded learner on %s: TensorFlow cannot all-reduce inside XLA on CPU "
                    "devices, so the replica steps run without XLA",
                    [shard.device for shard in table.shards],
                )
        with tf.device(table.device):
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")
        with tf.device("/CPU:0"):  # read and written by the host only
            self.weights_version = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="weights_version"
            )
        self.weight_store = WeightStore(self.weights_version)
        self._metric_names: list[str] | None = None
        self._call = _TrainCall()  # a plain object: tf.Module tracks no attribute of it
        self._train_fn = tf.function(
            self._train_graph,
            input_signature=[tf.TensorSpec([], tf.int64)],
            jit_compile=self.jit_compile and self.strategy is None,
            reduce_retracing=True,
            autograph=self.autograph,
        )

    @property
    def metric_names(self) -> list[str]:
        """Names of the scalar metrics ``update_fn`` returns (known after the first trace)."""
        return list(self._metric_names or [])

    @property
    def train_function(self) -> Any:
        """The fused loop as a ``tf.function`` of an int64 scalar ``num_steps``, for inspecting
        the graph (e.g. ``experimental_get_compiler_ir(...)(stage="hlo")``); traces
        ``update_fn`` once to learn its metrics, as the first ``train`` does. It returns a
        float64 vector ``[steps run, each metric's mean in metric_names order, filled]``, where
        ``filled`` is 1 when every shard held rows (0: no step ran for want of rows)."""
        if self._metric_names is None:
            self._metric_names = self._check_update_fn()
        return self._train_fn

    @property
    def trace_count(self) -> int:
        """How many times the fused loop was traced (stays 1 across step counts)."""
        return int(self._train_fn.experimental_get_tracing_count())

    def train(self, num_steps: int) -> dict[str, float]:
        """Run up to ``num_steps`` SGD steps in one graph call; ``{"steps": steps run, name:
        mean of update_fn's scalar over those steps}`` (means NaN when the rate limiter allowed
        no step). `EmptyTableError` on an empty table without a rate limiter; `ConfigError` when
        num_steps is negative or above `MAX_STEPS_PER_CALL`."""
        if not 0 <= num_steps <= MAX_STEPS_PER_CALL:
            raise ConfigError(
                f"num_steps: got {num_steps}, expected 0 <= num_steps <= {MAX_STEPS_PER_CALL} "
                "(the loop counts in int32); call train more often"
            )
        self.table.flush_writers()  # rows staged one at a time are sampled too
        first = self.trace_count == 0  # the loop's first trace: update_fn's too
        if first and self.rate_limiter is None:
            check_not_empty(self.table)  # before seconds of tracing; later, the graph's `filled`
        try:
            with tf.device(self.table.device):
                values = self._concrete_train()(self._call.steps(num_steps)).numpy().tolist()
        except Exception as err:
            if first:
                update_checks.explain_first_call_error(err)
            raise
        *values, filled = values
        if not filled and self.rate_limiter is None:  # the call ran no step and changed nothing
            raise empty_table_error(self.table)
        return dict(zip(["steps", *self.metric_names], values, strict=True))

    def publish_weights(self, source: Any) -> int:
        """Snapshot ``source``'s variables for actors' ``get_weights``; the version.

        ``source``: a Keras model, `tf.Module`, dict or list of variables, or a callable returning
        one (see `WeightStore.publish`); `ConfigError` when it holds no variables (e.g. an unbuilt
        Keras model)."""
        version = self.weight_store.publish(source)
        logger.debug("published weights version %d", version)
        return version

    def _concrete_train(self) -> Any:
        """The fused loop's one concrete function (traced on the first call): called directly,
        a call skips the ``tf.function`` call's input binding and trace lookup (measured: a
        fifth of a DQN 64x64 ``train(1)`` on 2 loaded CPU cores)."""
        if self._call.concrete is None:
            self._call.concrete = self.train_function.get_concrete_function()
        return self._call.concrete

    def _step(self) -> dict[str, tf.Tensor]:
        """One sample -> update_fn -> priority update; returns update_fn's scalar metrics."""
        indices, batch = self.sampler.sample(self.replica_batch_size)
        out = dict(self._update_fn(batch))
        priorities = out.pop(PRIORITIES, None)
        if priorities is not None:
            self.sampler.update_priorities(indices, priorities)
        return out

    def _check_update_fn(self) -> list[str]:
        """Trace one step outside the loop and check update_fn's outputs (a plain `ConfigError`,
        not a staging error from deep in TensorFlow); the metric names."""
        sampler, update_fn = self.sampler, self._update_fn
        traced: list[Any] = []

        def replica_probe() -> None:
            traced.append(update_fn(sampler.sample(self.replica_batch_size)[1]))

        def probe() -> None:
            if self.strategy is None:
                replica_probe()
            else:
                self.strategy.run(replica_probe)

        with tf.device(self.table.device):
            graph = tf.function(probe, autograph=self.autograph).get_concrete_function().graph
        names = update_checks.check_outputs(
            traced[0], sampler.keeps_priorities, type(sampler).__name__
        )
        update_checks.warn_outer_broadcasts(graph, self.replica_batch_size, self.strict)
        return names

    def _replica_step(self) -> tf.Tensor:
        """One `_step`; its metrics as a float64 vector in `metric_names` order."""
        metrics = self._step()
        names = self.metric_names
        if not names:
            return tf.zeros([0], tf.float64)
        return tf.stack([tf.cast(metrics[k], tf.float64) for k in names])

    def _train_graph(self, num_steps: tf.Tensor) -> tf.Tensor:
        table = self.table
        allowed = num_steps
        if self.rate_limiter is not None:
            allowed = tf.minimum(
                num_steps,
                self.rate_limiter.allowed_steps(
                    table.inserted_var.read_value(), table.size_var.read_value(), self.batch_size
                ),
            )
        filled = table.min_shard_size() > 0
        n = tf.where(filled, allowed, tf.zeros_like(allowed))
        names = self.metric_names
        # int32 counts: TensorFlow keeps int32 scalars of GPU ops in host memory, so the loop
        # bounds live on the host and no step waits on a device copy (an int64 one would).
        count = tf.cast(n, tf.int32)  # train() refuses num_steps above int32's range
        chunk = self.chunk_steps
        # chunks of one step would count nothing: then the one loop is the rest's
        chunks = count // chunk if chunk > 1 else tf.zeros_like(count)

        def step(sums: tf.Tensor) -> tf.Tensor:
            if self.strategy is None:
                values = self._replica_step()
            else:
                per_replica = self.strategy.run(lambda: self._replica_steps[table.local_index()]())
                values = self.strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None)
            return sums + values

        def counted(i: tf.Tensor, sums: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            # exactly `chunk` steps: a loop XLA counts (a constant bound), so XLA:GPU queues its
            # iterations instead of reading a predicate back on the host before each one
            _, sums = tf.while_loop(
                lambda j, _: j < chunk,
                lambda j, sums: (j + 1, step(sums)),
                (tf.constant(0, tf.int32), sums),
                parallel_iterations=1,
                name=SGD_LOOP,
            )
            return i + 1, sums

        sums = tf.zeros([len(names)], tf.float64)
        with self.sampler.loop_scope():
            if chunk > 1:
                _, sums = tf.while_loop(
                    lambda i, _: i < chunks,
                    counted,
                    (tf.constant(0, tf.int32), sums),
                    parallel_iterations=1,
                    name=CHUNK_LOOP,
                )
            rest = count - chunks * chunk  # fewer than `chunk` steps, in a loop XLA cannot count
            _, sums = tf.while_loop(
                lambda i, _: i < rest,
                lambda i, sums: (i + 1, step(sums)),
                (tf.constant(0, tf.int32), sums),
                parallel_iterations=1,
                name=REST_LOOP,
            )
        self.steps.assign_add(n)
        if self.rate_limiter is not None:
            self.rate_limiter.record(n * self.batch_size)
        ran = tf.cast(n, tf.float64)
        means = tf.where(
            n > 0,
            sums / tf.maximum(ran, 1.0),
            tf.fill([len(names)], tf.constant(np.nan, tf.float64)),
        )
        return tf.concat([ran[None], means, tf.cast(filled, tf.float64)[None]], axis=0)


class _TrainCall:
    """What `Learner.train` keeps from call to call: the fused loop's concrete function, and the
    int64 scalar tensor of the last step count, so that a loop calling ``train(k)`` with one
    ``k`` converts it once. The tensor is made in the call's device scope, as a fresh one is,
    and kept with its count in one tuple replaced whole, so threads never mix two."""

    def __init__(self) -> None:
        self.concrete: Any = None
        self._last: tuple[int, tf.Tensor] | None = None

    def steps(self, num_steps: int) -> tf.Tensor:
        last = self._last
        if last is not None and type(num_steps) is int and last[0] == num_steps:
            return last[1]
        tensor = tf.constant(num_steps, tf.int64)
        if type(num_steps) is int:  # not a bool, a float or a numpy number: those convert anew
            self._last = (num_steps, tensor)
        return tensor
