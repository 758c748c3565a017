"""R2D2's actor side (no TensorFlow): `StepBlockWriter`, one env's steps in blocks with the LSTM
state before each, and `RecurrentExperience`, the recurrent kind of actor
(`distributed.actor.run_actor`'s experience for ``sequence_period > 0``); the table fields both
sides name."""

from __future__ import annotations

from typing import Any

import numpy as np

import replaygpu as rg
from replaygpu.fields import HostSpec

from ..distributed.actor_config import ActorConfig
from ..distributed.experience import VectorExperience, send_ready
from ..policies import flat_features
from ..rollouts import Policy
from .acting import numpy_lstm_step

#: R2D2 table fields: the LSTM state before the step, whether a window may start there with it
#: (every ``period``-th step of an episode, and a block's first), and where a block of one env's
#: steps starts (windows stop there: another env's rows may precede it)
STATE_FIELD = "recurrent_state"
STATE_STORED = "state_stored"
BLOCK_START = "block_start"
#: a recurrent actor sends an env's steps in blocks of at most this many sequence lengths
BLOCK_SEQUENCES = 8
#: the fields of a row besides the state and its marks, in `StepBlockWriter.add`'s order
STEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated")


class StepBlockWriter:
    """One env's steps, each once, in blocks of consecutive steps that end with the episode or at
    ``max_rows`` rows, as the embedded R2D2 demo stores them. Every row holds the state before
    its step; `STATE_STORED` marks every ``period``-th step of an episode (from its first) and a
    block's first row, where windows may start; `BLOCK_START` marks the first row, where they
    stop. Finished blocks collect in ``blocks``, ``[n, ...]`` columns."""

    def __init__(self, period: int, max_rows: int) -> None:
        self.period, self.max_rows = period, max_rows
        self.blocks: list[dict[str, np.ndarray]] = []
        #: env steps in ``blocks``
        self.steps_ready = 0
        self._rows: list[tuple[Any, ...]] = []
        self._t = 0  # the episode step of the next row

    def add(self, row: tuple[Any, ...], done: bool) -> None:
        """Record one step: ``row`` is ``(*STEP_FIELDS values, state before the step)``."""
        self._rows.append(row)
        self._t += 1
        if done or len(self._rows) == self.max_rows:
            self._finish()
        if done:
            self._t = 0

    def end(self) -> None:
        """Finish the open block as it is (the actor stops); a next step starts afresh."""
        if self._rows:
            self._finish()
        self._t = 0

    def _finish(self) -> None:
        n = len(self._rows)
        columns = [np.stack(c) for c in zip(*self._rows, strict=True)]
        block = dict(zip((*STEP_FIELDS, STATE_FIELD), columns, strict=True))
        block[STATE_STORED] = np.arange(self._t - n, self._t) % self.period == 0
        block[BLOCK_START] = np.zeros(n, bool)
        block[STATE_STORED][0] = block[BLOCK_START][0] = True
        self.blocks.append(block)
        self.steps_ready += n
        self._rows = []

    def take(self) -> list[dict[str, np.ndarray]]:
        """The finished blocks, oldest first; empties the list."""
        blocks, self.blocks, self.steps_ready = self.blocks, [], 0
        return blocks


class RecurrentExperience(VectorExperience):
    """Blocks of steps (`StepBlockWriter`) of ``num_envs`` same-step-autoreset envs, for R2D2:
    `VectorExperience`'s envs, with the LSTM policy's state and rows of its own.

    Raises:
        ConfigError: an env id gymnasium does not know.
    """

    def __init__(self, config: ActorConfig) -> None:
        super().__init__(config)
        rows = BLOCK_SEQUENCES * config.sequence_length
        self.writers = [StepBlockWriter(config.sequence_period, rows) for _ in range(self.num_envs)]
        self.weights: list[np.ndarray] | None = None
        self._next: tuple[np.ndarray, np.ndarray] | None = None  # (Q, state) of this step

    def greedy(self, weights: list[np.ndarray]) -> Policy:
        self.weights = weights
        return lambda obs: self._step_network()[0].argmax(axis=1).astype(np.int64)

    def _step_network(self) -> tuple[np.ndarray, np.ndarray]:
        """The network's Q-values and next state at the current observation (once a step)."""
        if self._next is None:
            self._next = numpy_lstm_step(self.weights, flat_features(self.obs), self.state)
        return self._next

    def start(self, seed: int, spec: HostSpec) -> None:
        state = spec.get(STATE_FIELD)
        if state is None or len(state.shape) != 1 or not {STATE_STORED, BLOCK_START} <= set(spec):
            raise rg.ConfigError(
                f"table {self.config.table!r} has fields {dict(spec)}; a recurrent actor "
                f"(sequence_period {self.config.sequence_period}) writes the LSTM state to "
                f"'{STATE_FIELD}' ([2 * units] float32) and marks it in '{STATE_STORED}' and "
                f"blocks in '{BLOCK_START}' (bool): serve an R2D2 learner's table, or set "
                "sequence_period 0"
            )
        self.obs, _ = self.env.reset(seed=seed)
        self.state = np.zeros((self.num_envs, state.shape[0]), np.float32)
        self._next = None

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # the state moves on with every step, explored or greedy
        state = self._step_network()[1] if self.weights is not None else self.state
        next_obs, reward, terminated, truncated, _ = self.env.step(actions)
        done = terminated | truncated
        for i, writer in enumerate(self.writers):
            row = (self.obs[i], actions[i], reward[i], terminated[i], truncated[i], self.state[i])
            writer.add(row, bool(done[i]))
        self.obs, self.state, self._next = next_obs, np.where(done[:, None], 0.0, state), None
        self.state = self.state.astype(np.float32)
        return reward, done

    def send(self, client: rg.ReplayClient, final: bool = False) -> int:
        return send_ready(client, self.writers, self.config.send_interval * self.num_envs, final)
