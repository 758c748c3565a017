"""R2D2 served: ``replaygpu learner --agent r2d2`` and ``replaygpu actor ADDRESS`` (issue 25).

The actor learns everything from the learner (env, the LSTM policy's weights, the sequence
length and period); it sends each env step once, in blocks of one env's steps with the LSTM state
it carried; the learner trains on windows of them; SIGTERM checkpoints and a restart on the same
folder continues the SGD steps.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from process_helpers import ENV, cli, reap, wait_for_line

import replaygpu as rg
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.agents.r2d2.experience import (
    BLOCK_SEQUENCES,
    BLOCK_START,
    STATE_FIELD,
    STATE_STORED,
    RecurrentExperience,
    StepBlockWriter,
)
from replaygpu.service.config import AgentSettings
from replaygpu.specs import host_spec, specs_from_env

LENGTH, PERIOD, UNITS = 12, 4, 16


def run_actor(address: str, steps: int) -> str:
    """``replaygpu actor ADDRESS --steps N``: nothing else from the command line."""
    actor = subprocess.run(
        cli("actor", address, "--steps", str(steps)),
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
    )
    assert actor.returncode == 0, actor.stderr[-3000:]
    assert f"actor 0: {steps} env steps" in actor.stderr, actor.stderr[-3000:]
    return actor.stderr


def wait_for_sgd_steps(address: str, above: int, timeout_s: float = 120.0) -> rg.ReplayClient:
    """Poll the learner's ``Info`` until it took more than ``above`` SGD steps; returns it."""
    deadline = time.monotonic() + timeout_s
    with rg.ReplayClient(address, actor_id="probe") as client:
        while True:
            info = client.info()
            if info.learner_steps > above:
                return info
            assert time.monotonic() < deadline, f"SGD steps stayed at {info.learner_steps}"
            time.sleep(0.5)


def stop(learner: subprocess.Popen, lines: list[str]) -> int:
    """SIGTERM the learner; it exits 0 after a final checkpoint; returns that SGD step."""
    learner.send_signal(signal.SIGTERM)
    _, rest = learner.communicate(timeout=120)
    lines.append(rest)
    log = "".join(lines)
    assert learner.returncode == 0, log[-3000:]
    final = re.search(r"final checkpoint \S+ \(SGD step (\d+)\)", log)
    assert final, log[-3000:]
    return int(final.group(1))


def stored_table(folder: str) -> dict[str, np.ndarray]:
    """The table's filled rows as the newest checkpoint in ``folder`` holds them."""
    path = tf.train.latest_checkpoint(folder)
    size = int(tf.train.load_variable(path, "table/size_var/.ATTRIBUTES/VARIABLE_VALUE"))
    return {
        name: tf.train.load_variable(path, f"table/storage/{name}/.ATTRIBUTES/VARIABLE_VALUE")[
            :size
        ]
        for name in ("obs", "terminated", "truncated", STATE_FIELD, STATE_STORED, BLOCK_START)
    }


def test_step_block_writer_stores_each_step_once_in_blocks_ended_by_the_episode_or_the_cap():
    writer = StepBlockWriter(period=2, max_rows=5)
    # an episode of 8 steps (the last terminal), then 3 steps of the next one, then the end
    for t in range(11):
        done = t == 7
        state = np.full(2, t, np.float32)
        writer.add((np.array([t], np.float32), 0, 1.0, done, False, state), done)
    assert writer.steps_ready == 8  # the open block is not ready before its end
    writer.end()
    blocks = writer.take()
    assert [b["obs"][:, 0].tolist() for b in blocks] == [[0, 1, 2, 3, 4], [5, 6, 7], [8, 9, 10]]
    for b in blocks:  # every row holds the state before its step
        np.testing.assert_array_equal(b[STATE_FIELD][:, 0], b["obs"][:, 0])
        assert b[BLOCK_START].tolist() == [True] + [False] * (len(b["obs"]) - 1)
    # stored: every 2nd step of an episode from its first, and each block's first row
    assert [b[STATE_STORED].tolist() for b in blocks] == [
        [True, False, True, False, True],
        [True, True, False],  # episode steps 5, 6, 7: cut at the cap, so step 5 is stored too
        [True, False, True],  # the next episode's steps 0, 1, 2
    ]
    assert writer.steps_ready == 0 and not writer.blocks


def test_a_period_longer_than_the_sequence_is_refused_naming_it():
    with pytest.raises(rg.ConfigError, match=r"^sequence_period: got 9 with sequence_length 8"):
        ActorConfig(sequence_period=9, sequence_length=8)


def test_a_recurrent_actor_refuses_a_table_without_the_state_field():
    config = ActorConfig(env_id="CartPoleNoVelocity-v1", sequence_period=4, sequence_length=8)
    experience = RecurrentExperience(config)
    spec = host_spec(specs_from_env(gym.make("CartPoleNoVelocity-v1")))
    try:
        with pytest.raises(rg.ConfigError, match=f"writes the LSTM state to '{STATE_FIELD}'"):
            experience.start(0, spec)
    finally:
        experience.close()


def test_r2d2_learner_trains_on_an_actor_with_only_the_address_and_resumes(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    learner_cmd = cli(
        "learner", "--agent", "r2d2", "--env", "CartPoleNoVelocity-v1",
        "--address", "127.0.0.1:0", "--checkpoint-dir", ckpt, "--steps", "0",
        "--sequence-length", str(LENGTH), "--burn-in", "4", "--period", str(PERIOD),
        "--lstm-units", str(UNITS), "--torso-size", "16", "--batch-size", "16",
        "--steps-per-call", "8", "--learning-starts", "300", "--buffer-size", "30000",
        "--num-actors", "1", "--checkpoint-every-s", "3600",
    )  # fmt: skip
    learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    try:
        address = wait_for_line(learner, r"serving at (\S+);", lines).group(1)
        run_actor(address, 1500)
        info = wait_for_sgd_steps(address, 0)
        document = info.actor_settings
        assert document.agent == "r2d2"
        settings = ActorConfig.from_settings(
            AgentSettings(document.agent, document.version, document.json)
        )
        assert (settings.env_id, settings.sequence_length, settings.sequence_period) == (
            "CartPoleNoVelocity-v1",
            LENGTH,
            PERIOD,
        )
        first_steps = stop(learner, lines)
    finally:
        reap(learner)

    rows = stored_table(ckpt)
    assert len(rows["obs"]) == 1500  # each env step stored once
    starts = np.flatnonzero(rows[BLOCK_START])
    ends = np.append(starts[1:], len(rows["obs"]))
    assert starts[0] == 0 and np.all(ends - starts <= BLOCK_SEQUENCES * LENGTH)
    done = rows["terminated"] | rows["truncated"]
    episode_blocks = 0
    for a, b in zip(starts, ends, strict=True):
        assert not done[a : b - 1].any()  # a block is one env's steps of one episode
        if not rows[STATE_FIELD][a].any():  # it starts an episode: the zero state
            stored = np.flatnonzero(rows[STATE_STORED][a:b])
            np.testing.assert_array_equal(stored, np.arange(0, b - a, PERIOD))
            episode_blocks += 1
    assert episode_blocks > 10
    # the actor carried the LSTM state of the learner's network (h, c of UNITS units)
    assert rows[STATE_FIELD].shape[1] == 2 * UNITS
    assert np.abs(rows[STATE_FIELD][rows[STATE_STORED]]).max() > 0.01

    # Restart on the same folder: the run continues from its SGD step; SIGTERM again.
    learner = subprocess.Popen(learner_cmd, stderr=subprocess.PIPE, text=True, env=ENV)
    lines = []
    try:
        resumed = wait_for_line(learner, r"(\d+) transitions inserted, SGD step (\d+)", lines)
        assert int(resumed.group(1)) == len(rows["obs"])
        assert int(resumed.group(2)) == first_steps
        address = wait_for_line(learner, r"serving at (\S+);", lines).group(1)
        run_actor(address, 500)
        wait_for_sgd_steps(address, first_steps)
        assert stop(learner, lines) > first_steps
    finally:
        reap(learner)
