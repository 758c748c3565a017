"""No silent empty runs: every training command refuses, in one line and before TensorFlow is
imported, a ``--steps`` that ends before the run's first SGD step (`configs.require_trains`);
where a default is the cause, the line names the flag to pass. Each config's
``steps_to_train`` is the exact boundary of its own training loop."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from replaygpu.agents.configs import NoTrainingError, require_trains

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

#: the CLI, then whether TensorFlow was imported by then (its last stdout line), as the CLI
#: exits (a parser error raises SystemExit)
IN_PROCESS = """import sys
from replaygpu.cli import main
try:
    sys.exit(main(sys.argv[1:]))
finally:
    print('tensorflow' in sys.modules)
"""

# (command line, the least --steps that trains, the default --learning-starts it names);
# every demo whose preset waits before training, and the learner of each agent
TOO_SHORT = [
    (["demo", "cartpole", "--steps", "768"], 1001, 1000),
    (["demo", "mountaincar", "--steps", "999"], 1001, 1000),
    (["demo", "pendulum", "--steps", "64"], 100, 100),
    (["demo", "breakout", "--steps", "5000"], 100_001, 100_000),
    (["demo", "pong", "--steps", "5000"], 100_001, 100_000),
    (["demo", "apex-cartpole", "--steps", "500"], 1000, 1000),
    (["demo", "apex-breakout", "--steps", "1000"], 2000, 2000),
    (["demo", "r2d2-cartpole", "--steps", "1000"], 1801, 2000),  # whole chunks of 200
    (["learner", "--agent", "dqn", "--env", "CartPole-v1", "--steps", "500"], 1000, 1000),
    (["learner", "--agent", "dqn", "--env", "ALE/Pong-v5", "--steps", "1000"], 2000, 2000),
    (["learner", "--agent", "sac", "--env", "Pendulum-v1", "--steps", "50"], 100, 100),
    (["learner", "--agent", "r2d2", "--steps", "1000"], 2000, 2000),
]


@pytest.mark.parametrize(
    "args, first, default", TOO_SHORT, ids=[" ".join(args) for args, _, _ in TOO_SHORT]
)
def test_a_run_too_short_to_train_is_refused_in_one_line_naming_the_default(
    args, first, default, tmp_path
):
    run_dir = tmp_path / "run"
    folder = ["--run-dir", str(run_dir)] if args[0] == "demo" else []
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, *args, *folder],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr[-2000:]
    prog = " ".join(["replaygpu", *args[:2]]) if args[0] == "demo" else "replaygpu learner"
    steps = args[args.index("--steps") + 1]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{prog}: error: --steps: got {steps}, expected >= {first}: ")
    assert f"after --learning-starts {default} (the default of {prog}); " in proc.stderr
    assert f"pass --learning-starts below {steps}, or --steps {first} or more" in proc.stderr
    assert proc.stdout.splitlines() == ["False"]  # refused before TensorFlow was imported
    assert not run_dir.exists()
    assert elapsed < 30, f"refused after {elapsed:.1f} s"


def test_a_default_steps_below_a_passed_learning_starts_names_steps_first():
    proc = subprocess.run(
        [sys.executable, "-c", IN_PROCESS, "learner", "--learning-starts", "90000"],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (
        "replaygpu learner: error: --steps: got 80000 (the default of replaygpu learner), "
        "expected >= 90000: the run would end before its first SGD step, which comes after "
        "--learning-starts 90000; pass --steps 90000 or more, or --learning-starts below 80000\n"
    )
    assert proc.stdout.splitlines() == ["False"]


def test_a_learner_without_an_end_is_not_a_run_too_short():
    """``--steps 0`` serves until stopped: the learner starts (and is refused only later, here
    for a port in use, which it checks after the budget)."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        address = f"127.0.0.1:{busy.getsockname()[1]}"
        proc = subprocess.run(
            [sys.executable, "-c", IN_PROCESS, "learner", "--steps", "0", "--address", address],
            capture_output=True,
            text=True,
            timeout=120,
            env=ENV,
        )
    assert proc.returncode == 2 and "--steps" not in proc.stderr, proc.stderr
    assert "in use" in proc.stderr, proc.stderr


def _configs():
    """(config at its steps_to_train, the training module) of each single-process loop."""
    from replaygpu.agents.dqn.config import DQNConfig
    from replaygpu.agents.r2d2.config import R2D2Config
    from replaygpu.agents.sac.config import SACConfig

    small = dict(jit_compile=False, eval_episodes=1, seed=3)
    dqn = DQNConfig(
        steps=97, learning_starts=96, train_freq=32, gradient_steps=2, batch_size=8,
        hidden_sizes=(8,), eval_every=0, **small,
    )  # fmt: skip
    sac = SACConfig(
        env_id="Pendulum-v1", steps=96, learning_starts=96, train_freq=32, gradient_steps=2,
        batch_size=8, hidden_sizes=(8,), **small,
    )  # fmt: skip
    r2d2 = R2D2Config(
        steps=81, learning_starts=100, train_freq=20, gradient_steps=2, batch_size=4,
        sequence_length=6, burn_in=2, period=2, lstm_units=4, torso_size=4, **small,
    )  # fmt: skip
    return [("dqn", dqn), ("sac", sac), ("r2d2", r2d2)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["dqn", "sac", "r2d2"])
def test_steps_to_train_is_the_exact_boundary_of_the_training_loop(name):
    """One env step less than ``steps_to_train`` trains nothing (what `require_trains`
    refuses); ``steps_to_train`` makes an SGD step."""
    import dataclasses

    from replaygpu.agents.registry import algorithm

    config = dict(_configs())[name]
    first = config.steps_to_train
    assert first == config.steps
    module = algorithm(name).load()
    assert module.train(config).sgd_steps >= 1
    shorter = dataclasses.replace(config, steps=first - 1)
    with pytest.raises(NoTrainingError, match=rf"steps: got {first - 1}, expected >= {first}"):
        require_trains(shorter)
    assert module.train(shorter).sgd_steps == 0
