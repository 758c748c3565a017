"""What changes over a run, without TensorFlow: the exploration rate (`LinearEpsilon`), Adam's
step size (`DecayedLearningRate`), and the chunks of a vector training loop (`next_chunk`,
`training_calls`). The configs mix the first two in; the CLI builds and checks a config before
TensorFlow is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import replaygpu as rg

if TYPE_CHECKING:
    from replaygpu.samplers import LinearSchedule


class LinearEpsilon:
    """The linear exploration schedule of a DQN config with ``steps``, ``exploration_fraction``
    and ``exploration_initial_eps`` / ``exploration_final_eps`` fields (mixed into the configs)."""

    steps: int
    exploration_fraction: float
    exploration_initial_eps: float
    exploration_final_eps: float

    def epsilon(self, env_steps: int) -> float:
        """Linearly decayed exploration rate after ``env_steps`` env steps."""
        progress = min(1.0, env_steps / (self.exploration_fraction * self.steps))
        start, end = self.exploration_initial_eps, self.exploration_final_eps
        return start + progress * (end - start)


class DecayedLearningRate:
    """Adam's step size of a config with ``steps``, ``learning_rate`` and ``final_learning_rate``
    fields and a ``total_sgd_steps`` property (mixed into the configs): linear from
    ``learning_rate`` to ``final_learning_rate`` over the run's SGD steps, then constant.

    The floor is > 0, so SGD steps past the end (a last call, a resumed run) still learn and no
    run trains at rate 0. ``final_learning_rate`` None, or ``steps`` 0 (a run without an end):
    the constant ``learning_rate``.
    """

    steps: int
    learning_rate: float
    final_learning_rate: float | None

    @property
    def total_sgd_steps(self) -> int:
        """The SGD steps of the whole run, over which the rate decays."""
        raise NotImplementedError

    def check_learning_rates(self) -> None:
        """Raise `ConfigError` unless ``0 < final_learning_rate <= learning_rate`` (or None)."""
        if self.final_learning_rate is None:
            return
        if not 0.0 < self.final_learning_rate <= self.learning_rate:
            raise rg.ConfigError(
                f"final_learning_rate: got {self.final_learning_rate}, expected in "
                f"(0, learning_rate={self.learning_rate}]: a learner never trains at rate 0; "
                "pass --final-learning-rate, e.g. learning_rate / 100"
            )

    @property
    def learning_rate_schedule(self) -> LinearSchedule | float:
        """The step size (evaluated in the graph at every SGD step) or a constant one for a run
        without an end."""
        if not self.steps or self.final_learning_rate is None:
            return self.learning_rate
        from replaygpu.samplers import LinearSchedule  # TensorFlow: only learners ask

        return LinearSchedule(self.learning_rate, self.final_learning_rate, self.total_sgd_steps)


def next_chunk(config: Any, env_steps: int) -> tuple[int, int]:
    """``(env steps, SGD steps)`` of a training loop's next chunk, after ``env_steps``:
    ``train_freq`` and ``gradient_steps`` of a config; the run's last chunk is what is left of
    its ``steps``, trained with SGD steps in proportion (at least 1), so that ``--steps N`` runs
    exactly N env steps at the configured replay ratio."""
    left = config.steps - env_steps
    if left >= config.train_freq:
        return config.train_freq, config.gradient_steps
    return left, max(1, config.gradient_steps * left // config.train_freq)


def steps_to_train(config: Any) -> int:
    """The least ``steps`` of a vector loop (`next_chunk`) that makes a training call: its last
    chunk ends at ``steps``, and a call follows each chunk that ends past ``learning_starts``
    (`training_calls`)."""
    return config.learning_starts + 1


def training_calls(config: Any) -> list[int]:
    """The SGD steps of each training call of a vector loop's whole run: one after each chunk
    (`next_chunk`) that ends past ``learning_starts``."""
    calls, env_steps = [], 0
    while env_steps < config.steps:
        size, sgd_steps = next_chunk(config, env_steps)
        env_steps += size
        if env_steps > config.learning_starts:
            calls.append(sgd_steps)
    return calls
