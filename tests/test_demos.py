"""`replaygpu demo NAME` runs end to end in a subprocess: TensorBoard events, a learning-curve
PNG, finite losses and a printed greedy evaluation; flags come from the config dataclasses."""

import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import replaygpu as rg
from replaygpu.agents import demos
from replaygpu.agents.configs import config_from_args

SMALL = ["--hidden-sizes", "32,32", "--eval-episodes", "1"]
DEMO_FLAGS = {
    "cartpole": [
        "--steps",
        "300",
        "--learning-starts",
        "64",
        "--train-freq",
        "64",
        "--gradient-steps",
        "16",
        *SMALL,
    ],
    "acrobot": ["--steps", "512", "--train-freq", "64", "--gradient-steps", "8", *SMALL],
    "mountaincar": [
        "--steps",
        "256",
        "--learning-starts",
        "64",
        "--train-freq",
        "64",
        "--gradient-steps",
        "8",
        *SMALL,
    ],
    "pendulum": [
        "--steps",
        "300",
        "--learning-starts",
        "64",
        "--train-freq",
        "64",
        "--gradient-steps",
        "8",
        "--batch-size",
        "64",
        *SMALL,
    ],
    "halfcheetah": [  # an episode is 1000 steps: the run ends one
        *("--steps", "1000", "--learning-starts", "64", "--train-freq", "64"),
        *("--gradient-steps", "8", "--batch-size", "64", "--buffer-size", "2000", *SMALL),
    ],
    "breakout": [  # a game of random play lasts about 200-250 steps: 400 ends one
        "--steps",
        "400",
        "--learning-starts",
        "100",
        "--buffer-size",
        "1000",
        "--report-interval",
        "20",
        "--jit-compile",
        "off",
        "--eval-episodes",
        "1",
    ],
    "apex-cartpole": [
        "--steps",
        "600",
        "--learning-starts",
        "200",
        "--steps-per-call",
        "16",
        "--actor-envs",
        "4",
        *SMALL,
    ],
    "apex-breakout": [
        *("--steps", "400", "--learning-starts", "200", "--segment-steps", "100"),
        *("--buffer-size", "2000", "--batch-size", "8", "--samples-per-insert", "1"),
        *("--steps-per-call", "4", "--jit-compile", "off", "--eval-episodes", "1"),
    ],
}


def read_scalars(run_dir):
    """{tag: [values]} of every scalar summary in the run folder's event files."""
    scalars = {}
    files = [f for f in os.listdir(run_dir) if f.startswith("events.out.tfevents")]
    for name in files:
        for event in tf.compat.v1.train.summary_iterator(os.path.join(run_dir, name)):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    return scalars


@pytest.mark.parametrize("name", list(DEMO_FLAGS))
def test_demo_writes_events_curve_and_prints_greedy_evaluation(name, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "replaygpu.cli",
        "demo",
        name,
        "--seed",
        "3",
        "--run-dir",
        str(run_dir),
        *DEMO_FLAGS[name],
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "greedy evaluation over 1 episodes: mean return" in proc.stdout
    closing = ("greedy evaluation over", "TensorBoard: ", "learning curve: ", "evaluate again: ")
    assert [proc.stdout.count(line) for line in closing] == [1] * 4, proc.stdout

    files = os.listdir(run_dir)
    assert any(f.startswith("events.out.tfevents") for f in files), files
    with open(run_dir / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(run_dir / "config.json") as f:
        assert json.load(f)["seed"] == 3

    scalars = read_scalars(run_dir)
    losses = {tag: v for tag, v in scalars.items() if tag.startswith("losses/")}
    assert losses, sorted(scalars)
    for tag, values in losses.items():
        assert np.all(np.isfinite(values)), (tag, values)
    assert scalars.get("charts/episodic_return"), sorted(scalars)
    assert len(scalars["eval/mean_return"]) == 1


def test_demo_flags_carry_config_help_and_reject_bad_values():
    parser, config_cls = demos.demo_parser("cartpole")
    text = parser.format_help()
    assert "--learning-rate" in text and "Adam step size" in text and "--run-dir" in text

    config = config_from_args(
        config_cls, parser.parse_args(["--seed", "7", "--hidden-sizes", "64,64"])
    )
    assert (config.seed, config.hidden_sizes, config.learning_rate) == (7, (64, 64), 2.3e-3)

    with pytest.raises(rg.ConfigError, match="--batch-size: got 0"):
        config_from_args(config_cls, parser.parse_args(["--batch-size", "0"]))


def test_acrobot_demo_preset_overrides_config_defaults():
    parser, config_cls = demos.demo_parser("acrobot")
    config = config_from_args(config_cls, parser.parse_args([]))
    assert config.env_id == "Acrobot-v1"
    assert config.target_update_interval == 250


def test_imports_frozen_keeps_the_collector_off_a_first_tensorflow_import_only():
    code = (
        "import gc\n"
        "from replaygpu.agents.demos import imports_frozen\n"
        "with imports_frozen():\n"
        "    assert not gc.isenabled()\n"
        "    import tensorflow\n"
        "print(gc.isenabled(), gc.get_freeze_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "True" and int(out[1]) > 100_000  # TensorFlow's objects, frozen
    frozen = gc.get_freeze_count()
    with demos.imports_frozen():  # tensorflow is imported here already: nothing changes
        assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
