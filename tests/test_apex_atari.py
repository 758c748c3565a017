"""Ape-X on Atari frames: the numpy Nature CNN against TensorFlow's, whole segments from
concurrent actors landing contiguously in one frame table (with the stacks the actors saw), and
a smoke run of ``demo apex-breakout`` with real ALE actor processes."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents import demos
from replaygpu.agents.distributed import learner
from replaygpu.agents.distributed.experience import (
    SegmentWriter,
    segment_client_config,
    send_segments,
)
from replaygpu.agents.dqn.config import ApexAtariConfig
from replaygpu.agents.networks import nature_cnn
from replaygpu.agents.policies import greedy_cnn_policy, nature_cnn_q_values
from replaygpu.agents.progress import NullRecorder
from replaygpu.agents.registry import ALGORITHMS, DEMOS
from replaygpu.samplers import make_frame_table

K = 4


def test_numpy_nature_cnn_matches_tensorflow_on_random_weights():
    net = nature_cnn((K, 84, 84), 6, seed=3)
    rng = np.random.default_rng(0)
    for v in net.weights:  # biases too, so every term of the layout is exercised
        v.assign(rng.uniform(-0.1, 0.1, v.shape).astype(np.float32))
    frames = rng.integers(0, 256, (5, K, 84, 84), dtype=np.uint8)
    expected = net(tf.constant(frames)).numpy()
    weights = [v.numpy() for v in net.weights]
    got = nature_cnn_q_values(weights, frames)
    assert got.shape == (5, 6) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(greedy_cnn_policy(weights)(frames), expected.argmax(axis=1))


def _play(actor: int, address: str, steps: int, cap: int, seen: dict) -> None:
    """Synthetic frames tagged (actor, frame id): random episode ends, segments cut at ``cap``;
    records the (obs, next_obs) stacks the actor saw at each step, keyed by the obs's newest
    frame."""
    rng = np.random.default_rng(actor)
    counter = iter(range(1, 1 << 24))

    def new_frame() -> np.ndarray:
        frame = rng.integers(0, 256, (84, 84), dtype=np.uint8)
        frame[0, 0], frame[0, 1:4] = (
            actor,
            np.frombuffer(next(counter).to_bytes(3, "big"), np.uint8),
        )
        return frame

    client = rg.ReplayClient(address, f"seg-{actor}", config=segment_client_config(cap))
    writer = SegmentWriter(K, cap)
    frame = new_frame()
    writer.start(frame)
    for _ in range(steps):
        obs = writer.stack
        frame = new_frame()
        terminated = bool(rng.random() < 0.02)
        writer.step(int(rng.integers(4)), 1.0, terminated, False, frame)
        seen[_tag(obs[-1])] = (obs, np.concatenate([obs[1:], frame[None]]))
        if terminated:
            frame = new_frame()
            writer.start(frame)
        if writer.steps_ready >= cap:
            send_segments(client, writer.take())
    writer.end()
    send_segments(client, writer.take())
    client.close()


def _tag(frame: np.ndarray) -> tuple[int, int]:
    return int(frame[0, 0]), int.from_bytes(frame[0, 1:4].tobytes(), "big")


def test_concurrent_actors_send_contiguous_segments_and_sampler_rebuilds_their_stacks():
    steps, cap = 600, 40
    table = make_frame_table(4096, (84, 84))
    seen: dict = {}
    with rg.serve(table) as server:
        threads = [
            threading.Thread(target=_play, args=(a, server.address, steps, cap, seen))
            for a in (1, 2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    size = table.size
    rows = tf.range(size, dtype=tf.int64)
    frames = table.read("frame", rows).numpy()
    first = table.read("first", rows).numpy()
    truncated = table.read("truncated", rows).numpy()
    tags = [_tag(f) for f in frames]
    assert {a for a, _ in tags} == {1, 2}
    switches = sum(tags[r][0] != tags[r - 1][0] for r in range(1, size))
    assert switches >= 3, "the actors' requests did not interleave; the test proves nothing"
    assert size > 2 * steps  # every step plus one final row per segment
    # inside a table episode the next row is the same actor's next frame
    for r in range(1, size):
        if not first[r]:
            assert tags[r] == (tags[r - 1][0], tags[r - 1][1] + 1), f"row {r} interleaved"
    # segments are cut at the cap as truncations, then continue at the same frame
    assert truncated.sum() >= 2 * (steps // cap) // 2
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(K), seed=0)
    drawn, batch = sampler.sample(512)
    obs, next_obs = batch["obs"].numpy(), batch["next_obs"].numpy()
    padded = 0
    for i in range(len(drawn)):
        want_obs, want_next = seen[_tag(obs[i, -1])]
        np.testing.assert_array_equal(obs[i], want_obs)
        np.testing.assert_array_equal(next_obs[i], want_next)
        padded += int((obs[i, 0] == obs[i, 1]).all())
    assert padded > 0  # stacks at segment starts were drawn too


def test_demo_apex_breakout_trains_with_actor_processes_and_cleans_up():
    pytest.importorskip("ale_py")
    _, config_cls = demos.demo_parser("apex-breakout")
    assert ALGORITHMS[DEMOS["apex-breakout"].algorithm].module == learner.__name__
    assert config_cls is ApexAtariConfig
    config = ApexAtariConfig(
        steps=400,
        num_actors=2,
        segment_steps=100,
        weight_pull_interval=100,
        buffer_size=2000,
        learning_starts=200,
        batch_size=8,
        samples_per_insert=1.0,
        steps_per_call=4,
        target_update_interval=8,
        eval_episodes=1,
        jit_compile="off",
    )
    recorder = NullRecorder()
    result = learner.train(config, recorder)
    assert result.env_steps == 400
    assert recorder.last_metrics["charts/rows_acked"] >= 400  # plus one final row a segment
    assert result.sgd_steps * config.batch_size >= config.samples_per_insert * 200
    assert np.isfinite(recorder.last_metrics["losses/td_loss"])
    assert result.eval_returns.shape == (1,) and np.isfinite(result.eval_returns).all()
    assert not mp.active_children()


def test_the_actor_command_joins_a_frame_learner_with_only_its_address():
    """The frame settings travel in Info: `replaygpu actor ADDRESS` plays the learner's ALE
    game into its frame table, each env's table episodes whole and contiguous; a flag
    overrides a setting (2 envs where the learner asks for 1)."""
    pytest.importorskip("ale_py")
    from replaygpu.agents.distributed.actor_config import ActorConfig

    settings = ActorConfig(
        env_id="ALE/Breakout-v5", seed=5, frame_stack=K, segment_steps=40, clip_rewards=False
    ).to_settings("dqn")
    table = make_frame_table(2000, (84, 84))
    with rg.serve(table, actor_settings=settings) as server:
        cmd = [sys.executable, "-m", "replaygpu.cli", "actor", server.address]
        out = subprocess.run(
            [*cmd, "--steps", "300", "--num-envs", "2"], capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert "actor 0: 300 env steps" in out.stderr, out.stderr[-3000:]
        size = table.size
    rows = tf.range(size, dtype=tf.int64)
    first, final = table.read("first", rows).numpy(), table.read("final", rows).numpy()
    truncated = table.read("truncated", rows).numpy()
    assert size == 300 + final.sum()  # every env step, plus one final row per table episode
    assert first[0] and np.array_equal(first[1:], final[:-1])  # episodes whole, back to back
    lengths = np.diff(np.flatnonzero(first)) - 1  # steps of each table episode but the last
    assert lengths.max() <= 40 and truncated.sum() >= 1  # cut at segment_steps as truncations


def test_the_demo_actors_run_the_settings_the_actor_command_gets_from_the_learner():
    """`replaygpu actor ADDRESS` against the learner and ``demo apex-breakout`` run the same
    actor config (send interval and insert slack included): only the id prefix, which no
    setting carries, differs."""
    from replaygpu.agents.distributed.actor_config import ActorConfig
    from replaygpu.agents.distributed.fleet import actor_configs

    config = ApexAtariConfig(num_actors=2, insert_slack=512)
    settings = config.actor_settings  # the document Info carries
    demos = actor_configs(config, settings, steps=config.steps)
    assert [d.steps for d in demos] == [config.steps // 2] * 2
    for index, demo in enumerate(demos):
        command = ActorConfig.from_settings(settings, actor_index=index, steps=demo.steps)
        assert command == dataclasses.replace(demo, actor_id_prefix="")
        assert (demo.send_interval, demo.insert_slack, demo.num_envs) == (256, 512, 1)


def test_the_frame_actor_and_its_row_maker_import_no_tensorflow():
    code = (
        "import sys\n"
        "import replaygpu as rg\n"
        "from replaygpu.agents.distributed import actor, experience\n"
        "from replaygpu.frames import frame_rows\n"
        "rg.ReplayClient, actor.run_actor, experience.FrameExperience\n"
        "print('tensorflow' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
