"""What makes an actor a recurrent (R2D2) actor: `RecurrentExperience`, the piece
`actor.run_actor` takes for a learner that announces ``sequence_period`` > 0.

The actor acts with the learner's LSTM Q-network in numpy (`policies.numpy_lstm_step`),
epsilon-greedy at its Ape-X epsilon, and carries each env's state ``concat([h, c])`` from step
to step, back to zeros when an episode ends. It sends overlapping sequences, as Acme's
``SequenceAdder`` does: every ``sequence_period`` steps of an episode a sequence starts, with
the state the actor had before its first step, and it holds the next ``sequence_length`` steps
(burn-in included) or fewer when the episode ends first (`SequenceWriter`). With a period below
the length consecutive sequences overlap by ``length - period`` steps, so their rows are sent
that many times over: each sequence is a block of rows of its own in the table, its first row
marked (`STATE_STORED`) as both where a stored state is and where a window must stop, so the
learner's ``rg.Sequence(..., start_field=STATE_STORED, state_start_field=STATE_STORED)`` view
never runs from one block into the next or into another actor's rows. Whole blocks go to the
server in groups that are never split between requests (`frame_actor.send_segments`), since
rows of other actors interleave at request granularity.

A row: ``obs``, ``action``, ``reward``, ``terminated``, ``truncated``, `STATE_FIELD` (the state
before the step, ``[2 * units]`` float32) and `STATE_STORED`. This module imports no TensorFlow.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

import replaygpu as rg
from replaygpu.agents.actor_config import ActorConfig
from replaygpu.agents.envs import Policy, make_vector_env
from replaygpu.agents.frame_actor import send_segments
from replaygpu.agents.policies import flat_features, numpy_lstm_step
from replaygpu.agents.r2d2_config import STATE as STATE_FIELD
from replaygpu.agents.r2d2_config import STATE_STORED
from replaygpu.fields import HostSpec
from replaygpu.service.config import ClientConfig

#: the fields of a row besides the state and its mark, in `SequenceWriter.add`'s order
STEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated")


class SequenceWriter:
    """Cuts one env's steps into overlapping sequences of at most ``length`` steps, one starting
    every ``period`` steps of an episode (the first at its first step); a sequence ends when it
    is ``length`` steps long or when the episode ends. Finished ones collect in ``blocks``,
    each a dict of ``[n, ...]`` columns whose first row has `STATE_STORED` set."""

    def __init__(self, length: int, period: int) -> None:
        self.length, self.period = length, period
        self.blocks: list[dict[str, np.ndarray]] = []
        #: env steps whose first sequence is in ``blocks`` (each step counts once)
        self.steps_ready = 0
        self._rows: deque[tuple[Any, ...]] = deque(maxlen=length)
        self._starts: list[int] = []  # episode steps where the open sequences begin
        self._t = 0

    def add(self, row: tuple[Any, ...], done: bool) -> None:
        """Record one step: ``row`` is ``(*STEP_FIELDS values, state before the step)``."""
        if self._t % self.period == 0:
            self._starts.append(self._t)
        self._rows.append(row)
        for start in list(self._starts):
            if self._t - start + 1 == self.length or done:
                self._finish(start, self._t)
        self._t += 1
        if done:
            self._rows.clear()
            self._t = 0

    def end(self) -> None:
        """Finish the open sequences as they are (the actor stops); the episode's next step,
        if any, starts afresh."""
        for start in list(self._starts):
            self._finish(start, self._t - 1)
        self._rows.clear()
        self._t = 0

    def _finish(self, start: int, last: int) -> None:
        """Move the sequence of episode steps ``start .. last`` (the newest) to ``blocks``."""
        self._starts.remove(start)
        rows = list(self._rows)[-(last - start + 1) :]
        columns = [np.stack(c) for c in zip(*rows, strict=True)]
        block = dict(zip((*STEP_FIELDS, STATE_FIELD), columns, strict=True))
        stored = np.zeros(len(rows), bool)
        stored[0] = True
        block[STATE_STORED] = stored
        self.blocks.append(block)
        self.steps_ready += min(self.period, len(rows))

    def take(self) -> list[dict[str, np.ndarray]]:
        """The finished sequences, oldest first; empties the list."""
        blocks, self.blocks, self.steps_ready = self.blocks, [], 0
        return blocks


class RecurrentExperience:
    """Overlapping sequences of ``num_envs`` gymnasium envs (a vector env with same-step
    autoreset) for an R2D2 learner; see the module doc.

    Raises:
        ConfigError: an env id gymnasium does not know.
    """

    def __init__(self, config: ActorConfig) -> None:
        self.config, self.num_envs = config, config.num_envs
        self.env = make_vector_env(config.env_id, config.num_envs, config.env_seed)
        self.action_space = self.env.single_action_space
        self.client_config = ClientConfig(retry_deadline_s=config.retry_deadline_s)
        self.writers = [
            SequenceWriter(config.sequence_length, config.sequence_period)
            for _ in range(config.num_envs)
        ]
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
        stored, state = spec.get(STATE_STORED), spec.get(STATE_FIELD)
        if stored is None or state is None or len(state.shape) != 1:
            raise rg.ConfigError(
                f"table {self.config.table!r} has fields {dict(spec)}; a recurrent actor "
                f"(sequence_period {self.config.sequence_period}) writes the LSTM state to "
                f"'{STATE_FIELD}' ([2 * units] float32) and marks it in '{STATE_STORED}' "
                "(bool): serve an R2D2 learner's table, or set sequence_period 0"
            )
        self.dtypes = {name: f.numpy_dtype for name, f in spec.items()}
        self.obs, _ = self.env.reset(seed=seed)
        self.state = np.zeros((self.num_envs, state.shape[0]), np.float32)
        self._next = None

    def observation(self) -> Any:
        return self.obs

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
        if final:
            for writer in self.writers:
                writer.end()
        ready = sum(writer.steps_ready for writer in self.writers)
        if not ready or (ready < self.config.send_interval * self.num_envs and not final):
            return 0
        blocks = [b for writer in self.writers for b in writer.take()]
        send_segments(client, [{k: v.astype(self.dtypes[k]) for k, v in b.items()} for b in blocks])
        return ready

    def close(self) -> None:
        self.env.close()
