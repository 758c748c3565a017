"""Atari DQN smoke test (CI): a few hundred real ALE steps into a frame table, the Nature CNN's
shapes, finite losses, SGD steps taken, and a stop / resume round trip through checkpoints."""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from run_files import save_run_lacking

import replaygpu as rg
from replaygpu.agents import demos
from replaygpu.agents.distributed.experience import SegmentWriter
from replaygpu.agents.dqn import atari
from replaygpu.agents.envs import FireToLaunch, make_atari_env
from replaygpu.agents.networks import nature_cnn
from replaygpu.agents.progress import NullRecorder
from replaygpu.agents.runs import RunControl
from replaygpu.samplers import make_frame_table

pytest.importorskip("ale_py")

STEPS, LEARNING_STARTS, TRAIN_FREQ = 300, 100, 4


def small_config(**overrides) -> atari.AtariDQNConfig:
    values = dict(
        steps=STEPS,
        learning_starts=LEARNING_STARTS,
        buffer_size=1000,
        target_update_interval=40,
        eval_episodes=1,
        report_interval=20,
        jit_compile="off",
    )
    return atari.AtariDQNConfig(**{**values, **overrides})


def test_preprocessed_env_gives_84x84_uint8_frames_and_lives():
    env = make_atari_env("ALE/Breakout-v5", seed=0)
    frame, info = env.reset(seed=0)
    assert frame.shape == (84, 84) and frame.dtype == np.uint8
    assert info["lives"] == 5 and env.action_space.n == 4
    env.close()
    with pytest.raises(rg.ConfigError, match="expected an ALE game id"):
        make_atari_env("CartPole-v1", seed=0)


def test_breakout_launches_the_ball_itself_so_a_policy_that_never_fires_loses_its_lives():
    def lives_lost_by_noops(env, steps=3000):
        _, info = env.reset(seed=0)
        start = info["lives"]
        for _ in range(steps):
            _, _, terminated, truncated, info = env.step(0)  # NOOP, never FIRE
            if terminated or truncated:
                break
        return start - info["lives"]

    env = make_atari_env("ALE/Breakout-v5", seed=0)
    assert isinstance(env, FireToLaunch)
    assert lives_lost_by_noops(env) == 5  # every life launched, missed, and the game over
    assert lives_lost_by_noops(env.env, steps=500) == 0  # unwrapped: the ball never comes
    env.close()


def test_nature_cnn_maps_uint8_stacks_to_action_values():
    net = nature_cnn((4, 84, 84), 6, seed=0)
    shapes = [tuple(v.shape) for v in net.weights]
    assert shapes[:6] == [(8, 8, 4, 32), (32,), (4, 4, 32, 64), (64,), (3, 3, 64, 64), (64,)]
    assert shapes[6:] == [(3136, 512), (512,), (512, 6), (6,)]
    out = net(tf.zeros([2, 4, 84, 84], tf.uint8))
    assert out.shape == (2, 6) and out.dtype == tf.float32


def test_frame_writer_ends_a_table_episode_on_a_lost_life_and_keeps_the_stack_padded():
    writer = SegmentWriter(stack=4)
    frames = [np.full((84, 84), i, np.uint8) for i in range(6)]
    writer.start(frames[0])
    writer.step(1, 1.0, False, False, frames[1])
    writer.step(2, 0.0, True, False, frames[2])  # a lost life: terminal for training
    writer.start(frames[2])
    assert [int(f[0, 0]) for f in writer.stack] == [2, 2, 2, 2]
    writer.step(3, -1.0, False, False, frames[3])
    rows = writer.take_rows()
    # 2 steps + final row, then 1 step of the next table episode (its next frame comes later)
    assert rows["frame"][:, 0, 0].tolist() == [0, 1, 2, 2]
    assert rows["first"].tolist() == [True, False, False, True]
    assert rows["final"].tolist() == [False, False, True, False]
    assert rows["terminated"].tolist() == [False, True, False, False]
    writer.step(0, 0.0, False, False, frames[4])
    assert writer.take_rows()["frame"][:, 0, 0].tolist() == [3]


class StopAt(NullRecorder):
    """Sets the run's stop event once training passes ``env_steps`` (like SIGTERM)."""

    def __init__(self, run: RunControl, env_steps: int) -> None:
        super().__init__()
        self.run, self.at = run, env_steps

    def progress(self, env_steps: int, sgd_steps: int, recent_return: float) -> None:
        if env_steps >= self.at:
            self.run.stop.set()


def test_atari_dqn_trains_on_breakout_stops_resumes_and_evaluates(tmp_path):
    config = small_config()
    ckpt = str(tmp_path / "checkpoints")
    run = RunControl(ckpt, 3600.0, config)
    recorder = StopAt(run, 200)
    first = atari.train(config, recorder, run)
    assert first.stopped and first.env_steps == 200
    assert first.sgd_steps == (200 - LEARNING_STARTS) // TRAIN_FREQ
    loss = recorder.last_metrics["losses/td_loss"]
    assert np.isfinite(loss) and np.isfinite(recorder.last_metrics["losses/q_values"])

    recorder = NullRecorder()
    result = atari.train(config, recorder, RunControl(ckpt, 3600.0, config))
    assert not result.stopped and result.env_steps == STEPS
    # the same SGD steps as an uninterrupted run: one per chunk past learning_starts
    assert result.sgd_steps == (STEPS - LEARNING_STARTS) // TRAIN_FREQ
    assert np.isfinite(recorder.last_metrics["losses/td_loss"])
    assert result.eval_returns.shape == (1,) and np.isfinite(result.eval_returns).all()

    assert demos.run_eval(argparse.Namespace(path=ckpt, episodes=1, seed=0)) == 0
    # the command, to its exit: no ALE object outlives its finalizer ("nanobind: leaked ...")
    done = subprocess.run(
        [sys.executable, "-m", "replaygpu.cli", "eval", ckpt, "--episodes", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "greedy evaluation on ALE/Breakout-v5 over 1 episodes" in done.stdout
    assert "leaked" not in done.stderr, done.stderr[-2000:]


def test_frame_stack_sampler_feeds_uint8_stacks_of_real_frames():
    config = small_config(buffer_size=500)
    env = make_atari_env(config.env_id, seed=0)
    table = make_frame_table(config.buffer_size)
    writer = SegmentWriter(config.frame_stack)
    frame, _ = env.reset(seed=0)
    writer.start(frame)
    for _ in range(64):
        frame, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        writer.step(0, float(np.sign(reward)), terminated, truncated, frame)
        if terminated or truncated:
            frame, _ = env.reset()
            writer.start(frame)
    env.close()
    table.append(writer.take_rows())
    _, batch = rg.Sampler(table, rg.Uniform(), rg.FrameStack(4), seed=0).sample(32)
    assert batch["obs"].shape == (32, 4, 84, 84) and batch["obs"].dtype == tf.uint8
    assert batch["next_obs"].shape == (32, 4, 84, 84)
    np.testing.assert_array_equal(batch["obs"][:, 1:], batch["next_obs"][:, :-1])


def test_config_rejects_a_buffer_too_small_for_stacks():
    with pytest.raises(rg.ConfigError, match="buffer_size: got 6"):
        small_config(buffer_size=6)


def test_atari_dqn_trains_on_n_step_returns_from_the_frame_table():
    recorder = NullRecorder()
    result = atari.train(small_config(steps=200, n_step=3, eval_episodes=1), recorder)
    assert result.sgd_steps == (200 - LEARNING_STARTS) // TRAIN_FREQ
    assert np.isfinite(recorder.last_metrics["losses/td_loss"])


def test_a_run_saved_without_a_config_field_is_refused_not_guessed(tmp_path):
    """A run.json that lacks a field of the config (written by an older version) is another
    run: resuming it is refused with the field named, whatever value is given."""
    ckpt = str(tmp_path / "checkpoints")
    save_run_lacking(ckpt, small_config(), "n_step")

    for n_step in (1, 3):
        with pytest.raises(rg.ConfigError, match=rf"n_step: saved '\(none\)', given {n_step}"):
            RunControl(ckpt, 3600.0, small_config(n_step=n_step))
