"""Run budgets: ``--steps N`` runs exactly N env steps; a finished run continues when given a
larger ``--steps`` (a smaller one is refused in one line); a resumed run's rates count the work
of its own process, and a finished one says there is nothing to do."""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

import replaygpu as rg
from replaygpu.agents.dqn import agent as dqn
from replaygpu.agents.progress import NullRecorder
from replaygpu.agents.runs import RUN_FILE, RunControl
from replaygpu.agents.sac import agent as sac

SMALL = dict(hidden_sizes=(16,), jit_compile=False, eval_episodes=1, gradient_steps=8, seed=4)
TRAIN_FREQ, LEARNING_STARTS = 256, 256


def dqn_config(steps: int, **changes) -> dqn.DQNConfig:
    return dqn.DQNConfig(steps=steps, learning_starts=LEARNING_STARTS, **{**SMALL, **changes})


def chunk_ends(start: int, steps: int, train_freq: int) -> list[int]:
    """Env steps at which the chunks of a run from ``start`` to ``steps`` end."""
    return [*range(start + train_freq, steps, train_freq), steps]


def sgd_steps(start: int, steps: int, train_freq: int, gradient_steps: int, trains) -> int:
    """SGD steps from ``start`` to ``steps``: ``gradient_steps`` after each whole chunk and in
    proportion after a shorter last one, for the chunks whose end ``trains``."""
    total, previous = 0, start
    for end in chunk_ends(start, steps, train_freq):
        if trains(end):
            total += max(1, gradient_steps * (end - previous) // train_freq)
        previous = end
    return total


def test_sac_runs_exactly_steps():
    config = sac.SACConfig(
        steps=1_000, hidden_sizes=(16,), jit_compile=False, eval_episodes=1, gradient_steps=4
    )
    result = sac.train(config, NullRecorder())
    assert result.env_steps == 1_000  # 16 chunks of 64 ran 1,024
    expected = sgd_steps(0, 1_000, 64, 4, lambda end: end >= config.learning_starts)
    assert result.sgd_steps == expected == 14 * 4 + 4 * 40 // 64


def test_steps_must_be_whole_vector_steps():
    with pytest.raises(rg.ConfigError, match=r"steps: got 1001, expected a multiple of num_envs"):
        dqn_config(1_001, num_envs=2, train_freq=256)


def train_in(folder: str, config: dqn.DQNConfig):
    run = RunControl(folder, 3600.0, config)
    return dqn.train(config, NullRecorder(), run)


def test_a_finished_run_continues_to_a_larger_steps_and_reports_this_process_rates(tmp_path):
    folder = str(tmp_path / "checkpoints")
    trains = lambda end: end > LEARNING_STARTS  # noqa: E731
    first = train_in(folder, dqn_config(2_000))
    assert (first.env_steps, first.sgd_steps) == (2_000, sgd_steps(0, 2_000, 256, 8, trains))

    more = train_in(folder, dqn_config(4_000))
    assert more.env_steps == 4_000
    assert more.sgd_steps == first.sgd_steps + sgd_steps(2_000, 4_000, 256, 8, trains)
    assert more.env_steps_per_s == pytest.approx(2_000 / more.train_seconds)  # not 4,000
    assert more.eval_returns.size == 1
    with open(os.path.join(folder, RUN_FILE)) as f:
        assert json.load(f)["config"]["steps"] == 4_000  # the next resume compares with it

    # Finished: nothing runs, the rates say so, nothing is evaluated.
    again = train_in(folder, dqn_config(4_000))
    assert (again.env_steps, again.sgd_steps) == (4_000, more.sgd_steps)
    assert (again.env_steps_per_s, again.sgd_steps_per_s) == (0.0, 0.0)
    assert again.eval_returns.size == 0


def test_a_smaller_steps_than_done_or_another_hyperparameter_is_refused_and_changes_nothing(
    tmp_path,
):
    folder = str(tmp_path / "checkpoints")
    train_in(folder, dqn_config(1_024))
    run_file = pathlib.Path(folder, RUN_FILE)
    before = run_file.read_text()
    with pytest.raises(rg.ConfigError) as refused:
        RunControl(folder, 3600.0, dqn_config(512))
    message = str(refused.value)
    assert "\n" not in message
    assert "steps: got 512, but the run" in message and "already took 1024 env steps" in message
    assert "pass --steps 1024 or more" in message
    with pytest.raises(rg.ConfigError, match=r"gamma: saved 0.99, given 0.9.*--steps may change"):
        RunControl(folder, 3600.0, dqn_config(2_048, gamma=0.9))
    assert run_file.read_text() == before


ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
FLAGS = [
    "--hidden-sizes", "16",
    "--no-jit-compile",
    "--eval-episodes", "1",
    "--gradient-steps", "8",
    "--learning-starts", str(LEARNING_STARTS),
]  # fmt: skip


def demo(run_dir, steps: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "replaygpu", "demo", "cartpole", "--run-dir", str(run_dir),
         "--steps", str(steps), *FLAGS],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )  # fmt: skip


def test_demo_continues_a_finished_run_and_says_when_there_is_nothing_to_do(tmp_path):
    run_dir = tmp_path / "run"
    first = demo(run_dir, 1_000)
    assert first.returncode == 0, first.stderr[-2000:]
    assert re.search(r"cartpole: 1000 env steps, \d+ SGD steps in", first.stdout), first.stdout
    curve = (run_dir / "learning_curve.png").read_bytes()

    again = demo(run_dir, 1_000)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "cartpole: nothing to do: the run finished at step 1000" in again.stdout
    assert "steps/s" not in again.stdout  # was "253308596 env steps/s, nan SGD steps/s"
    assert (run_dir / "learning_curve.png").read_bytes() == curve

    more = demo(run_dir, 2_000)
    assert more.returncode == 0, more.stderr[-2000:]
    done = re.search(
        r"cartpole: 2000 env steps, \d+ SGD steps in ([\d.]+) s, resumed at step 1000 "
        r"\((\S+) env steps/s, (\S+) SGD steps/s",
        more.stdout,
    )
    assert done, more.stdout
    seconds, env_rate, sgd_rate = float(done.group(1)), float(done.group(2)), float(done.group(3))
    # this process's 1,000 env steps over its seconds (printed to 0.1 s: within that rounding);
    # counting the run's 2,000 would give twice as much
    assert 1_000 / (seconds + 0.05) - 1 <= env_rate <= 1_000 / (seconds - 0.05) + 1, (
        env_rate,
        seconds,
    )
    assert math.isfinite(sgd_rate) and 0 < sgd_rate < 1e6

    fewer = demo(run_dir, 500)
    assert fewer.returncode == 2
    errors = [line for line in fewer.stderr.splitlines() if "replaygpu demo: error" in line]
    assert len(errors) == 1, fewer.stderr[-2000:]
    assert "steps: got 500, but the run" in errors[0] and "already took 2000 env steps" in errors[0]
