"""Resumable runs: a checked checkpoint folder, the loop state (and the best evaluation's weights,
`evaluation.BestPolicy`) beside the networks, and stopping on SIGTERM / Ctrl-C with a final
checkpoint.

A training loop (DQN, SAC, the Ape-X learner) passes a `RunControl` to its ``train``: it restores
the newest checkpoint at start, saves one every ``every_s`` seconds at a chunk boundary, and after
SIGTERM or Ctrl-C saves a last one and stops the loop. A checkpoint holds the table, the sampler
(its RNG), the learner (steps, rate-limiter counters), the agent (networks, targets, optimizers,
schedules through the optimizer's step) and a `LoopState`. A run killed with kill -9 redoes the
chunks after its last checkpoint, so it ends with the same env and SGD step counts as one never
stopped. ``run.json`` names the algorithm and config: ``replaygpu eval DIR`` rebuilds the
networks without flags, and a resumed run refuses other hyperparameters.

Only the length (`BUDGET_FIELDS`: ``--steps``) may change on resume, down to the env steps taken:
a finished run continues with a larger ``--steps``. Schedules over ``steps`` (DQN's epsilon, the
Ape-X learning-rate decay) are functions of the step and ``steps``, so from the resumed step on
the run acts and learns as one asked for the new ``steps`` from the start. Within
1 / ``exploration_fraction`` times the steps taken (6.25x with DQN's defaults) epsilon stays
final; a longer extension raises it to the longer run's value there and it decays anew; a decayed
learning rate likewise rises, so the extension trains at a useful rate, not the floor.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.checkpoint import CheckpointSchedule, check_writable

from .registry import RUN_FILE, name_of, read_json

logger = logging.getLogger(__name__)

#: config fields that set a run's length: a resumed run may change them, down to the env steps
#: it already took (0, "until stopped", is longer than any); see the module doc for schedules
BUDGET_FIELDS = frozenset({"steps"})
#: other config fields a resumed run may change (everything else must match the saved run)
RESUMABLE_FIELDS = frozenset(
    {
        "eval_episodes",
        "eval_every",  # evaluations while training: what is learned does not depend on them
        "keep_best",  # (periodic_eval_episodes must match: the kept best was measured with it)
        "device",
        "devices",  # a checkpoint restores onto as many devices only (a clear error if not)
        "jit_compile",
        "address",
        "num_actors",
        "actor_envs",
        "weight_pull_interval",
    }
)


class LoopState(tf.Module):
    """The host-side loop state that a checkpoint must hold beside the networks."""

    def __init__(self) -> None:
        super().__init__(name="loop")
        self.env_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="env_steps")
        self.last_sync = tf.Variable(0, dtype=tf.int64, trainable=False, name="last_sync")
        self.rng_state = tf.Variable("", dtype=tf.string, trainable=False, name="rng_state")

    def capture(
        self, env_steps: int, last_sync: int, rng: np.random.Generator | None = None
    ) -> None:
        """Copy the loop's counters and the exploration RNG (if it has one) into the variables."""
        self.env_steps.assign(env_steps)
        self.last_sync.assign(last_sync)
        if rng is not None:
            self.rng_state.assign(json.dumps(rng.bit_generator.state))


class JsonState(tf.Module):
    """A JSON value (e.g. `RunStats.state`) a checkpoint holds in one string variable."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name)
        self.text = tf.Variable("", dtype=tf.string, trainable=False, name="json")

    def capture(self, value: Any) -> None:
        """Copy ``value`` into the variable."""
        self.text.assign(json.dumps(value))

    def value(self) -> Any:
        """The value saved or restored; ``{}`` before any."""
        text = self.text.numpy().decode()
        return json.loads(text) if text else {}


def resume(
    run: RunControl | None, seed: int, learner: Any, **objects: Any
) -> tuple[np.random.Generator, LoopState, int, int]:
    """A loop's rng (from ``seed``) and `LoopState`, tracked in ``run`` with ``learner`` and
    ``objects`` (table=, sampler=, agent=) and restored from its newest checkpoint. Returns
    ``(rng, loop, env_steps, last_sync)``; the steps ``(0, 0)`` without a run or a checkpoint."""
    rng, loop = np.random.default_rng(seed), LoopState()
    if run is None or not run.attach(learner=learner, loop=loop, **objects):
        return rng, loop, 0, 0
    env_steps, last_sync = int(loop.env_steps.numpy()), int(loop.last_sync.numpy())
    if saved_rng := loop.rng_state.numpy().decode():  # none saved: left as seeded
        rng.bit_generator.state = json.loads(saved_rng)
    logger.info("resumed at env step %d, SGD step %d", env_steps, int(learner.steps.numpy()))
    return rng, loop, env_steps, last_sync


def checkpoint_when_due(
    run: RunControl | None,
    loop: LoopState,
    env_steps: int,
    last_sync: int,
    rng: np.random.Generator | None,
    *,
    final: bool,
    settle: Callable[[], None] | None = None,
) -> bool:
    """At a chunk boundary, if a checkpoint is due (or ``final``): ``settle`` (e.g. wait for calls
    in flight), capture ``loop``, save. Whether to stop now (a stop signal came; just saved)."""
    if run is None or not (run.due() or final):
        return False
    if settle is not None:
        settle()
    loop.capture(env_steps, last_sync, rng)
    run.save(final=final)
    return run.stop.is_set()


class RunProgress(NamedTuple):
    """How far a run got: its newest checkpoint's env and SGD step counts."""

    env_steps: int
    sgd_steps: int


def stopped_early(run: RunControl | None, env_steps: int, steps: int) -> bool:
    """Whether ``run`` stopped its loop (on a signal) before the ``steps`` it was to run."""
    return run is not None and run.stop.is_set() and env_steps < steps


class RunControl:
    """Checkpoints and stop signals of one training run; ``resumed`` holds the step counts of
    the checkpoint it resumes from (None: a new run).

    Args:
        directory: checkpoint folder (checked writable now); None: no checkpoints, but SIGTERM
            and Ctrl-C still stop the loop at the next chunk.
        every_s: seconds between periodic checkpoints.
        config: the frozen config, saved in ``run.json`` under `registry.name_of` of it.

    Raises:
        ConfigError: the folder is not writable, or holds a run of another algorithm, of other
            hyperparameters (outside `RESUMABLE_FIELDS` and `BUDGET_FIELDS`), or one that took
            more env steps than ``config.steps``.
    """

    def __init__(self, directory: str | None, every_s: float, config: Any) -> None:
        self.directory = directory
        self.every_s = every_s
        self.stop = threading.Event()
        self.signal_name = ""
        self.checkpoints = 0
        self.checkpoint_seconds = 0.0
        self._checkpointer: rg.Checkpointer | None = None
        self._schedule = CheckpointSchedule(every_s)
        self._previous: dict[int, Any] = {}
        self._run_file: dict[str, Any] | None = None
        self.resumed: RunProgress | None = None
        if directory is not None:
            check_writable(directory)
            self.resumed = _progress(directory)
            self._run_file = _check_run_file(directory, config, self.resumed)

    # -- signals --------------------------------------------------------------------------------

    def __enter__(self) -> RunControl:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: do not wait for the checkpoint
        self.signal_name = signal.Signals(signum).name
        logger.warning("%s: stopping after this chunk, with a final checkpoint", self.signal_name)
        self.stop.set()

    # -- checkpoints ----------------------------------------------------------------------------

    def attach(self, **objects: Any) -> str | None:
        """Track ``objects`` (table=, sampler=, learner=, agent=, loop=, ledger=, ...) and
        restore the newest checkpoint into them; returns it, or None (no folder or checkpoint)."""
        if self.directory is None:
            return None
        self._checkpointer = rg.Checkpointer(self.directory, max_to_keep=2, **objects)
        restored = self._checkpointer.restore()
        self._schedule.restart()
        return restored

    def due(self) -> bool:
        """Whether a checkpoint should be written now (periodic, or stopping)."""
        return self._checkpointer is not None and (self.stop.is_set() or self._schedule.due())

    def save(self, saver: Any = None, *, final: bool = False) -> str | None:
        """Write a checkpoint (through ``saver.save(checkpointer)`` when given, e.g. a
        `ReplayServer`, so no commit runs meanwhile); None without a folder. A periodic one
        that fails (`CheckpointSaveError`: a full disk) is logged and tried again later
        (None); a ``final`` one, or one on the way out after a stop signal, raises."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            return None
        began = time.monotonic()

        def write() -> str:
            return saver.save(checkpointer) if saver is not None else checkpointer.save()

        path = write() if final or self.stop.is_set() else self._schedule.run(write)
        if path is None:
            return None
        self._schedule.restart()
        if self._run_file is not None:  # with the first checkpoint: a failed start leaves none
            _write_json(os.path.join(self.directory, RUN_FILE), self._run_file)
            self._run_file = None
        self.checkpoints += 1
        self.checkpoint_seconds = time.monotonic() - began
        return path


def _progress(directory: str) -> RunProgress | None:
    """Newest checkpoint's step counts in ``directory``; None: none, unreadable (restore says)."""
    latest = tf.train.latest_checkpoint(directory)
    if latest is None:
        return None
    try:
        read = tf.train.load_variable
        env_steps = read(latest, "loop/env_steps/.ATTRIBUTES/VARIABLE_VALUE")
        sgd_steps = read(latest, "learner/steps/.ATTRIBUTES/VARIABLE_VALUE")
    except Exception:  # a damaged or foreign checkpoint: restoring it says what is wrong
        return None
    return RunProgress(int(env_steps), int(sgd_steps))


def _check_run_file(
    directory: str, config: Any, resumed: RunProgress | None
) -> dict[str, Any] | None:
    """Check ``run.json`` describes the same run but for its length; returns what to write with
    the next checkpoint (None: the saved one stands)."""
    path = os.path.join(directory, RUN_FILE)
    values = json.loads(json.dumps(dataclasses.asdict(config)))  # as read back: lists, not tuples
    algorithm = name_of(config)
    current = {"algorithm": algorithm, "config": values}
    if os.path.exists(path) and tf.train.latest_checkpoint(directory) is not None:
        saved = read_json(path)
        if saved.get("algorithm") != algorithm:
            raise rg.ConfigError(
                f"checkpoint folder {directory!r} holds a run of {saved.get('algorithm')}, "
                f"not {algorithm}; pass another --checkpoint-dir"
            )
        old = saved.get("config", {})
        diffs = [
            f"{name}: saved {old.get(name, '(none)')!r}, given {value!r}"
            for name, value in values.items()
            if name not in RESUMABLE_FIELDS | BUDGET_FIELDS and value != old.get(name)
        ]
        if diffs:
            raise rg.ConfigError(
                f"checkpoint folder {directory!r} holds a run with other hyperparameters "
                f"({'; '.join(diffs)}); resume with the same flags (--steps may change) or pass "
                "another --checkpoint-dir"
            )
        changed = {name for name in BUDGET_FIELDS if values.get(name) != old.get(name)}
        if not changed:
            return None
        taken = resumed.env_steps if resumed is not None else 0
        if config.steps and config.steps < taken:  # shorter than what ran (0: no end)
            raise rg.ConfigError(
                f"steps: got {config.steps}, but the run in {directory!r} already took {taken} "
                f"env steps (of {old.get('steps') or 'unlimited'}); pass --steps {taken} or "
                "more to continue it, or another --checkpoint-dir"
            )
        logger.info(
            "continuing the run in %s: steps %s -> %d (schedules follow the new steps)",
            directory,
            old.get("steps"),
            config.steps,
        )
    return current


def _write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=2)
    os.replace(path + ".tmp", path)
