"""An actor's life against a real replay server on 127.0.0.1: it ends with the learner's run
(``run_finished`` in an ack or in ``Info``), reports its finished episodes, says in one line
that an address is dead (``--wait`` waits instead), logs an outage once when it begins and once
when it ends, and logs its progress."""

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from service_helpers import free_port

import replaygpu as rg
from replaygpu.agents.distributed.actor import run_actor
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.samplers import make_frame_table
from replaygpu.service.actor.connection import Outage
from replaygpu.service.server.loop import step as learner_step
from replaygpu.specs import specs_from_env

CARTPOLE = specs_from_env(gym.make("CartPole-v1"))


def cartpole_table(capacity=50_000):
    return rg.ReplayTable(CARTPOLE, capacity, name="replay", device="/CPU:0")


def cartpole_rows(n):
    return {
        "obs": np.zeros((n, 4), np.float32),
        "action": np.zeros(n, np.int64),
        "reward": np.ones(n, np.float32),
        "next_obs": np.zeros((n, 4), np.float32),
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
    }


def actor_command(address, *flags):
    return [sys.executable, "-m", "replaygpu.cli", "actor", address, *flags]


@contextlib.contextmanager
def running(cmd, log_path):
    """``cmd`` started with its stderr in ``log_path``; killed at the end if still running."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def settled(table, for_s=1.0):
    """Whether no row came into ``table`` for ``for_s`` seconds."""
    before = table.total_inserted
    time.sleep(for_s)
    return table.total_inserted == before


def episode_reports():
    """A list of ``(return, length)`` and the `run_actor` report function that fills it."""
    reported = []

    def report(kind, index, payload):
        if kind == "episode":
            reported.append(payload[1:])  # (env_steps, return, length)

    return reported, report


def wait_until(condition, timeout=60.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_run_finished_in_the_acks_ends_the_actor_command_with_exit_0(tmp_path):
    """Two actor processes collecting until told otherwise (``--steps`` 0) both stop when the
    server finishes the run, and the command exits 0; one started after the end exits 0 at
    once, sending nothing."""
    table = cartpole_table()
    with rg.serve(table) as server:
        cmd = actor_command(server.address, "--env", "CartPole-v1", "--num-envs", "2")
        with running([*cmd, "--num-actors", "2"], tmp_path / "actors.log") as proc:
            wait_until(lambda: table.total_inserted >= 2_000, what="rows from both actors")
            server.finish_run()
            assert proc.wait(60) == 0, (tmp_path / "actors.log").read_text()[-3000:]
        log = (tmp_path / "actors.log").read_text()
        assert log.count("the learner's run is finished; stopping") == 2, log
        inserted = table.total_inserted
        late = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert late.returncode == 0, late.stderr[-3000:]
        assert "actor 0: 0 env steps" in late.stderr
        assert table.total_inserted == inserted


def test_run_finished_in_info_ends_an_actor_waiting_for_insert_room():
    """An actor that the rate limiter holds back sends nothing and so gets no acks: it learns
    that the run is over from the ``Info`` replies it polls while it waits."""
    table = cartpole_table(5_000)
    limiter = rg.SampleToInsertRatio(1.0, min_size_to_sample=100, error_buffer=10)
    learner = rg.Learner(
        table, rg.Sampler(table, seed=0), lambda b: {"x": tf.zeros([])}, rate_limiter=limiter
    )
    learner.train(0)  # traced now, so the first commit comes at once
    config = ActorConfig(num_envs=2, send_interval=50, insert_slack=0, progress_interval_s=0)
    out: list = []
    with rg.serve(learner) as server:
        stop = threading.Event()

        def commit():  # the training loop's commits, without training: nothing is sampled
            while not stop.is_set():
                learner_step(server, learner, 0)
                time.sleep(0.01)

        committer = threading.Thread(target=commit)
        committer.start()
        actor = threading.Thread(target=lambda: out.append(run_actor(config, server.address)))
        actor.start()
        try:
            # the actor runs ahead of its acks, then waits: nothing is sampled
            wait_until(lambda: settled(table), what="the actor to wait for insert room")
            assert actor.is_alive() and table.total_inserted > 100
            client = rg.ReplayClient(server.address, actor_id="watcher")
            assert not client.run_finished and not client.info().run_finished
            server.finish_run()
            assert not client.run_finished  # nothing asked since
            client.info()
            assert client.run_finished  # told by Info
            client.close()
            actor.join(30)
            assert not actor.is_alive()
        finally:
            stop.set()
            committer.join(30)
    assert out[0]["run_finished"] == 1.0
    assert out[0]["acked_transitions"] == table.total_inserted


def test_the_client_learns_the_run_is_finished_from_an_ack():
    table = cartpole_table(100)
    rows = cartpole_rows(3)
    with rg.serve(table) as server, rg.ReplayClient(server.address, actor_id="a") as client:
        client.add_batch(rows)
        client.flush(30)
        assert not client.run_finished
        server.finish_run()
        client.add_batch(rows)
        client.flush(30)  # acknowledged without being inserted
        assert client.run_finished
        assert table.total_inserted == 3 and client.acked_transitions == 3


def test_a_resent_request_carries_its_episodes_to_the_server_that_commits_it():
    """A learner that stops with the request staged answers it UNAVAILABLE; the client resends
    it, episodes included, to the learner that comes back, which counts them once."""
    address = f"127.0.0.1:{free_port()}"
    table = cartpole_table(100)
    learner = rg.Learner(table, rg.Sampler(table, seed=0), lambda b: {"x": tf.zeros([])})
    first = rg.serve(learner, address)  # no training loop: nothing is committed
    client = rg.ReplayClient(address, actor_id="a")
    try:
        with pytest.raises(rg.ConfigError, match="episode length: got -1"):
            client.report_episode(1.0, -1)
        client.report_episode(21.0, 21)
        client.report_episode(-3.5, 7)
        client.add_batch(cartpole_rows(3))
        with pytest.raises(TimeoutError):
            client.flush(1.0)  # staged, not acknowledged
        first.stop()
        assert first.run_stats.values()["episodes"] == 0
        with rg.serve(cartpole_table(100), address) as second:  # a bare table commits at once
            client.flush(30)
            stats = second.run_stats.values()
    finally:
        first.stop()
        client.close(flush=False)
    assert (stats["episodes"], stats["mean_return"], stats["mean_length"]) == (2, 8.75, 14)
    assert client.acked_transitions == 3


def test_vector_actors_report_their_episodes_to_the_server():
    table = cartpole_table(5_000)
    reported, report = episode_reports()
    with rg.serve(table) as server:
        config = ActorConfig(steps=600, num_envs=3, progress_interval_s=0)
        result = run_actor(config, server.address, report=report)
        stats = server.run_stats.values()
    assert result["episodes"] == len(reported) == stats["episodes"] > 10
    returns, lengths = np.array(reported).T
    assert stats["mean_return"] == pytest.approx(returns.mean())
    assert stats["mean_length"] == pytest.approx(lengths.mean())
    assert np.array_equal(returns, lengths)  # CartPole: +1 per step


def test_frame_actors_report_whole_games_with_unclipped_returns():
    """A frame actor ends a table episode at each lost life, but reports each whole game, with
    its return as the game scored it (the rows carry the clipped reward)."""
    pytest.importorskip("ale_py")
    table = make_frame_table(8_000, (84, 84))
    config = ActorConfig(
        env_id="ALE/Breakout-v5",
        frame_stack=4,
        num_envs=2,
        steps=2_400,
        repeat_action_probability=0.0,
        progress_interval_s=0,
    )
    reported, report = episode_reports()
    with rg.serve(table) as server:
        run_actor(config, server.address, report=report)
        stats = server.run_stats.values()
        size = table.size
    rows = tf.range(size, dtype=tf.int64)
    terminated = table.read("terminated", rows).numpy().sum()
    assert stats["episodes"] == len(reported) >= 1
    assert terminated >= 5 * len(reported)  # 5 lives per game, each a table episode
    returns, lengths = np.array(reported).T
    assert stats["mean_return"] == pytest.approx(returns.mean())
    assert stats["mean_length"] == pytest.approx(lengths.mean())


def test_a_dead_address_fails_in_one_line_within_5_s():
    address = f"127.0.0.1:{free_port()}"
    began = time.monotonic()
    proc = subprocess.run(actor_command(address), capture_output=True, text=True, timeout=60)
    took = time.monotonic() - began
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"replaygpu actor: error: ServiceUnavailableError: cannot reach {address} (connection "
        "refused); is the learner running? pass --wait to keep retrying"
    ]
    assert took < 5.0


def test_wait_keeps_retrying_until_the_server_comes_up(tmp_path):
    port = free_port()
    address = f"127.0.0.1:{port}"
    cmd = actor_command(address, "--wait", "--env", "CartPole-v1", "--num-envs", "2")
    with running(cmd, tmp_path / "actor.log") as proc:
        time.sleep(4.0)
        assert proc.poll() is None  # still waiting, past the 1 s a plain start is given
        table = cartpole_table()
        with rg.serve(table, address) as server:
            wait_until(lambda: table.total_inserted > 0, what="rows after the server came up")
            server.finish_run()
            assert proc.wait(60) == 0
    log = (tmp_path / "actor.log").read_text()
    assert log.count(f"cannot reach {address} (connection refused); waiting for it") == 1, log
    limited = actor_command(address, "--wait=1", "--env", "CartPole-v1")
    began = time.monotonic()
    gave_up = subprocess.run(limited, capture_output=True, text=True, timeout=60)
    assert gave_up.returncode == 2 and time.monotonic() - began < 10
    assert "ServiceUnavailableError" in gave_up.stderr.splitlines()[-1]


def test_an_outage_logs_one_line_when_it_begins_and_one_when_it_ends(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    first, second = cartpole_table(), cartpole_table()
    cmd = actor_command(
        address, "--env", "CartPole-v1", "--num-envs", "2", "--weight-pull-interval", "20"
    )
    server = rg.serve(first, address)
    try:
        with running(cmd, tmp_path / "actor.log") as proc:
            wait_until(lambda: first.total_inserted > 0, what="rows before the outage")
            server.stop()
            log = tmp_path / "actor.log"
            wait_until(lambda: " unavailable (" in log.read_text(), what="the outage's line")
            time.sleep(4.0)  # retrying: the stream and the weight pulls fail over and over
            assert proc.poll() is None
            server = rg.serve(second, address)
            wait_until(lambda: second.total_inserted > 0, what="rows after the outage")
            server.finish_run()
            assert proc.wait(60) == 0
    finally:
        server.stop()
    log = (tmp_path / "actor.log").read_text()
    began = re.findall(rf"server {address} unavailable \((.*)\); retrying for up to 60 s", log)
    ended = re.findall(rf"server {address} available again after ([0-9.]+) s", log)
    assert len(began) == 1 and len(ended) == 1, log
    assert 3.5 < float(ended[0]) < 30
    assert "retrying in" not in log


def test_a_reply_to_a_call_made_before_an_outage_does_not_end_it(caplog):
    """A server going down still acks on a stream opened before and answers calls in flight
    after it refuses new connections: such a reply ends no outage (the log would say "available
    again after 0.0 s", then a second outage); a call made after the outage began ends it."""
    outage = Outage("127.0.0.1:1", retry_deadline_s=60.0)
    before = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="replaygpu.service.actor.connection"):
        outage.failed(ConnectionRefusedError("connection refused"))
        outage.recovered(before, stream=True)  # an ack on the stream opened before
        outage.recovered(before)  # a GetWeights sent before
        assert outage.since is not None
        outage.failed(ConnectionRefusedError("it stopped"), stream=True)  # the same outage
        outage.recovered(time.monotonic(), stream=True)  # a new stream's ack
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "unavailable (connection refused)" in lines[0], lines
    assert "available again after" in lines[1] and outage.since is None


def test_the_actor_logs_its_progress_every_interval(caplog):
    table = cartpole_table(5_000)
    config = ActorConfig(num_envs=2, progress_interval_s=0.2)
    stop = threading.Event()
    with (
        rg.serve(table) as server,
        caplog.at_level(logging.INFO, "replaygpu.agents.distributed.actor"),
    ):
        timer = threading.Timer(1.5, stop.set)
        timer.start()
        result = run_actor(config, server.address, stop=stop)
        timer.join()
    line = re.compile(
        r"actor 0: (\d+) env steps \((\d+)/s\), (\d+) episodes, last return ([0-9.]+), "
        r"(\d+) transitions acked"
    )
    found = [m.groups() for m in map(line.fullmatch, caplog.messages) if m]
    assert 4 <= len(found) <= 8, caplog.messages
    steps = [int(f[0]) for f in found]
    assert steps == sorted(steps) and steps[-1] <= result["env_steps"]
    assert all(int(f[1]) > 0 for f in found)
    assert int(found[-1][2]) <= result["episodes"]
    with pytest.raises(rg.ConfigError, match="progress_interval_s: got -1"):
        ActorConfig(progress_interval_s=-1)


def test_a_learner_run_ends_its_actor_command_and_counts_their_episodes(tmp_path):
    """`replaygpu learner --steps N` and `replaygpu actor ADDRESS` (no --steps of its own):
    the learner's budget ends both, with exit 0, and the learner counted the actors'
    episodes."""
    address = f"127.0.0.1:{free_port()}"
    learner_cmd = [
        sys.executable, "-m", "replaygpu.cli", "learner", "--agent", "dqn", "--env",
        "CartPole-v1", "--address", address, "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--steps", "3000", "--learning-starts", "500", "--samples-per-insert", "2",
        "--batch-size", "32", "--steps-per-call", "16", "--hidden-sizes", "32,32",
        "--no-jit-compile",
    ]  # fmt: skip
    with (
        running(learner_cmd, tmp_path / "learner.log") as learner,
        running(actor_command(address, "--wait"), tmp_path / "actors.log") as actors,
    ):
        assert actors.wait(300) == 0, (tmp_path / "actors.log").read_text()[-3000:]
        assert learner.wait(120) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    log = (tmp_path / "actors.log").read_text()
    assert log.count("the learner's run is finished; stopping") == 2, log
    # the learner counted the episodes of the batches it committed, not those of the batches
    # that came after the end (each actor runs up to --insert-slack 2048 rows ahead)
    sent = sum(int(n) for n in re.findall(r"actor \d: \d+ env steps .*?, (\d+) episodes", log))
    counted = re.findall(r"of (\d+) episodes\)", (tmp_path / "learner.log").read_text())
    assert counted and 0.25 * sent <= int(counted[-1]) <= sent, (sent, counted)


def test_sigterm_to_the_whole_process_group_stops_the_actors_cleanly(tmp_path):
    """SIGTERM to the actor command's whole process group (`timeout`, `kill -- -PGID`,
    systemd's default KillMode) reaches the actor processes too: they flush what they
    collected and exit 0, as on Ctrl-C, and the command exits 0."""
    table = cartpole_table()
    with rg.serve(table) as server:
        cmd = actor_command(server.address, "--env", "CartPole-v1", "--num-actors", "2")
        with open(tmp_path / "actors.log", "w") as log:
            proc = subprocess.Popen(cmd, stderr=log, start_new_session=True)
        try:
            wait_until(lambda: table.total_inserted >= 2_000, what="rows from both actors")
            os.killpg(proc.pid, signal.SIGTERM)
            rc = proc.wait(60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        text = (tmp_path / "actors.log").read_text()
        assert rc == 0, text[-3000:]
        assert "failed" not in text and len(re.findall(r"actor \d: \d+ env steps in", text)) == 2
        assert settled(table)
