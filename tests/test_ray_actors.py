"""Actors as Ray actors on a local Ray instance: they stream CartPole into a real server on
loopback, one is killed and Ray brings it back under the same actor id, and the counts are
exact; the `replaygpu actor --ray` command stops cleanly on SIGTERM; a missing ray is one
clear error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import ray
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents.distributed.actor_config import ActorConfig
from replaygpu.agents.distributed.fleet import ACTOR_THREAD_ENV
from replaygpu.agents.distributed.ray_actors import start_ray_actors
from replaygpu.agents.distributed.ray_start import init_ray
from replaygpu.specs import specs_from_env

NUM_ENVS = 4
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}


def processes(where):
    """Live processes ``(pid, ppid, session, name)`` that ``where`` accepts (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        state, ppid, _, session = text[text.rindex(")") + 2 :].split()[:4]
        row = (int(stat.parent.name), int(ppid), int(session), name)
        if state != "Z" and where(row):
            found.append(row)
    return found


def descendants(pid):
    """Live processes below ``pid``."""
    rows = processes(lambda row: True)
    below, frontier = [], {pid}
    while frontier:
        children = [r for r in rows if r[1] in frontier]
        below += children
        frontier = {r[0] for r in children}
    return below


@pytest.fixture()
def local_ray():
    """A local two-CPU Ray instance (started as the fleet starts one: a start-up that times out
    on a loaded machine is tried again); after the test, Ray is shut down and none of its
    processes is left.

    Only processes started since the fixture began count: helpers that earlier tests started
    in this pytest process live until it exits (multiprocessing's resource tracker, started by
    the first ``spawn`` queue, is one) and are not Ray's."""
    before = {row[0] for row in descendants(os.getpid())}
    init_ray(ray, None, num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()

    def left() -> list[tuple[int, int, int, str]]:
        return [row for row in descendants(os.getpid()) if row[0] not in before]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left(), f"processes left 30 s after ray.shutdown(): {left()}"


@pytest.fixture()
def served_table():
    """A bare CartPole table with a ``stream`` field (so each row names the env, and hence
    the actor, that produced it), served on loopback; a background thread commits."""
    spec = dict(specs_from_env(gym.make("CartPole-v1")))
    spec["stream"] = tf.TensorSpec([], tf.int64, name="stream")
    table = rg.ReplayTable(spec, 300_000, name="replay")
    with rg.serve(table, "127.0.0.1:0") as server:
        yield server, table


def wait_until(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


def rows_by_actor(table):
    """Table rows per actor index, from the stream ids (actor i's envs are i*NUM_ENVS + env)."""
    streams = table.storage["stream"].numpy()[: table.size]
    return np.bincount(streams // NUM_ENVS, minlength=2).tolist()


@pytest.mark.timeout(180)
def has_actor_threads(pid):
    """Whether process ``pid`` started with the thread settings of every actor process."""
    environ = set(Path(f"/proc/{pid}/environ").read_text().split("\0"))
    return {f"{k}={v}" for k, v in ACTOR_THREAD_ENV.items()} <= environ


def test_a_killed_ray_actor_comes_back_under_its_id_and_the_counts_stay_exact(
    local_ray, served_table
):
    server, table = served_table
    # at most 3 x 40k rows (2 actors, one restart): the table never wraps, so rows can be
    # told apart by their content
    config = ActorConfig(env_id="CartPole-v1", num_envs=NUM_ENVS, send_interval=16, steps=40_000)
    began = time.monotonic()
    fleet = start_ray_actors(server.address, config, 2, num_cpus_per_actor=1, max_restarts=2)
    try:
        first = fleet.statuses()
        ids = fleet.actor_ids
        assert [s.actor_id for s in first] == ids and len(set(ids)) == 2
        assert not any(s.restarted for s in first)
        assert str(first[0].pid) not in ids[0]  # the id is the driver's, not the worker's
        assert all(has_actor_threads(s.pid) for s in first)
        # both stream: each has batches committed
        wait_until(lambda: min(server.ledger.last(i) for i in ids) >= 3, 60, "both actors commit")
        started_s = time.monotonic() - began
        seq_at_kill = server.ledger.last(ids[0])
        fleet.kill(0)
        wait_until(lambda: fleet.statuses()[0].pid != first[0].pid, 60, "actor 0 comes back")
        back = fleet.statuses()[0]
        assert back.restarted and back.actor_id == ids[0]
        assert has_actor_threads(back.pid)  # a restarted worker starts with them too
        assert back.seed != first[0].seed  # it does not replay its predecessor's episodes
        # it continues after the seq its dead predecessor got committed, and streams again
        wait_until(lambda: fleet.statuses()[0].resumed_after_seq > 0, 30, "actor 0 resumes")
        resumed = fleet.statuses()[0].resumed_after_seq
        assert resumed >= seq_at_kill
        wait_until(lambda: server.ledger.last(ids[0]) >= resumed + 3, 60, "actor 0 streams again")
        assert not fleet.statuses()[1].restarted
    finally:
        results = fleet.stop()
    ran_s = time.monotonic() - began
    wait_until(lambda: server.stats()["staged_batches"] == 0, 30, "the server commits all")

    # The restarted actor and the untouched one: every env step they took was committed,
    # and none of their batches was dropped as a replay of a seq committed before.
    for result in results:
        assert result["acked_transitions"] == result["env_steps"] > 0
    # One ledger entry per actor (a restart adds none); actor 1's rows, found by content,
    # are exactly what it was acknowledged; everything else is actor 0's, before and after.
    assert server.ledger.snapshot().keys() == set(ids)
    total = table.total_inserted
    assert table.size == total and server.stats()["ingested_transitions"] == total
    by_actor = rows_by_actor(table)
    assert by_actor[1] == results[1]["acked_transitions"]
    assert sum(by_actor) == total
    # The killed incarnation's own acks died with it: its rows are what is left, committed
    # before the kill, and at most what one incarnation collects (so nothing twice).
    before_kill = by_actor[0] - results[0]["acked_transitions"]
    assert 0 < before_kill <= config.steps
    rate = sum(r["env_steps_per_s"] for r in results)
    print(f"\nray fleet up in {started_s:.1f} s, ran {ran_s:.1f} s, {total} rows, "
          f"{rate:.0f} env steps/s (2 actors, last incarnations)")  # fmt: skip


def test_the_actor_command_runs_ray_actors_and_stops_them_on_sigterm(served_table):
    server, table = served_table
    cmd = [
        sys.executable, "-m", "replaygpu", "actor", server.address, "--env", "CartPole-v1",
        "--ray", "--num-actors", "2", "--ray-num-cpus", "0.5", "--num-envs", str(NUM_ENVS),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
    try:
        wait_until(lambda: table.total_inserted > 0, 120, "the Ray actors stream")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    done = re.findall(r"ray actor (\d) \(\S+\): (\d+) env steps, (\d+) transitions acked", err)
    assert sorted(d[0] for d in done) == ["0", "1"], err[-3000:]
    wait_until(lambda: server.stats()["staged_batches"] == 0, 30, "the server commits all")
    acked = sum(int(d[2]) for d in done)
    assert acked == sum(int(d[1]) for d in done) == table.total_inserted  # flushed, then stopped
    # Ray's processes (its own session's, the workers in process groups of their own) are gone
    wait_until(lambda: not processes(lambda row: row[2] == proc.pid), 30, "Ray's processes exit")


def test_without_ray_installed_the_api_and_the_command_say_how_to_install_it():
    code = (
        "import sys\n"
        "sys.modules['ray'] = None  # as if not installed\n"
        "import replaygpu as rg\n"
        "from replaygpu.agents.distributed.actor_config import ActorConfig\n"
        "from replaygpu.agents.distributed.ray_actors import start_ray_actors\n"
        "try:\n"
        "    start_ray_actors('127.0.0.1:1', ActorConfig(), 2)\n"
        "except rg.ConfigError as err:\n"
        "    print(err)\n"
        "from replaygpu.cli import main\n"
        "sys.exit(main(['actor', '127.0.0.1:1', '--env', 'CartPole-v1', '--ray']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=ENV
    )
    assert 'pip install "replaygpu[ray]"' in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert proc.returncode == 2  # the command: one line, no traceback
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("replaygpu actor: error: ConfigError"), lines
    assert 'pip install "replaygpu[ray]"' in lines[0]
