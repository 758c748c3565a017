"""Runs resume: a DQN demo stopped by SIGTERM, then killed with kill -9, then run to the end
takes exactly the env and SGD steps of an uninterrupted run; `replaygpu eval` reads it back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from replaygpu.checkpoint_files import sealed

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
STEPS, TRAIN_FREQ, GRADIENT_STEPS, LEARNING_STARTS = 25_600, 256, 16, 512
FLAGS = [
    "--steps", str(STEPS),
    "--train-freq", str(TRAIN_FREQ),
    "--gradient-steps", str(GRADIENT_STEPS),
    "--learning-starts", str(LEARNING_STARTS),
    "--hidden-sizes", "32,32",
    "--buffer-size", "30000",
    "--eval-episodes", "2",
    "--no-jit-compile",
    "--checkpoint-every-s", "0.5",
]  # fmt: skip


def start_demo(run_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "replaygpu", "demo", "cartpole", "--run-dir", str(run_dir), *FLAGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def wait_for_checkpoint(ckpt_dir, after: int, timeout: float = 120) -> int:
    """Wait until the folder's newest checkpoint number exceeds ``after`` and that checkpoint
    is sealed (its checksum manifest written: until then a restart skips it as unfinished);
    returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        newest = sealed(str(ckpt_dir)) if ckpt_dir.is_dir() else []
        number = int(newest[0].rsplit("-", 1)[1]) if newest else 0
        if number > after:
            return number
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint after ckpt-{after} in {ckpt_dir} within {timeout} s")


def test_stopped_killed_and_resumed_demo_ends_with_the_uninterrupted_step_counts(tmp_path):
    run_dir = tmp_path / "run"
    ckpt_dir = run_dir / "checkpoints"

    # 1. SIGTERM: a final checkpoint, a resume hint, exit 0.
    proc = start_demo(run_dir)
    wait_for_checkpoint(ckpt_dir, 0)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    stopped = re.search(r"stopped by SIGTERM at (\d+) of", out)
    assert stopped, out
    assert 0 < int(stopped.group(1)) < STEPS

    # 2. kill -9 after at least one more checkpoint: no chance to save.
    proc = start_demo(run_dir)
    last = wait_for_checkpoint(ckpt_dir, 0)
    wait_for_checkpoint(ckpt_dir, last)
    proc.kill()
    proc.communicate(timeout=60)

    # 3. Run to the end from the last checkpoint.
    proc = start_demo(run_dir)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    resumed = re.search(r"resumed at env step (\d+), SGD step (\d+)", err)
    assert resumed and int(resumed.group(1)) > int(stopped.group(1)), err[-2000:]
    done = re.search(r"(\d+) env steps, (\d+) SGD steps in", out)
    assert done, out
    # uninterrupted: STEPS / TRAIN_FREQ chunks, training after each chunk past LEARNING_STARTS
    trained_chunks = sum(
        1 for k in range(1, STEPS // TRAIN_FREQ + 1) if k * TRAIN_FREQ > LEARNING_STARTS
    )
    assert (int(done.group(1)), int(done.group(2))) == (STEPS, trained_chunks * GRADIENT_STEPS)

    evaluated = subprocess.run(
        [sys.executable, "-m", "replaygpu", "eval", str(run_dir), "--episodes", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert re.search(
        r"greedy evaluation on CartPole-v1 over 3 episodes: mean return", evaluated.stdout
    )


def test_resume_with_other_hyperparameters_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_demo(run_dir)
    wait_for_checkpoint(run_dir / "checkpoints", 0)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    other = subprocess.run(
        [sys.executable, "-m", "replaygpu", "demo", "cartpole", "--run-dir", str(run_dir),
         *FLAGS, "--learning-rate", "0.01"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )  # fmt: skip
    assert other.returncode == 2
    assert "learning_rate: saved 0.0023, given 0.01" in other.stderr
