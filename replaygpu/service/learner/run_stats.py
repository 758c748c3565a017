"""What a served learner's run has learned so far, as ``Info`` (``learner_stats``), /metrics
and ``replaygpu info`` show it.

The server records the episodes that actors report in their Append requests (once per
committed seq: a resent request's episodes are not counted again); the learner's driver
records its latest loss and evaluations. Imports no TensorFlow.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Iterable
from typing import Any

#: episodes the recent mean return and length are taken over
RECENT_EPISODES = 100

#: episodes kept for `RunStats.take_new` at most (the oldest go first when nobody takes them)
NEW_EPISODES = 10_000


class RunStats:
    """A learner run's latest figures; thread-safe (the committer adds episodes, the training
    thread the loss and evaluations, the Info thread and /metrics read).

    Args:
        window: the mean return and length are over the last ``window`` episodes reported.

    Attributes:
        target_steps: the run's budget (0: no end), as the learner gives it.
    """

    def __init__(self, window: int = RECENT_EPISODES) -> None:
        if window < 1:
            raise ValueError(f"RunStats window: got {window}, expected >= 1 episodes")
        self._lock = threading.Lock()
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=window)
        self._new: collections.deque[tuple[float, int]] = collections.deque(maxlen=NEW_EPISODES)
        self._episodes = 0
        self._loss = math.nan
        self._eval: tuple[float, int] = (math.nan, 0)
        self.target_steps = 0

    def add_episodes(self, episodes: Iterable[tuple[float, int]]) -> None:
        """Record ``(episode_return, length)`` of finished episodes."""
        with self._lock:
            for episode in episodes:
                self._recent.append(episode)
                self._new.append(episode)
                self._episodes += 1

    def take_new(self) -> list[tuple[float, int]]:
        """The episodes recorded since the last call (e.g. to log each one), oldest first."""
        with self._lock:
            new = list(self._new)
            self._new.clear()
        return new

    def set_loss(self, loss: float) -> None:
        """Record the learner's latest loss."""
        self._loss = float(loss)

    def set_eval(self, mean_return: float, sgd_step: int) -> None:
        """Record a greedy evaluation's mean return, taken at SGD step ``sgd_step``."""
        self._eval = (float(mean_return), int(sgd_step))

    def values(self) -> dict[str, float]:
        """``loss``, ``mean_return`` and ``mean_length`` (of the last ``recent_episodes``),
        ``recent_episodes``, ``episodes`` (over the run), ``eval_return``, ``eval_step`` and
        ``target_steps``; NaN for what is not known yet."""
        with self._lock:
            recent = list(self._recent)
            episodes = self._episodes
        count = len(recent)
        eval_return, eval_step = self._eval
        return {
            "loss": self._loss,
            "mean_return": sum(r for r, _ in recent) / count if count else math.nan,
            "mean_length": sum(n for _, n in recent) / count if count else math.nan,
            "recent_episodes": float(count),
            "episodes": float(episodes),
            "eval_return": eval_return,
            "eval_step": float(eval_step),
            "target_steps": float(self.target_steps),
        }

    def to_proto(self, message: Any) -> None:
        """Fill a ``LearnerStats`` message."""
        values = self.values()
        for name in ("loss", "mean_return", "mean_length", "eval_return"):
            setattr(message, name, values[name])
        for name in ("recent_episodes", "episodes", "eval_step", "target_steps"):
            setattr(message, name, int(values[name]))
