"""Every loop of every agent's fused train call is one XLA can count (issue 48).

XLA:GPU runs a ``while`` whose trip count it does not know with a copy of the predicate to the
host, and a wait for an idle GPU, before every iteration; a counted one is queued whole. So the
optimized HLO of each fused call (XLA:CPU here: the annotator that writes ``known_trip_count``
runs in both pipelines) must show:

- the SGD loop (`rg.learner.SGD_LOOP`) counted, at the learner's ``chunk_steps``;
- every loop inside an SGD step (R2D2's loops over time, forward and backward) counted;
- uncounted only: the loop over whole chunks (`CHUNK_LOOP`, one iteration per ``chunk_steps``
  steps), the last ``num_steps % chunk_steps`` steps (`REST_LOOP`) and the prioritized index's
  once-per-call intake of new rows (`SYNC_LOOP`), each outside any SGD step.

The learners are built as the runners build them: `make_learner` for every served algorithm,
`fused_learner` for the in-process DQN and R2D2 loops. A sharded learner's replica step is the
same ``update_fn``; XLA compiles it per replica on GPUs only, so its loops are these.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.learner.learner import CHUNK_LOOP, REST_LOOP, SGD_LOOP
from replaygpu.samplers.prioritized import SYNC_LOOP
from replaygpu.specs import specs_from_env

SMALL = {"buffer_size": 512, "learning_starts": 64, "batch_size": 16}
#: loops whose bound is known only at run time, allowed outside the SGD steps
UNCOUNTED = (CHUNK_LOOP, REST_LOOP, SYNC_LOOP)

_WHILE = re.compile(r" while\(%")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def while_loops(hlo: str) -> list[tuple[str, int | None]]:
    """``(op_name, known trip count or None)`` of every ``while`` in optimized HLO text."""
    loops = []
    for line in hlo.splitlines():
        if _WHILE.search(line):
            name, trip = _OP_NAME.search(line), _TRIP.search(line)
            loops.append((name.group(1) if name else "", int(trip.group(1)) if trip else None))
    return loops


def uncounted_loops(hlo: str, chunk_steps: int) -> list[str]:
    """What breaks the rule above, one line each (empty: every loop is as it should be)."""
    wrong, saw_sgd_loop = [], False
    for name, trip in while_loops(hlo):
        scopes = name.split("/")
        if scopes[-1] == SGD_LOOP:
            saw_sgd_loop = True
            if trip != chunk_steps:
                wrong.append(f"{name}: trip count {trip}, expected chunk_steps {chunk_steps}")
        elif trip is None and (scopes[-1] not in UNCOUNTED or len(scopes) > 1):
            wrong.append(f"{name or '(unnamed)'}: no known trip count")
    if not saw_sgd_loop:
        wrong.append(f"no loop named {SGD_LOOP} among {while_loops(hlo)}")
    return wrong


def optimized_hlo(learner: rg.Learner, num_steps: int) -> str:
    ir = learner.train_function.experimental_get_compiler_ir(tf.constant(num_steps, tf.int64))
    return ir(stage="optimized_hlo")


def served(make_config: Callable[[], Any]) -> Callable[[], rg.Learner]:
    def build() -> rg.Learner:
        from replaygpu.agents.builder import make_learner, make_parts

        config = make_config()
        return make_learner(config, make_parts(config))

    return build


def in_process_dqn() -> rg.Learner:
    from replaygpu.agents.dqn.agent import DQN, fused_learner
    from replaygpu.agents.dqn.config import DQNConfig

    config = DQNConfig(gradient_steps=8, **SMALL)
    env = gym.make_vec("CartPole-v1", num_envs=1)
    table = rg.ReplayTable(specs_from_env(env), config.buffer_size)
    agent = DQN(4, 2, config, config.learning_rate_schedule)
    return fused_learner(table, rg.Sampler(table, seed=0), agent, config)


def in_process_r2d2() -> rg.Learner:
    from replaygpu.agents.dqn.agent import fused_learner
    from replaygpu.agents.envs import discrete_actions_env
    from replaygpu.agents.r2d2.agent import make_agent, make_sampler, table_spec
    from replaygpu.agents.r2d2.config import R2D2Config

    config = R2D2Config(gradient_steps=4, **SMALL)
    env = discrete_actions_env(config.env_id)
    table = rg.ReplayTable(table_spec(config, env), config.buffer_size)
    agent = make_agent(config, env)
    return fused_learner(table, make_sampler(config, table, agent), agent, config)


def learners() -> dict[str, Callable[[], rg.Learner]]:
    from replaygpu.agents.dqn.config import ApexAtariConfig, ApexConfig
    from replaygpu.agents.r2d2.config import R2D2LearnerConfig
    from replaygpu.agents.sac.config import SACLearnerConfig

    return {
        "dqn": in_process_dqn,
        "r2d2": in_process_r2d2,
        "apex-uniform": served(lambda: ApexConfig(prioritized=False, **SMALL)),
        "apex-prioritized": served(lambda: ApexConfig(prioritized=True, **SMALL)),
        "sac-served": served(lambda: SACLearnerConfig(**SMALL)),
        "r2d2-served": served(lambda: R2D2LearnerConfig(**SMALL)),
        "apex-atari": served(
            lambda: ApexAtariConfig(
                env_id="ALE/Pong-v5", jit_compile="on", **{**SMALL, "buffer_size": 4096}
            )
        ),
    }


@pytest.mark.parametrize("agent", sorted(learners()))
def test_every_loop_of_the_fused_train_call_has_a_known_trip_count(agent: str) -> None:
    if agent == "apex-atari":
        pytest.importorskip("ale_py")
    learner = learners()[agent]()
    assert learner.jit_compile, "the agents compile their fused loop with XLA by default"
    hlo = optimized_hlo(learner, learner.chunk_steps)
    assert uncounted_loops(hlo, learner.chunk_steps) == []
    if agent.startswith("r2d2"):  # the loops over time: forward (burn-in, trained) and backward
        inner = [(n, t) for n, t in while_loops(hlo) if n.split("/")[0] == CHUNK_LOOP]
        assert len(inner) >= 4 and all(t is not None for n, t in inner if n != CHUNK_LOOP)


def test_the_check_finds_the_single_loop_of_a_runtime_bound() -> None:
    """The rule fails on the loop `Learner` ran before chunks: ``while i < min(k, allowed)``."""

    size = tf.Variable(tf.constant(100, tf.int64))
    x = tf.Variable(tf.ones([4]))

    @tf.function(jit_compile=True)
    def one_loop(num_steps: tf.Tensor) -> tf.Tensor:
        count = tf.cast(tf.minimum(num_steps, size), tf.int32)
        return tf.while_loop(
            lambda i, y: i < count,
            lambda i, y: (i + 1, tf.sin(y)),
            (0, x.read_value()),
            name=SGD_LOOP,
        )[1]

    hlo = one_loop.experimental_get_compiler_ir(tf.constant(100, tf.int64))(stage="optimized_hlo")
    assert while_loops(hlo) == [(SGD_LOOP, None)]
    assert uncounted_loops(hlo, 100) == [f"{SGD_LOOP}: trip count None, expected chunk_steps 100"]


def test_a_call_runs_whole_chunks_then_the_rest_with_the_same_draws_as_single_steps() -> None:
    """``train(k)`` in chunks of 4 runs k steps whatever k, drawing the rows that k calls of one
    step draw, in order (the sampler's generator advances as in one loop)."""
    spec = {"x": tf.TensorSpec([], tf.float32)}
    rows = []

    def tables() -> tuple[rg.ReplayTable, rg.Sampler]:
        table = rg.ReplayTable(spec, 64)
        table.append({"x": tf.range(64, dtype=tf.float32)})
        return table, rg.Sampler(table, seed=3)

    drawn = tf.Variable(tf.zeros([0], tf.float32), shape=[None])

    def update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        drawn.assign(tf.concat([drawn, batch["x"]], axis=0))
        return {"mean": tf.reduce_mean(batch["x"])}

    for chunk, calls in ((4, (11, 0, 4, 3, 8)), (1, (1,) * 26)):
        table, sampler = tables()
        drawn.assign(tf.zeros([0], tf.float32))
        learner = rg.Learner(table, sampler, update, batch_size=2, chunk_steps=chunk)
        ran = [learner.train(k)["steps"] for k in calls]
        assert ran == [float(k) for k in calls]
        assert learner.trace_count == 1
        rows.append(drawn.numpy().tolist())
    assert len(rows[0]) == 2 * 26 and rows[0] == rows[1]
