"""What the standalone learner (``replaygpu learner``) shows of its learning: TensorBoard
scalars, greedy evaluations, the 10 s progress line, and the figures that Info and /metrics
report (the server's `RunStats`).

TensorBoard (``--logdir``, by default the checkpoint folder) gets the demos' tags at the env
step (rows inserted) they belong to: ``losses/*`` (loss, Q) of each train call,
``charts/episodic_return`` and ``charts/episodic_length`` of each episode the actors report over
the wire, ``charts/SPS`` (rows inserted per second), ``charts/SGD_steps_per_s`` and
``charts/samples_per_insert`` at each progress line, and ``eval/mean_return`` of each greedy
evaluation. A tag is written at most once per ``summary_every_s`` seconds (the mean of its
values since; `progress.EventsRecorder`), evaluations at once, so the file grows by the hour,
whatever the rate of episodes and train calls.

A periodic evaluation (``--eval-every-s``) runs on a thread of its own with the policy of its
start, so training goes on meanwhile; its result is recorded at the next `LearnerReport.poll`
of the training loop. The final one (``--eval-episodes``) runs when the run has finished.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from ..progress import EventsRecorder

logger = logging.getLogger(__name__)

#: default seconds between the TensorBoard writes of one tag: the progress line's period, 360
#: points a tag an hour. A CartPole learner with two actors (2 cores, ~500 SGD steps/s) wrote
#: 12.3 MB an hour writing every value, 0.20 MB at 10 s (README.md, Metrics)
SUMMARY_EVERY_S = 10.0


class LearnerReport:
    """Reports a `learner.LearnerService`'s run while its training loop polls it.

    Args:
        service: the learner service (its ``recorder`` becomes this report's TensorBoard one).
        logdir: the folder of the TensorBoard event file; None: no events.
        eval_every_s: seconds between greedy evaluations while training; 0: none.
        log_every_s: seconds between progress lines (and rate scalars).
        summary_every_s: seconds between the TensorBoard writes of one tag; 0: every value.

    Attributes:
        evaluated_at: `time.monotonic` time the last evaluation was recorded (None: none yet),
            the one /metrics must be scraped after (`MetricsServer.wait_scraped`).
    """

    def __init__(
        self,
        service: Any,
        logdir: str | None = None,
        eval_every_s: float = 0.0,
        log_every_s: float = 10.0,
        summary_every_s: float = SUMMARY_EVERY_S,
    ) -> None:
        if eval_every_s < 0 or log_every_s <= 0:
            raise ValueError(
                f"LearnerReport: eval_every_s={eval_every_s}, log_every_s={log_every_s}; "
                "expected eval_every_s >= 0 (0: no periodic evaluation) and log_every_s > 0"
            )
        self.service = service
        self.stats = service.server.run_stats
        # keeps nothing but one pending mean per tag: a service runs long
        self.recorder = EventsRecorder(logdir or None, summary_every_s)
        self.evaluated_at: float | None = None
        service.recorder = self.recorder
        self.eval_every_s = eval_every_s
        self.log_every_s = log_every_s
        now = time.monotonic()
        self._last_log = now
        self._last_eval = now
        self._rows = (now, service.table.total_inserted)
        self._eval_thread: threading.Thread | None = None
        self._eval_result: tuple[np.ndarray, int, int] | None = None

    def poll(self) -> None:
        """Between train calls: log the episodes the actors reported, the progress line and
        rates when due, record a finished evaluation, start one when due."""
        steps = self._log_episodes()
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s:
            self._last_log = now
            self.log_progress()
        thread = self._eval_thread
        if thread is not None and not thread.is_alive():
            self._collect_eval()
        due = self.eval_every_s and now - self._last_eval >= self.eval_every_s
        if due and self._eval_thread is None:
            self._last_eval = now
            self._eval_thread = threading.Thread(
                target=self._evaluate_in_background,
                args=(self.service.sgd_steps, steps),
                name="learner-eval",
                daemon=True,
            )
            self._eval_thread.start()

    def log_progress(self) -> None:
        """The progress line, and the rate scalars."""
        service = self.service
        stats = service.stats()
        run = self.stats.values()
        now, rows = time.monotonic(), service.table.total_inserted
        then, then_rows = self._rows
        self._rows = (now, rows)
        rows_per_s = (rows - then_rows) / max(now - then, 1e-9)
        sampled = service.server.stats()["sampled"]
        self.recorder.metrics(
            service.env_steps(),
            {
                "charts/SPS": rows_per_s,
                "charts/SGD_steps_per_s": stats["sgd_steps_per_s"],
                "charts/samples_per_insert": sampled / rows if rows else 0.0,
            },
        )
        logger.info(
            "inserted %d (%.0f/s), table %d, SGD steps %d (%.0f/s), actors %d, weights v%d, "
            "loss %.4g, return %.1f (mean of the last %d of %d episodes), eval return %.1f",
            rows,
            rows_per_s,
            service.table.size,
            stats["sgd_steps"],
            stats["sgd_steps_per_s"],
            service.server.open_streams,
            service.learner.weight_store.version,
            run["loss"],
            run["mean_return"],
            run["recent_episodes"],
            run["episodes"],
            run["eval_return"],
        )

    def evaluate(self, episodes: int) -> np.ndarray:
        """A greedy evaluation now, on this thread (after a periodic one in flight ends);
        recorded like the periodic ones. Returns its returns (none for ``episodes`` 0)."""
        self._collect_eval()
        if episodes <= 0:
            return np.zeros(0)
        returns = self._run_eval(episodes)
        self._record_eval(returns, self.service.sgd_steps, self.service.env_steps())
        return returns

    def close(self) -> None:
        """Log the last episodes and progress line, and close the event file (a periodic
        evaluation still running is left to end with the process)."""
        self._log_episodes()
        self.log_progress()
        self.recorder.close()

    def _log_episodes(self) -> int:
        """Record the episodes reported since the last call at the env step of now; returns
        it."""
        steps = self.service.env_steps()
        for episodic_return, length in self.stats.take_new():
            self.recorder.episode(steps, episodic_return, length)
        return steps

    def _collect_eval(self) -> None:
        """Wait for the periodic evaluation in flight, if any, and record its result."""
        if self._eval_thread is not None:
            self._eval_thread.join()
            self._eval_thread = None
        if self._eval_result is not None:
            self._record_eval(*self._eval_result)
            self._eval_result = None

    def _run_eval(self, episodes: int) -> np.ndarray:
        service = self.service
        return service.builder.evaluate(
            service.config, service.agent, episodes, seed=service.config.seed + 10_000
        )

    def _evaluate_in_background(self, sgd_step: int, env_step: int) -> None:
        try:
            returns = self._run_eval(max(1, self.service.config.eval_episodes))
        except Exception:  # an evaluation never stops training
            logger.exception("periodic evaluation at SGD step %d failed", sgd_step)
            returns = None
        if returns is not None:
            self._eval_result = (returns, sgd_step, env_step)

    def _record_eval(self, returns: np.ndarray, sgd_step: int, env_step: int) -> None:
        mean = float(np.mean(returns))
        self.stats.set_eval(mean, sgd_step)
        self.evaluated_at = time.monotonic()
        self.recorder.metrics(env_step, {"eval/mean_return": mean})
        logger.info(
            "greedy evaluation at SGD step %d: return %.1f +- %.1f over %d episodes",
            sgd_step,
            mean,
            float(np.std(returns)),
            len(returns),
        )
