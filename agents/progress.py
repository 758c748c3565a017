"""Run reporting for demos: a progress bar, TensorBoard summaries and a learning-curve PNG.

Agents report through a `Recorder` and never print; the CLI passes a `RunRecorder`,
tests and benchmarks `NullRecorder`.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

CURVE_FILE = "learning_curve.png"
#: what a run's evaluation played when it handed back its last weights (`TrainResult.evaluated`)
FINAL_WEIGHTS = "the final weights"
#: the TensorBoard tag of the greedy evaluations while training (mean return)
PERIODIC_EVAL = "eval/periodic_return"


class ScalarEvents:
    """TensorBoard scalars written straight to an event file in ``folder`` (created if missing).

    One scalar costs a small protobuf and a buffered write (microseconds), where
    ``tf.summary.scalar`` costs an eager op (about a millisecond): ``demo cartpole``'s few
    thousand episodes cost 3 s of its main thread. The records are those ``tf.summary.scalar``
    writes, so TensorBoard and ``tf.compat.v1.train.summary_iterator`` read them.
    """

    def __init__(self, folder: str) -> None:
        from tensorflow.core.framework import summary_pb2, types_pb2
        from tensorflow.core.util import event_pb2

        self._event, self._summary = event_pb2.Event, summary_pb2.Summary
        self._float = types_pb2.DT_FLOAT
        self._metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        os.makedirs(folder, exist_ok=True)
        name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}.v2"
        self.path = os.path.join(folder, name)
        self._writer = tf.io.TFRecordWriter(self.path)
        self._write(self._event(wall_time=time.time(), file_version="brain.Event:2"))
        self._flushed = time.monotonic()

    def _write(self, event) -> None:
        self._writer.write(event.SerializeToString())

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One scalar ``tag`` at ``step``; flushed to disk every few seconds and on `close`."""
        summary_value = self._summary.Value(tag=tag, metadata=self._metadata)
        summary_value.tensor.dtype = self._float
        summary_value.tensor.float_val.append(float(value))
        summary_value.tensor.tensor_shape.SetInParent()  # a scalar: shape []
        event = self._event(wall_time=time.time(), step=int(step))
        event.summary.value.append(summary_value)
        self._write(event)
        if time.monotonic() - self._flushed > 5.0:  # TensorBoard follows a live run
            self.flush()

    def flush(self) -> None:
        """Write what is buffered to the file."""
        self._writer.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        """Flush and close the file. Idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


@dataclass(frozen=True)
class TrainResult:
    """What a training run measured."""

    eval_returns: np.ndarray  # [eval_episodes] greedy returns; empty if stopped or nothing ran
    env_steps: int  # of the whole run, a resumed run's earlier processes included
    sgd_steps: int  # same
    train_seconds: float  # acting + training in this process, without the final evaluation
    env_steps_per_s: float  # this process's env steps over its train_seconds
    sgd_steps_per_s: float  # inside Learner.train calls, after the first (compiling) call
    compile_seconds: float  # the first Learner.train call: tracing and XLA compilation
    episodes: int
    stopped: bool = False  # stopped early by SIGTERM / Ctrl-C (checkpointed; not evaluated)
    evaluated: str = FINAL_WEIGHTS  # whose greedy returns eval_returns are


class TrainTimer:
    """Times a loop (from the timer's making) and its `Learner.train` calls, the first (tracing,
    XLA) apart; ``env_steps``: a resumed run's earlier ones, so rates count this process's only."""

    def __init__(self, env_steps: int = 0) -> None:
        self.start_env_steps = env_steps
        self.started = time.perf_counter()
        self.calls = 0
        self.compile_seconds = 0.0
        self.steps = 0.0
        self.seconds = 0.0

    def train(self, learner, num_steps: int) -> dict[str, float]:
        """``learner.train(num_steps)``, timed."""
        start = time.perf_counter()
        metrics = learner.train(num_steps)
        elapsed = time.perf_counter() - start
        if self.calls == 0:
            self.compile_seconds = elapsed
        else:
            self.steps += metrics["steps"]
            self.seconds += elapsed
        self.calls += 1
        return metrics

    @property
    def steps_per_second(self) -> float:
        """SGD steps per second after the first call (NaN after one call; 0 without any)."""
        if self.calls == 0:
            return 0.0
        return self.steps / self.seconds if self.seconds > 0 else math.nan

    def finish(
        self,
        stopped: bool,
        evaluate: Callable[[], np.ndarray],
        env_steps: int,
        sgd_steps: int,
        recorder: object,
        evaluated: str = FINAL_WEIGHTS,
    ) -> TrainResult:
        """The `TrainResult` of a loop that ends now, with ``evaluate()``'s returns, skipped when
        the run ``stopped`` early or had nothing to do (a finished run resumed)."""
        train_seconds = time.perf_counter() - self.started
        ran = env_steps - self.start_env_steps
        idle = ran == 0 and self.calls == 0
        return TrainResult(
            eval_returns=np.zeros(0) if stopped or idle else evaluate(),
            env_steps=env_steps,
            sgd_steps=sgd_steps,
            train_seconds=train_seconds,
            env_steps_per_s=ran / train_seconds if train_seconds > 0 else math.nan,
            sgd_steps_per_s=self.steps_per_second,
            compile_seconds=self.compile_seconds,
            episodes=len(getattr(recorder, "episodes", [])),  # a recorder that keeps them
            stopped=stopped,
            evaluated=evaluated,
        )


class Recorder:
    """What an agent reports while it trains; this base reports nothing."""

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Scalar metrics (namespaced names such as ``losses/td_loss``) at env step ``step``."""

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        """One finished training episode."""

    def progress(self, env_steps: int, sgd_steps: int, recent_return: float) -> None:
        """Where training stands (called once per training chunk)."""


class NullRecorder(Recorder):
    """Keeps finished episodes in memory and reports nothing."""

    def __init__(self) -> None:
        self.episodes: list[tuple[int, float]] = []
        self.last_metrics: dict[str, float] = {}

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self.last_metrics.update(values)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.episodes.append((step, episodic_return))


class EventsRecorder(Recorder):
    """Writes what a run reports as TensorBoard scalars into ``folder`` (None: nothing): the
    metrics by their names, each episode as ``charts/episodic_return`` and
    ``charts/episodic_length``. `RunRecorder` adds a bar and a curve.

    With ``every_s`` > 0 (a service that runs for days) each tag is written at most once per
    ``every_s`` seconds, the mean since its last write at the latest step, so the file grows
    with time, not with the rate of episodes and calls; ``eval/*`` tags are written at once.
    Only the pending sums are kept in memory.
    """

    def __init__(self, folder: str | None, every_s: float = 0.0) -> None:
        if not every_s >= 0.0:  # also NaN
            raise ValueError(f"EventsRecorder: every_s: got {every_s}, expected >= 0 (0: all)")
        self.events = ScalarEvents(folder) if folder is not None else None
        self.every_s = every_s
        self._pending: dict[str, tuple[float, int, int]] = {}  # tag: (sum, count, last step)
        self._written = time.monotonic()

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            if math.isfinite(value):
                self._scalar(name, value, step)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self._scalar("charts/episodic_return", episodic_return, step)
        self._scalar("charts/episodic_length", length, step)

    def close(self) -> None:
        """Write what is pending, flush and close the event file. Idempotent."""
        if self.events is not None:
            self._write_pending()
            self.events.close()

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if self.events is None:
            return
        if not self.every_s or tag.startswith("eval/"):
            self.events.scalar(tag, value, step)
            return
        total, count, _ = self._pending.get(tag, (0.0, 0, step))
        self._pending[tag] = (total + float(value), count + 1, step)
        if time.monotonic() - self._written >= self.every_s:
            self._write_pending()

    def _write_pending(self) -> None:
        for tag, (total, count, step) in self._pending.items():
            self.events.scalar(tag, total / count, step)
        self._pending.clear()
        self._written = time.monotonic()


class RunRecorder(NullRecorder):
    """TensorBoard events and learning curve into ``run_dir`` (made if missing), a tqdm bar of
    ``total_steps`` env steps; ``start``: a resumed run's ``(env, SGD steps)`` (bar, 1st rates)."""

    def __init__(
        self, run_dir: str, total_steps: int, title: str, start: tuple[int, int] = (0, 0)
    ) -> None:
        super().__init__()
        from tqdm import tqdm

        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = run_dir
        self.title = title
        self.tensorboard = EventsRecorder(run_dir)
        self.events = self.tensorboard.events
        self.bar = tqdm(
            total=total_steps, initial=start[0], desc=title, unit="step", mininterval=0.5
        )
        self._start = time.perf_counter()
        self._last = (self._start, *start)
        self.evaluations: list[tuple[int, float]] = []  # (env step, mean) while training

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        super().metrics(step, values)
        self.tensorboard.metrics(step, values)
        if PERIODIC_EVAL in values:
            self.evaluations.append((step, values[PERIODIC_EVAL]))

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        super().episode(step, episodic_return, length)
        self.tensorboard.episode(step, episodic_return, length)

    def progress(self, env_steps: int, sgd_steps: int, recent_return: float) -> None:
        now = time.perf_counter()
        then, then_env, then_sgd = self._last
        dt = max(now - then, 1e-9)
        sgd_rate = (sgd_steps - then_sgd) / dt
        sps = (env_steps - then_env) / dt
        self._last = (now, env_steps, sgd_steps)
        self.bar.update(env_steps - self.bar.n)
        self.bar.set_postfix(
            {"return": f"{recent_return:.1f}", "SGD/s": f"{sgd_rate:.0f}"}, refresh=False
        )
        if now - then > 0 and env_steps > then_env:
            self.events.scalar("charts/SPS", sps, env_steps)
            self.events.scalar("charts/SGD_steps_per_s", sgd_rate, env_steps)

    def close(self, eval_returns: np.ndarray | None = None, eval_step: int | None = None) -> str:
        """Finish the bar, log the greedy evaluation, save the learning curve; returns its path."""
        self.bar.close()
        if eval_returns is not None and eval_step is not None:
            self.events.scalar("eval/mean_return", float(np.mean(eval_returns)), eval_step)
        self.events.close()
        return save_learning_curve(
            os.path.join(self.run_dir, CURVE_FILE),
            self.episodes,
            self.title,
            eval_returns,
            eval_step,
            self.evaluations,
        )


def save_learning_curve(
    path: str,
    episodes: list[tuple[int, float]],
    title: str,
    eval_returns: np.ndarray | None = None,
    eval_step: int | None = None,
    evaluations: Sequence[tuple[int, float]] = (),
) -> str:
    """Plot episodic return over env steps (raw and a moving average), the greedy evaluations
    while training (``(env step, mean return)``) and the final one to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if episodes:
        steps, returns = (np.array(column) for column in zip(*episodes, strict=True))
        ax.plot(steps, returns, alpha=0.3, label="episodic return")
        window = min(20, len(returns))
        smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, label=f"moving average ({window})")
    if evaluations:
        ax.plot(
            *zip(*evaluations, strict=True),
            "s-",
            markersize=3,
            color="tab:green",
            label="greedy evaluations while training",
        )
    if eval_returns is not None and eval_step is not None:
        ax.errorbar(
            [eval_step],
            [np.mean(eval_returns)],
            yerr=[np.std(eval_returns)],
            fmt="o",
            color="black",
            label=f"greedy evaluation ({len(eval_returns)} episodes)",
        )
    return save_figure(fig, ax, path, title, "env steps", "return")


def save_figure(fig: Any, ax: Any, path: str, title: str, xlabel: str, ylabel: str) -> str:
    """Label ``ax``, save ``fig`` to a PNG at ``path`` and close it; returns ``path``."""
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
