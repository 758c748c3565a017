"""What the learner logs is exported: the final evaluation of a ``--steps`` run reaches /metrics
(the learner waits for a scrape to read it) and TensorBoard before the process exits, and
TensorBoard tags are written at the ``--summary-every-s`` cadence, not at the rate of episodes
and train calls."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request

import pytest
import tensorflow as tf
from process_helpers import ENV, cli, reap, wait_for_line
from prometheus_client.parser import text_string_to_metric_families
from service_helpers import free_port

from replaygpu.agents.progress import EventsRecorder

#: a 3000-row DQN learner on CartPole small enough for a test (no XLA compile)
SMALL_DQN = (
    "--steps", "3000", "--learning-starts", "500", "--samples-per-insert", "2",
    "--batch-size", "32", "--steps-per-call", "16", "--hidden-sizes", "32,32", "--no-jit-compile",
    "--eval-episodes", "2",
)  # fmt: skip


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of the event files in ``folder``."""
    found: dict[str, list[tuple[int, float]]] = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("events.out.tfevents"):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(folder, name)):
                for value in event.summary.value:
                    point = (event.step, float(tf.make_ndarray(value.tensor)))
                    found.setdefault(value.tag, []).append(point)
    return found


def metric_values(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.timeout(600)
def test_the_final_evaluation_reaches_metrics_and_tensorboard_before_the_learner_exits(tmp_path):
    address, metrics_port = f"127.0.0.1:{free_port()}", free_port()
    logdir = tmp_path / "tb"
    learner = subprocess.Popen(
        cli(
            "learner", "--agent", "dqn", "--env", "CartPole-v1", "--address", address,
            "--metrics-port", str(metrics_port), "--metrics-wait-s", "300",
            "--logdir", str(logdir), "--summary-every-s", "5", *SMALL_DQN,
        ),
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )  # fmt: skip
    lines: list[str] = []
    try:
        wait_for_line(learner, r"serving at", lines)
        started = time.monotonic()
        actors = subprocess.run(
            cli("actor", address, "--steps", "1500"),
            capture_output=True,
            text=True,
            timeout=300,
            env=ENV,
        )
        assert actors.returncode == 0, actors.stderr[-3000:]
        logged = wait_for_line(
            learner, r"greedy evaluation at SGD step (\d+): return ([\d.]+) \+-", lines
        )
        wait_for_line(learner, r"waiting up to 300 s for a scrape of \S+ to read the final", lines)
        assert learner.poll() is None  # still up: nothing has scraped the evaluation yet
        values = metric_values(f"http://127.0.0.1:{metrics_port}/metrics")
        _, rest = learner.communicate(timeout=60)  # it exits once scraped
        lines.append(rest)
        elapsed = time.monotonic() - started
    finally:
        reap(learner)
    assert learner.returncode == 0, "".join(lines)[-3000:]
    sgd_step, mean = int(logged.group(1)), float(logged.group(2))
    assert values["replaygpu_eval_sgd_step"] == sgd_step
    assert values["replaygpu_eval_return"] == pytest.approx(mean, abs=0.05)
    assert "no scrape" not in "".join(lines)

    events = scalars(logdir)
    ((eval_step, eval_mean),) = events["eval/mean_return"]
    assert eval_mean == pytest.approx(mean, abs=0.05) and eval_step >= 3000
    # every tag at most once per 5 s (and once more at close), however many episodes and
    # train calls there were: 3000 CartPole steps of two exploring actors are 60+ episodes
    most = elapsed / 5 + 2
    episodes = int(values["replaygpu_episodes_total"])
    assert episodes >= 60
    assert 1 <= len(events["charts/episodic_return"]) <= most < episodes, (elapsed, episodes)
    losses = [tag for tag in events if tag.startswith("losses/")]
    assert losses and all(len(events[tag]) <= most for tag in losses), (elapsed, losses)


def test_a_tag_is_written_once_per_period_as_the_mean_and_evaluations_at_once(tmp_path):
    recorder = EventsRecorder(str(tmp_path), every_s=0.5)
    for step in range(1, 101):  # a burst: the first period has not passed
        recorder.episode(step, float(step), 10)
    recorder.metrics(100, {"eval/mean_return": 7.0})
    time.sleep(0.6)
    recorder.metrics(120, {"losses/loss": 4.0})  # the period passed: all tags are written
    recorder.metrics(130, {"losses/loss": 2.0})
    recorder.metrics(140, {"losses/loss": 1.0})
    recorder.close()  # the pending losses
    events = scalars(tmp_path)
    assert events["charts/episodic_return"] == [(100, 50.5)]
    assert events["charts/episodic_length"] == [(100, 10.0)]
    assert events["eval/mean_return"] == [(100, 7.0)]
    assert events["losses/loss"] == [(120, 4.0), (140, 1.5)]


def test_every_s_zero_writes_every_value(tmp_path):
    recorder = EventsRecorder(str(tmp_path))
    for step in range(1, 4):
        recorder.metrics(step, {"losses/loss": float(step)})
    recorder.close()
    assert scalars(tmp_path)["losses/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_the_learner_refuses_a_negative_summary_cadence_in_one_line():
    proc = subprocess.run(
        cli("learner", "--summary-every-s", "-1"), capture_output=True, text=True, env=ENV
    )
    assert proc.returncode == 2
    assert re.fullmatch(
        r"replaygpu learner: error: argument --summary-every-s: got '-1', expected seconds "
        r">= 0 \(0: off\)\n",
        proc.stderr,
    ), proc.stderr
