"""A served learner's run so far, for ``Info`` (``learner_stats``), /metrics, ``replaygpu info``.
Episodes actors report are counted once per committed seq (not again when resent); journal records
replayed at start are counted, as the checkpoint lacks them. `RunStats.state` goes in the learner's
checkpoint, `RunStats.resume` continues it. Imports no TensorFlow."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

#: episodes the recent mean return and length are taken over
RECENT_EPISODES = 100

#: episodes kept for `RunStats.take_new` at most (the oldest go first)
NEW_EPISODES = 10_000


class RunStats:
    """Thread-safe: the committer adds episodes, the training thread loss and evaluations.
    ``window``: episodes the mean return and length are over; ``target_steps``: the run's
    budget (0: no end), as the learner gives it."""

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
        """``(episode_return, length)`` pairs."""
        with self._lock:
            for episode in episodes:
                self._recent.append(episode)
                self._new.append(episode)
                self._episodes += 1

    def state(self) -> dict[str, Any]:
        """JSON-able: the episode count, recent episodes and last evaluation, for `resume`."""
        with self._lock:
            recent = [list(episode) for episode in self._recent]
            return {"episodes": self._episodes, "recent": recent, "eval": list(self._eval)}

    def resume(self, state: Mapping[str, Any]) -> None:
        """Saved episodes go before those since recorded (a journal replayed at start); the
        saved evaluation stands until a new one."""
        with self._lock:
            since = list(self._recent)
            self._recent.clear()
            self._recent.extend((float(r), int(n)) for r, n in state.get("recent", ()))
            self._recent.extend(since)
            self._episodes += int(state.get("episodes", 0))
            if math.isnan(self._eval[0]) and state.get("eval"):
                mean_return, sgd_step = state["eval"]
                self._eval = (float(mean_return), int(sgd_step))

    def take_new(self) -> list[tuple[float, int]]:
        """Episodes recorded since the last call, oldest first (e.g. to log each)."""
        with self._lock:
            new = list(self._new)
            self._new.clear()
        return new

    def set_loss(self, loss: float) -> None:
        self._loss = float(loss)

    def set_eval(self, mean_return: float, sgd_step: int) -> None:
        """A greedy evaluation's mean return."""
        self._eval = (float(mean_return), int(sgd_step))

    def values(self) -> dict[str, float]:
        """The fields of ``LearnerStats``; NaN for what is not known yet."""
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
        values = self.values()
        for name in ("loss", "mean_return", "mean_length", "eval_return"):
            setattr(message, name, values[name])
        for name in ("recent_episodes", "episodes", "eval_step", "target_steps"):
            setattr(message, name, int(values[name]))
