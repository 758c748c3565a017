"""Run reporting for demos: a progress bar, TensorBoard summaries and a learning-curve PNG.

Agents report through the small `Recorder` protocol (metrics, finished episodes, progress), so
they stay free of printing; the CLI passes a `RunRecorder`, tests and benchmarks may pass
`NullRecorder`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import tensorflow as tf

CURVE_FILE = "learning_curve.png"


@dataclass(frozen=True)
class TrainResult:
    """What a training run measured."""

    eval_returns: np.ndarray  # [eval_episodes] greedy returns after training
    env_steps: int
    sgd_steps: int
    train_seconds: float  # acting + training, without the final evaluation
    env_steps_per_s: float
    sgd_steps_per_s: float  # inside Learner.train calls, after the first (compiling) call
    compile_seconds: float  # the first Learner.train call: tracing and XLA compilation
    episodes: int
    stopped: bool = False  # stopped early by SIGTERM / Ctrl-C (checkpointed; not evaluated)


class TrainTimer:
    """Times `Learner.train` calls; the first call (tracing, XLA compilation) is kept apart."""

    def __init__(self) -> None:
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
        """SGD steps per second after the first call (NaN before a second call)."""
        return self.steps / self.seconds if self.seconds > 0 else math.nan


class Recorder(Protocol):
    """What an agent reports while it trains."""

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Scalar metrics (namespaced names such as ``losses/td_loss``) at env step ``step``."""

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        """One finished training episode."""

    def progress(self, env_steps: int, sgd_steps: int, recent_return: float) -> None:
        """Where training stands (called once per training chunk)."""


class NullRecorder:
    """Keeps finished episodes in memory and reports nothing."""

    def __init__(self) -> None:
        self.episodes: list[tuple[int, float]] = []
        self.last_metrics: dict[str, float] = {}

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self.last_metrics.update(values)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        self.episodes.append((step, episodic_return))

    def progress(self, env_steps: int, sgd_steps: int, recent_return: float) -> None:
        pass


class RunRecorder(NullRecorder):
    """Writes TensorBoard events into ``run_dir`` and shows a tqdm bar of env steps.

    Args:
        run_dir: run folder; created if missing. Events and the learning curve go here.
        total_steps: env steps of the run (the bar's total).
        title: the bar's label and the plot's title.
    """

    def __init__(self, run_dir: str, total_steps: int, title: str) -> None:
        super().__init__()
        from tqdm import tqdm

        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = run_dir
        self.title = title
        self.writer = tf.summary.create_file_writer(run_dir)
        self.bar = tqdm(total=total_steps, desc=title, unit="step", mininterval=0.5)
        self._start = time.perf_counter()
        self._last = (self._start, 0, 0)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        super().metrics(step, values)
        with self.writer.as_default():
            for name, value in values.items():
                if math.isfinite(value):
                    tf.summary.scalar(name, value, step=step)

    def episode(self, step: int, episodic_return: float, length: int) -> None:
        super().episode(step, episodic_return, length)
        with self.writer.as_default():
            tf.summary.scalar("charts/episodic_return", episodic_return, step=step)
            tf.summary.scalar("charts/episodic_length", length, step=step)

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
            with self.writer.as_default():
                tf.summary.scalar("charts/SPS", sps, step=env_steps)
                tf.summary.scalar("charts/SGD_steps_per_s", sgd_rate, step=env_steps)

    def close(self, eval_returns: np.ndarray | None = None, eval_step: int | None = None) -> str:
        """Finish the bar, log the greedy evaluation, save the learning curve; returns its path."""
        self.bar.close()
        if eval_returns is not None and eval_step is not None:
            with self.writer.as_default():
                tf.summary.scalar("eval/mean_return", float(np.mean(eval_returns)), eval_step)
        self.writer.flush()
        self.writer.close()
        return save_learning_curve(
            os.path.join(self.run_dir, CURVE_FILE),
            self.episodes,
            self.title,
            eval_returns,
            eval_step,
        )


def save_learning_curve(
    path: str,
    episodes: list[tuple[int, float]],
    title: str,
    eval_returns: np.ndarray | None = None,
    eval_step: int | None = None,
) -> str:
    """Plot episodic return over env steps (raw and a moving average) to a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if episodes:
        steps = np.array([s for s, _ in episodes])
        returns = np.array([r for _, r in episodes])
        ax.plot(steps, returns, alpha=0.3, label="episodic return")
        window = min(20, len(returns))
        smooth = np.convolve(returns, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, label=f"moving average ({window})")
    if eval_returns is not None and eval_step is not None:
        ax.errorbar(
            [eval_step],
            [np.mean(eval_returns)],
            yerr=[np.std(eval_returns)],
            fmt="o",
            color="black",
            label=f"greedy evaluation ({len(eval_returns)} episodes)",
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
