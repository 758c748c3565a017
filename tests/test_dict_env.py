"""Nested specs on the wire and a gymnasium Dict-observation env end to end: a real server on
loopback, the client sending nested transitions as '/'-joined leaf paths, an Ape-X actor
stepping a Dict env built with gymnasium's own wrappers, and DQN training on what it sent."""

import collections
import contextlib
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.distributed.actor import run_actor
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.agents.dqn.agent import DQN, DQNConfig, obs_size
from replaygpu.errors import BatchError
from replaygpu.service.server.loop import run as run_learner
from replaygpu.specs import specs_from_env

ENV_ID = "replaygpu-tests/DictCartPole-v0"
DICT_SPACE = gym.spaces.Dict(
    {
        "position": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
        "velocity": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
    }
)


def make_dict_cartpole(**kwargs):
    """CartPole whose observation is ``{"position": [x, theta], "velocity": [x', theta']}``."""
    return gym.wrappers.TransformObservation(
        gym.make("CartPole-v1", **kwargs),
        lambda obs: {"position": obs[[0, 2]], "velocity": obs[[1, 3]]},
        DICT_SPACE,
    )


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=make_dict_cartpole)

Point = collections.namedtuple("Point", ["x", "y"])
SPEC = {
    "id": tf.TensorSpec([], tf.int64),
    "obs": {
        "pixels": tf.TensorSpec([3, 2], tf.uint8),
        "where": Point(*[tf.TensorSpec([], tf.float32)] * 2),
    },
}


def nested_columns(ids):
    ids = np.asarray(ids, np.int64)
    return {
        "id": ids,
        "obs": {
            "pixels": np.repeat(ids.astype(np.uint8)[:, None, None], 6, axis=1).reshape(-1, 3, 2),
            "where": Point(ids.astype(np.float32), -ids.astype(np.float32)),
        },
    }


def wait_for_rows(table, rows, timeout=30.0):
    deadline = time.monotonic() + timeout
    while table.total_inserted < rows and time.monotonic() < deadline:
        time.sleep(0.05)
    return table.total_inserted


@contextlib.contextmanager
def training(server, learner, steps_per_call=10):
    """The learner's loop (which commits the actors' appends and trains) in a thread."""
    stop = threading.Event()
    loop = threading.Thread(
        target=run_learner, args=(server, learner, steps_per_call), kwargs={"stop": stop}
    )
    loop.start()
    try:
        yield
    finally:
        stop.set()
        loop.join(60)


def test_nested_transitions_travel_as_leaf_paths_and_come_back_nested():
    table = rg.ReplayTable(SPEC, 64)
    with rg.serve(table, "127.0.0.1:0") as server:
        client = rg.ReplayClient(server.address, actor_id="nested")
        try:
            assert sorted(client.spec) == ["id", "obs/pixels", "obs/where/x", "obs/where/y"]
            client.add_batch(nested_columns(np.arange(5)))
            one = nested_columns([5])
            client.add(
                {
                    "id": one["id"][0],
                    "obs": {"pixels": one["obs"]["pixels"][0], "where": Point(5.0, -5.0)},
                }
            )
            client.add(
                {
                    "id": 6,
                    "obs/pixels": np.full([3, 2], 6, np.uint8),
                    "obs/where/x": 6.0,
                    "obs/where/y": -6.0,
                }
            )
            client.flush(timeout=30)
        finally:
            client.close()
    assert table.size == 7
    _, batch = rg.Sampler(table, seed=0).sample(32)
    ids = batch["id"].numpy()
    assert isinstance(batch["obs"]["where"], Point)
    np.testing.assert_array_equal(batch["obs"]["where"].y.numpy(), -ids.astype(np.float32))
    np.testing.assert_array_equal(batch["obs"]["pixels"].numpy()[:, 2, 1], ids.astype(np.uint8))
    assert set(ids) == set(range(7))


def test_a_bad_nested_batch_is_refused_by_the_client_naming_the_leaf():
    table = rg.ReplayTable(SPEC, 64)
    with (
        rg.serve(table, "127.0.0.1:0") as server,
        rg.ReplayClient(server.address, actor_id="bad") as client,
    ):
        bad = nested_columns([1, 2])
        bad["obs"]["where"] = Point(np.full(2, 1e39), np.zeros(2, np.float32))
        with pytest.raises(BatchError, match=r"field 'obs/where/x': expected dtype float32"):
            client.add_batch(bad)
        with pytest.raises(BatchError, match=r"missing \['obs/where/y'\]"):
            client.add_batch(
                {
                    "id": [1],
                    "obs": {"pixels": np.zeros([1, 3, 2], np.uint8), "where": {"x": [1.0]}},
                }
            )
    assert table.size == 0


def test_a_dict_observation_env_runs_actor_to_server_to_dqn_learner():
    env = gym.make(ENV_ID)
    assert isinstance(env.observation_space, gym.spaces.Dict)
    spec = specs_from_env(env)
    table = rg.ReplayTable(spec, 4_000, name="replay")
    assert {"obs/position", "obs/velocity", "next_obs/position", "next_obs/velocity"} <= set(
        table.spec
    )
    agent = DQN(
        obs_size(env.observation_space), int(env.action_space.n), DQNConfig(hidden_sizes=(16, 16))
    )
    assert obs_size(env.observation_space) == 4
    env.close()
    learner = rg.Learner(
        table, rg.Sampler(table, rg.Uniform(), rg.NStep(3), seed=0), agent.update, batch_size=32
    )
    learner.publish_weights(agent.q)  # the actor acts with the greedy policy on Dict obs
    with rg.serve(learner, "127.0.0.1:0") as server, training(server, learner):
        out = run_actor(
            ActorConfig(
                env_id=ENV_ID, steps=400, num_envs=4, send_interval=25, weight_pull_interval=100
            ),
            server.address,
        )
        assert out["env_steps"] == 400 and out["weight_updates"] >= 1
        assert wait_for_rows(table, 400) == 400
    rows = table.gather(tf.range(400, dtype=tf.int64))
    # the next observation of a row is the observation of the next step of the same env
    # (rows are vector steps of 4 envs; an episode end puts its true last obs in next_obs)
    pos, next_pos = rows["obs/position"].numpy(), rows["next_obs/position"].numpy()
    done = (rows["terminated"].numpy() | rows["truncated"].numpy())[:-4]
    np.testing.assert_array_equal(next_pos[:-4][~done], pos[4:][~done])
    assert np.abs(pos[:, 1]).max() < 0.25  # the pole angle sits in 'position', as wrapped
    metrics = learner.train(20)
    assert metrics["steps"] == 20
    assert np.isfinite(metrics["losses/td_loss"]) and metrics["losses/td_loss"] > 0


def test_dqn_train_runs_on_a_dict_observation_env_with_narrow_storage():
    from replaygpu.agents.dqn import agent as dqn

    config = dqn.DQNConfig(
        env_id=ENV_ID,
        seed=0,
        steps=1_200,
        learning_starts=500,
        train_freq=100,
        gradient_steps=10,
        buffer_size=2_000,
        hidden_sizes=(16, 16),
        num_envs=2,
        eval_episodes=2,
        jit_compile=False,
        storage_dtype="float16",
    )
    result = dqn.train(config)
    assert result.sgd_steps > 0 and result.env_steps >= 1_200
    assert result.eval_returns.shape == (2,) and (result.eval_returns >= 8).all()


DICT_PENDULUM_ID = "replaygpu-tests/DictPendulum-v0"
if DICT_PENDULUM_ID not in gym.registry:
    gym.register(
        DICT_PENDULUM_ID,
        entry_point=lambda **kwargs: gym.wrappers.TransformObservation(
            gym.make("Pendulum-v1", **kwargs),
            lambda obs: {"cos_sin": obs[:2], "speed": obs[2:]},
            gym.spaces.Dict(
                {
                    "cos_sin": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                    "speed": gym.spaces.Box(-8.0, 8.0, (1,), np.float32),
                }
            ),
        ),
    )


def test_sac_refuses_a_dict_observation_env_naming_the_space_and_the_fix():
    from replaygpu.agents.sac import agent as sac

    with pytest.raises(rg.ConfigError, match=r"expected a Box.*FlattenObservation"):
        sac.check_env(DICT_PENDULUM_ID)
