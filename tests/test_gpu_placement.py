"""Every graph the project builds places entirely on one GPU: checked without a GPU.

The plain ``tensorflow`` wheel registers its CUDA kernels on a machine without a GPU, so each
graph (append of every table kind; the fused training loop of every agent and of every
distribution x view, XLA on and off; priority updates, ``as_dataset``, restore) is placed op
by op against the GPU registry (`gpu_kernels`). Three things are checked:

- no op lacks a GPU kernel for its dtypes (``XLA_GPU_JIT`` kernels under XLA);
- inside the fused loop (``rg.learner.SGD_LOOP``, whose body the check must have placed), no
  device-to-host copy per SGD step of a value that depends on data: a loop predicate, a
  host-memory input such as a bounded random draw's ``maxval``, a value entering a nested loop
  or branch, or an op that falls back to the CPU. Copies once per call (the step count, a
  prioritized index's loop over new rows) are allowed.

``tensorflow-cpu`` registers no CUDA kernels: there these tests skip, and CI runs them in a
second environment with the plain wheel (``.ci/run``), where ``REPLAYGPU_GPU_REGISTRY=1``
turns a missing registry into a failure.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from gpu_kernels import (
    Finding,
    Placement,
    cuda_kernels_registered,
    place_dataset,
    place_on_gpu,
    place_recorded,
    recorded_functions,
    register_xla_kernels,
)

import replaygpu as rg
from replaygpu.learner.learner import SGD_LOOP
from replaygpu.samplers import make_frame_spec, make_frame_table
from replaygpu.sharded import mirrored_strategy
from replaygpu.specs import specs_from_env

REQUIRED = os.environ.get("REPLAYGPU_GPU_REGISTRY") == "1"
HAVE_REGISTRY = cuda_kernels_registered()

if REQUIRED and not HAVE_REGISTRY:
    raise RuntimeError(
        "REPLAYGPU_GPU_REGISTRY=1 but this TensorFlow registers no CUDA kernels: install the "
        "plain `tensorflow` wheel (not tensorflow-cpu) on Linux x86-64 for this test"
    )
pytestmark = pytest.mark.skipif(
    not HAVE_REGISTRY,
    reason="tensorflow-cpu registers no CUDA kernels; .ci/run runs this with the plain wheel",
)


@pytest.fixture(scope="module", autouse=True)
def xla_kernels() -> None:
    if HAVE_REGISTRY:
        register_xla_kernels()


def per_step(findings: list[Finding]) -> list[Finding]:
    """Findings paid at every SGD step: inside the fused loop's body or condition."""
    return [f for f in findings if SGD_LOOP in f.where]


def missing_kernels(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.kind != "device-to-host"]


def check(placement: Placement, what: str) -> Placement:
    assert placement.ops_seen > 0, f"{what}: no op was placed"
    problems = missing_kernels(placement.findings) + per_step(placement.findings)
    assert not problems, f"{what}:\n" + "\n".join(map(str, problems))
    return placement


def assert_places_on_gpu(names: list[str], what: str) -> Placement:
    return check(place_recorded(names), what)


def rows_of(spec: dict[str, tf.TensorSpec], n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for k, leaf in spec.items():
        dtype = leaf.dtype.as_numpy_dtype
        shape = [n, *leaf.shape]
        if leaf.dtype == tf.bool:
            out[k] = rng.random(shape) < 0.1
        elif leaf.dtype.is_floating:
            out[k] = rng.standard_normal(shape).astype(dtype)
        else:
            out[k] = rng.integers(0, 2, shape).astype(dtype)
    return out


# -- the checker itself fails on what the GPU registry lacks ---------------------------------


def test_checker_reports_a_bool_scatter_with_int64_indices_and_an_int64_loop_counter() -> None:
    var = tf.Variable(tf.zeros([8], tf.bool))
    size = tf.Variable(tf.constant(5, tf.int64))
    gen = tf.random.Generator.from_seed(0)

    @tf.function
    def bool_scatter(rows: tf.Tensor) -> None:
        var.scatter_update(tf.IndexedSlices(tf.ones_like(rows, tf.bool), rows))

    @tf.function
    def int64_loop() -> tf.Tensor:
        return tf.while_loop(
            lambda i, s: i < size,
            lambda i, s: (i + 1, s + gen.uniform([], 0, size.read_value(), tf.int64)),
            (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
            name=SGD_LOOP,
        )

    @tf.function
    def int32_loop() -> tf.Tensor:
        return tf.while_loop(
            lambda i, s: i < 10,
            lambda i, s: (i + 1, s + gen.uniform_full_int([], tf.int64) % 7),
            (tf.constant(0, tf.int32), tf.constant(0, tf.int64)),
            name=SGD_LOOP,
        )

    @tf.function
    def int64_counter() -> tf.Tensor:
        return tf.while_loop(lambda i: i < 10, lambda i: i + 1, [tf.constant(0, tf.int64)])

    with recorded_functions() as names:
        bool_scatter(tf.constant([1, 2], tf.int64))
        int64_loop()
    findings = place_recorded(names).findings
    kinds = sorted((f.kind, f.op.split()[0]) for f in findings)
    assert ("no-gpu-kernel", "ResourceScatterUpdate") in kinds
    assert ("device-to-host", "While") in kinds  # the int64 predicate
    assert ("device-to-host", "StatelessRandomUniformIntV2") in kinds  # maxval from a variable
    assert len(per_step(findings)) == 2

    with recorded_functions() as names:
        int32_loop()
    assert place_recorded(names).findings == []

    with recorded_functions() as names:
        int64_counter()  # counts from a constant, but the count changes every iteration
    assert [f.op for f in place_recorded(names).findings] == ["While predicate"]


# -- append, every table kind -----------------------------------------------------------------


def vector_table() -> rg.ReplayTable:
    return rg.ReplayTable(specs_from_env(gym.make("CartPole-v1")), 256)


def nested_table() -> rg.ReplayTable:
    spec = {
        "obs": {"pos": tf.TensorSpec([3], tf.float32), "flag": tf.TensorSpec([], tf.bool)},
        "action": tf.TensorSpec([], tf.int64),
        "reward": tf.TensorSpec([], tf.float32),
        "terminated": tf.TensorSpec([], tf.bool),
    }
    return rg.ReplayTable(spec, 64, storage_dtypes={"obs/pos": tf.float16})


def frame_table() -> rg.ReplayTable:
    return make_frame_table(64, (8, 8))


def sequence_table() -> rg.ReplayTable:
    spec = dict(specs_from_env(gym.make("CartPole-v1")))
    spec["state/h"] = tf.TensorSpec([4], tf.float32)
    spec["state_stored"] = tf.TensorSpec([], tf.bool)
    return rg.ReplayTable(spec, 128)


def sharded_frame_table() -> rg.ShardedReplayTable:
    spec = dict(make_frame_spec((8, 8)))
    spec["actor"] = tf.TensorSpec([], tf.int64)
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    return rg.ShardedReplayTable(spec, 128, strategy, shard_by="actor")


def sharded_table() -> rg.ShardedReplayTable:
    spec = dict(specs_from_env(gym.make("CartPole-v1")))
    spec["actor"] = tf.TensorSpec([], tf.int64)
    strategy = mirrored_strategy(["/cpu:0", "/cpu:1"])
    return rg.ShardedReplayTable(spec, 128, strategy, shard_by="actor")


TABLES: dict[str, Callable[[], Any]] = {
    "vector": vector_table,
    "nested": nested_table,
    "frame": frame_table,
    "sequence": sequence_table,
    "sharded": sharded_table,
    "sharded-frames": sharded_frame_table,
}


@pytest.mark.parametrize("kind", sorted(TABLES))
def test_append_places_on_gpu(kind: str) -> None:
    table = TABLES[kind]()
    with recorded_functions() as names:
        table.append(rows_of(table.spec, 16))
    assert_places_on_gpu(names, f"append to a {kind} table")
    assert table.size == 16


def test_bools_are_stored_as_uint8_and_read_back_as_bools() -> None:
    table = vector_table()
    rows = rows_of(table.spec, 8)
    table.append(rows)
    assert table.storage["terminated"].dtype == tf.uint8
    assert table.storage_dtypes["terminated"] == tf.uint8
    got = table.read("terminated", tf.range(8, dtype=tf.int64))
    assert got.dtype == tf.bool
    np.testing.assert_array_equal(got.numpy(), rows["terminated"])


# -- training: every distribution x view, XLA on and off ---------------------------------------


def view_cases() -> dict[str, tuple[Callable[[], Any], Any]]:
    return {
        "transition": (vector_table, rg.Transition()),
        "nstep": (vector_table, rg.NStep(3, 0.99)),
        "frames": (frame_table, rg.FrameStack(4, n_step=3)),
        "sequence": (sequence_table, rg.Sequence(4, burn_in=2, state_field="state")),
    }


def toy_update(sampler: rg.Sampler) -> Callable[[Any], dict[str, tf.Tensor]]:
    weight = tf.Variable(1.0)

    def update(batch: Any) -> dict[str, tf.Tensor]:
        leaves = [tf.cast(x, tf.float32) for x in tf.nest.flatten(batch)]
        per_row = tf.add_n([tf.reduce_mean(tf.reshape(x, [tf.shape(x)[0], -1]), 1) for x in leaves])
        weight.assign_add(1e-3)
        out = {"loss": tf.reduce_mean(per_row) * weight}
        if sampler.keeps_priorities:
            out["priorities"] = tf.abs(per_row) + 1.0
        return out

    return update


def assert_train_places_on_gpu(learner: rg.Learner, what: str) -> Placement:
    fn = learner.train_function.get_concrete_function(tf.TensorSpec([], tf.int64))
    # XLA compiles the whole loop, except on a sharded table (the replica steps, on GPUs)
    xla = learner.jit_compile and learner.strategy is None
    placement = place_on_gpu(fn, xla=xla)
    if not xla:  # else XLA compiles the loop, and its ops were checked against XLA_GPU_JIT
        assert any(SGD_LOOP in loop for loop in placement.loops), placement.loops
    return check(placement, what)


@pytest.mark.parametrize("xla", [False, True], ids=["plain", "xla"])
@pytest.mark.parametrize("distribution", ["uniform", "prioritized"])
@pytest.mark.parametrize("view", sorted(view_cases()))
def test_training_loop_places_on_gpu(view: str, distribution: str, xla: bool) -> None:
    make_table, the_view = view_cases()[view]
    table = make_table()
    dist = rg.Prioritized() if distribution == "prioritized" else rg.Uniform()
    sampler = rg.Sampler(table, dist, the_view, seed=0)
    learner = rg.Learner(table, sampler, toy_update(sampler), batch_size=8, jit_compile=xla)
    assert_train_places_on_gpu(learner, f"train {distribution} x {view}")


@pytest.mark.parametrize("distribution", ["uniform", "prioritized"])
def test_sharded_training_loop_places_on_gpu(distribution: str) -> None:
    table = sharded_table()
    dist = rg.Prioritized() if distribution == "prioritized" else rg.Uniform()
    sampler = rg.Sampler(table, dist, rg.NStep(3, 0.99), seed=0)
    learner = rg.Learner(table, sampler, toy_update(sampler), batch_size=8)
    assert_train_places_on_gpu(learner, f"sharded train {distribution}")


# -- the agents: the graphs demo, serve and learner build --------------------------------------


def agent_configs() -> dict[str, Callable[[bool], Any]]:
    from replaygpu.agents.dqn.config import ApexAtariConfig, ApexConfig
    from replaygpu.agents.r2d2.config import R2D2LearnerConfig
    from replaygpu.agents.sac.config import SACLearnerConfig

    small = {"buffer_size": 512, "learning_starts": 64, "batch_size": 16}
    frames = {**small, "buffer_size": 4096}  # more than two actor segments
    return {
        "dqn-uniform": lambda xla: ApexConfig(prioritized=False, jit_compile=xla, **small),
        "dqn-prioritized": lambda xla: ApexConfig(prioritized=True, jit_compile=xla, **small),
        "dqn-sharded": lambda xla: ApexConfig(
            prioritized=True, jit_compile=xla, devices="/cpu:0,/cpu:1", **small
        ),
        "sac": lambda xla: SACLearnerConfig(jit_compile=xla, **small),
        "atari-prioritized": lambda xla: ApexAtariConfig(
            env_id="ALE/Pong-v5", jit_compile="on" if xla else "off", **frames
        ),
        "r2d2": lambda xla: R2D2LearnerConfig(jit_compile=xla, **small),
    }


@pytest.mark.parametrize("xla", [False, True], ids=["plain", "xla"])
@pytest.mark.parametrize("agent", sorted(agent_configs()))
def test_agent_training_places_on_gpu(agent: str, xla: bool) -> None:
    from replaygpu.agents.builder import make_parts

    if agent.startswith("atari"):
        pytest.importorskip("ale_py")
    if agent == "dqn-sharded" and xla:
        pytest.skip("a sharded loop compiles per replica only on GPUs; on CPUs it runs plain")
    config = agent_configs()[agent](xla)
    parts = make_parts(config)
    jit = parts.builder.jit_compile(config, parts.table)
    learner = rg.Learner(
        parts.table, parts.sampler, parts.agent.update, config.batch_size, jit_compile=jit
    )
    assert learner.jit_compile == xla
    placement = assert_train_places_on_gpu(learner, f"train {agent}")
    assert placement.ops_seen > 100  # the update's graph, not only the loop's


# -- priority updates, as_dataset, restore -----------------------------------------------------


def test_priority_update_and_dataset_place_on_gpu() -> None:
    table = vector_table()
    table.append(rows_of(table.spec, 64))
    sampler = rg.Sampler(table, rg.Prioritized(), rg.NStep(3, 0.99), seed=0)
    with recorded_functions() as names:
        sampler.update_priorities(np.arange(4), np.ones(4))
    assert_places_on_gpu(names, "update_priorities")
    dataset = sampler.as_dataset(8)
    rows, _ = next(iter(dataset))
    assert rows.shape == (8,)
    check(place_dataset(dataset), "as_dataset")


def test_restore_places_on_gpu() -> None:
    table = frame_table()
    table.append(rows_of(table.spec, 32))
    sampler = rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4), seed=0)
    sampler.sync()
    folder = tempfile.mkdtemp()
    checkpointer = rg.Checkpointer(folder, table=table, sampler=sampler)
    checkpointer.save()
    table.append(rows_of(table.spec, 8, seed=1))
    checkpointer.restore()
    assert table.total_inserted == 32

    # A restore reads the files on the host (RestoreV2) and runs no graph of ours; what it does
    # on the device is one assign per variable, of the variable's dtype.
    variables = [v for obj in (table, sampler) for v in obj.variables]

    @tf.function
    def assign_all() -> None:
        for v in variables:
            v.assign(v.read_value())

    placement = check(place_on_gpu(assign_all.get_concrete_function()), "restore's assigns")
    assert placement.ops_seen >= 2 * len(variables)
