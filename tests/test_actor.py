"""Ape-X actors against a real replay server on loopback: the `replaygpu actor` command, weight
pulls, the epsilon ladder, and no TensorFlow in the actor process."""

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.distributed.actor import run_actor
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.agents.networks import mlp
from replaygpu.service.server.loop import run as run_learner
from replaygpu.service.wire.status import ServiceUnavailableError
from replaygpu.specs import specs_from_env


@pytest.fixture()
def served_learner():
    """A CartPole table served by a learner that published one set of Q-network weights, with
    its training loop (which commits the actors' appends) running in a thread."""
    table = rg.ReplayTable(specs_from_env(gym.make("CartPole-v1")), 5_000, name="replay")
    q = mlp([4, 16, 2], seed=0)
    learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {"x": tf.zeros([])})
    learner.publish_weights(q)
    with rg.serve(learner, "127.0.0.1:0") as server, training(server, learner):
        yield server, table


@contextlib.contextmanager
def training(server, learner):
    """The learner's training loop (which commits the actors' appends) in a thread."""
    stop = threading.Event()
    loop = threading.Thread(target=run_learner, args=(server, learner, 10), kwargs={"stop": stop})
    loop.start()
    try:
        yield
    finally:
        stop.set()
        loop.join(60)


def wait_for_rows(table, rows, timeout=30.0):
    deadline = time.monotonic() + timeout
    while table.total_inserted < rows and time.monotonic() < deadline:
        time.sleep(0.05)
    return table.total_inserted


def test_actor_command_fills_the_served_table_and_pulls_weights(served_learner):
    server, table = served_learner
    cmd = [
        sys.executable,
        "-m",
        "replaygpu.cli",
        "actor",
        server.address,
        "--env",
        "CartPole-v1",
        "--steps",
        "400",
        "--num-envs",
        "4",
        "--weight-pull-interval",
        "100",
        "--num-actors",
        "2",
        "--actor-index",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "actor 1: 400 env steps" in proc.stderr
    assert "1 weight updates" in proc.stderr  # one version published, pulled once
    assert wait_for_rows(table, 400) == 400
    rows = table.gather(tf.range(400, dtype=tf.int64))
    assert set(np.unique(rows["action"].numpy())) <= {0, 1}
    assert np.all(rows["reward"].numpy() == 1.0)


def test_actor_process_collects_without_importing_tensorflow(served_learner):
    server, table = served_learner
    code = (
        "import sys\n"
        "from replaygpu.agents.distributed.actor import run_actor\n"
        "from replaygpu.agents.distributed.actor_config import ActorConfig\n"
        f"out = run_actor(ActorConfig(steps=200, num_envs=4), {server.address!r})\n"
        "print(int(out['env_steps']), int(out['weight_updates']), 'tensorflow' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["200", "1", "False"]
    assert wait_for_rows(table, 200) == 200


def test_actor_epsilons_follow_the_apex_ladder():
    eps = [ActorConfig(actor_index=i, num_actors=8).epsilon for i in range(8)]
    assert eps == pytest.approx([0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert ActorConfig(num_actors=1).epsilon == 0.4
    with pytest.raises(rg.ConfigError, match="actor_index: got 2"):
        ActorConfig(actor_index=2, num_actors=2)


def test_actor_fills_the_stream_field_and_sends_each_env_in_time_order():
    spec = dict(specs_from_env(gym.make("CartPole-v1")))
    spec["stream"] = tf.TensorSpec([], tf.int64, name="stream")
    table = rg.ReplayTable(spec, 1_000, name="replay")
    learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {"x": tf.zeros([])})
    with rg.serve(learner, "127.0.0.1:0") as server, training(server, learner):
        config = ActorConfig(steps=192, num_envs=3, actor_index=1, num_actors=2, send_interval=16)
        run_actor(config, server.address)
        assert wait_for_rows(table, 192) == 192
        rows = {k: v.numpy() for k, v in table.gather(tf.range(192, dtype=tf.int64)).items()}
    assert sorted(np.unique(rows["stream"])) == [3, 4, 5]  # actor 1 of 3 envs: 1 * 3 + env
    # Env-major batches of 16 steps: within a run of one stream, each row continues the last.
    same = rows["stream"][1:] == rows["stream"][:-1]
    ended = rows["terminated"][:-1] | rows["truncated"][:-1]
    follows = np.all(np.isclose(rows["next_obs"][:-1], rows["obs"][1:]), axis=1)
    assert same.sum() == 192 - 12  # 4 batches x 3 envs: 12 runs of 16 rows
    assert np.all(follows[same & ~ended])


def test_actor_calls_wait_out_a_learner_restart():
    from service_helpers import free_port

    from replaygpu.agents.distributed.actor import _retrying

    spec = specs_from_env(gym.make("CartPole-v1"))
    address = f"127.0.0.1:{free_port()}"
    server = rg.serve(rg.ReplayTable(spec, 100), address)
    client = rg.ReplayClient(address, actor_id="a")
    server.stop()
    restarted: list = []
    timer = threading.Timer(
        1.5, lambda: restarted.append(rg.serve(rg.ReplayTable(spec, 100), address))
    )
    timer.start()
    try:
        began = time.monotonic()
        info = _retrying(client.info, ActorConfig(retry_deadline_s=30), lambda: False)
        assert info.tables[0].capacity == 100 and time.monotonic() - began >= 1.0
        with pytest.raises(ServiceUnavailableError):  # past the deadline it gives up
            restarted[0].stop()
            _retrying(client.info, ActorConfig(retry_deadline_s=1), lambda: False)
    finally:
        timer.join()
        client.close(flush=False)
        for s in restarted:
            s.stop()


def test_a_learner_s_actor_settings_reach_the_actor_through_info_as_its_config():
    """The learner's actor config goes out as its agent's JSON document, which the server
    passes on unread, and comes back as the same config, every settings field included."""
    from replaygpu.agents.distributed.actor_config import SETTINGS_FIELDS

    frames = ActorConfig(
        env_id="ALE/Breakout-v5",
        epsilon_base=0.3,
        weight_pull_interval=1000,
        seed=7,
        num_actors=3,
        frame_stack=4,
        segment_steps=250,
        repeat_action_probability=0.0,
        terminal_on_life_loss=False,
        clip_rewards=False,
        send_interval=256,
        insert_slack=0,
    )
    recurrent = ActorConfig(env_id="CartPole-v1", sequence_period=4, sequence_length=8)
    vector = ActorConfig(env_id="Pendulum-v1", agent="sac", insert_slack=-1)
    table = rg.ReplayTable(specs_from_env(gym.make("CartPole-v1")), 16, name="replay")
    for agent, config in (("dqn", frames), ("r2d2", recurrent), ("sac", vector)):
        settings = config.to_settings(agent)
        with (
            rg.serve(table, actor_settings=settings) as server,
            rg.ReplayClient(server.address, actor_id="s1") as client,
        ):
            assert client.actor_settings == settings
            last = {"actor_index": config.num_actors - 1, "steps": 5}  # this actor's own
            actor = ActorConfig.from_settings(client.actor_settings, **last)
        assert actor == dataclasses.replace(config, **last)
        assert set(json.loads(settings.json)) == set(SETTINGS_FIELDS)


def test_actor_config_refuses_frames_for_a_policy_that_is_no_q_network():
    with pytest.raises(rg.ConfigError, match="agent: got 'sac' with frame_stack 4"):
        ActorConfig(env_id="ALE/Breakout-v5", agent="sac", frame_stack=4)
    with pytest.raises(rg.ConfigError, match="frame_stack: got -1"):
        ActorConfig(frame_stack=-1)
    with pytest.raises(rg.ConfigError, match="env_id: got an empty string"):
        ActorConfig(env_id="")


@pytest.mark.parametrize(
    "agent, version, says",
    [
        (
            "impala",
            1,
            "announces actor settings of agent 'impala' version 1: expected an agent of dqn, "
            "sac, r2d2",
        ),
        (
            "dqn",
            99,
            "announces actor settings of agent 'dqn' version 99: expected version 1 at most; "
            "the learner runs a newer replaygpu: upgrade replaygpu where the actors run",
        ),
    ],
)
def test_an_actor_refuses_settings_of_an_unknown_agent_or_a_newer_version_in_one_line(
    agent, version, says
):
    from replaygpu.service.config import AgentSettings

    table = rg.ReplayTable(specs_from_env(gym.make("CartPole-v1")), 16, name="replay")
    document = ActorConfig(env_id="CartPole-v1").to_settings(agent).json
    settings = AgentSettings(agent, version, document)
    with rg.serve(table, actor_settings=settings) as server:
        cmd = [sys.executable, "-m", "replaygpu.cli", "actor", server.address, "--steps", "8"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith("replaygpu actor: error: ")
    assert f"the learner at {server.address} {says}" in proc.stderr, proc.stderr
    assert table.total_inserted == 0
