"""The training loop of a served learner: commit staged appends, train, publish, checkpoint.

The only writer of a served learner's table (see `ingest`), so TensorFlow is driven from one
thread. Callers with per-iteration work (Ape-X syncs its target network) call `step` in their
own loop. Without a server (``server=None``) both just train."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from replaygpu.checkpoint import CheckpointSchedule
from replaygpu.errors import ConfigError
from replaygpu.learner.learner import Learner

if TYPE_CHECKING:
    from replaygpu.checkpoint import Checkpointer
    from replaygpu.service.server.server import ReplayServer

logger = logging.getLogger(__name__)


def _check(server: ReplayServer | None, learner: Learner) -> None:
    if not isinstance(learner, Learner):
        raise ConfigError(f"learner: got {type(learner).__name__}, expected an rg.Learner")
    if server is not None and server.learner is not learner:
        raise ConfigError(
            f"server at {server.address} serves "
            f"{'a bare table' if server.learner is None else 'another learner'}, not this "
            "learner; serve it with rg.serve(learner)"
        )


def step(
    server: ReplayServer | None, learner: Learner, num_steps: int, idle_wait_s: float = 0.0
) -> dict[str, float]:
    """Commit what the server staged, then ``learner.train(num_steps)``, under one
    `ReplayServer.training_turn`: no other thread commits or checkpoints while it samples.

    Args:
        num_steps: ``k`` of the train call (the rate limiter may allow fewer).
        idle_wait_s: if nothing was committed or trained, wait up to this long for data.

    Returns:
        ``{"steps", "inserted"}`` and the means of ``update_fn``'s metrics (NaN when no step
        ran). No train call while the table is empty and there is no rate limiter.

    Raises:
        ConfigError: ``server`` does not serve ``learner``.
    """
    _check(server, learner)
    lock = server.training_turn() if server is not None else contextlib.nullcontext()
    with lock:
        inserted = server.commit_pending() if server is not None else 0
        if learner.rate_limiter is not None or learner.table.size > 0:
            metrics = learner.train(num_steps)
        else:  # nothing to sample yet
            metrics = {"steps": 0.0}
    if not metrics["steps"] and not inserted and idle_wait_s > 0:
        if server is not None:
            server.wait_for_data(idle_wait_s)
        else:
            time.sleep(idle_wait_s)
    metrics["inserted"] = float(inserted)
    return metrics


@contextlib.contextmanager
def _sigterm_sets(stop: threading.Event, enabled: bool) -> Iterator[None]:
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(
    server: ReplayServer | None,
    learner: Learner,
    steps_per_call: int = 100,
    *,
    weights: Any = None,
    publish_every: int = 1,
    max_steps: int | None = None,
    max_seconds: float | None = None,
    stop: threading.Event | None = None,
    checkpointer: Checkpointer | None = None,
    checkpoint_every_s: float | None = None,
    handle_sigterm: bool = False,
    idle_wait_s: float = 0.05,
) -> dict[str, float]:
    """`step` until told to stop, publishing weights and checkpointing; then a final commit,
    publication and checkpoint.

    Args:
        weights: published for actors: a Keras model, a `tf.Module` or a callable returning
            variables, read at each publication; None publishes nothing.
        publish_every: publish after every this many train calls that ran steps.
        checkpointer: saved every ``checkpoint_every_s`` (None: only at the end) and at the
            end; give it ``ledger=server.ledger`` for exactly-once across restarts. A failed
            periodic save is logged and retried (`CheckpointSchedule`): training goes on.
        handle_sigterm: on SIGTERM, stop cleanly (main thread only).

    Returns:
        ``{"steps", "train_calls", "inserted", "seconds", "weights_version"}`` and the metric
        means of the last call that ran steps (none when no step ran).

    Raises:
        ConfigError: for out-of-range arguments, a server that does not serve ``learner``, or
            ``weights`` that hold no variables.
        CheckpointSaveError: the final checkpoint could not be written.
    """
    _check(server, learner)
    if steps_per_call < 1 or publish_every < 1:
        raise ConfigError(
            f"run: steps_per_call={steps_per_call}, publish_every={publish_every}; both must "
            "be >= 1"
        )
    if max_steps is None and max_seconds is None and stop is None and not handle_sigterm:
        raise ConfigError(
            "run: nothing would ever stop it; pass max_steps, max_seconds, stop or "
            "handle_sigterm=True"
        )
    stop = stop or threading.Event()
    start = time.monotonic()
    schedule = CheckpointSchedule(checkpoint_every_s if checkpointer is not None else None)
    steps = calls = inserted = unpublished = 0
    last: dict[str, float] = {}

    def save() -> str | None:
        if checkpointer is None:
            return None
        return server.save(checkpointer) if server is not None else checkpointer.save()

    with _sigterm_sets(stop, handle_sigterm):
        while not stop.is_set():
            now = time.monotonic()
            if max_seconds is not None and now - start >= max_seconds:
                break
            if max_steps is not None and steps >= max_steps:
                break
            k = steps_per_call if max_steps is None else min(steps_per_call, max_steps - steps)
            metrics = step(server, learner, k, idle_wait_s)
            inserted += int(metrics.pop("inserted"))
            ran = int(metrics["steps"])
            if ran:  # a call that ran no step has NaN means: keep the last real ones
                last = metrics
                steps += ran
                calls += 1
                unpublished += 1
                if weights is not None and unpublished >= publish_every:
                    learner.publish_weights(weights)
                    unpublished = 0
            if schedule.due():
                schedule.run(save)
        if weights is not None and unpublished:
            learner.publish_weights(weights)
        turn = server.training_turn() if server is not None else contextlib.nullcontext()
        with turn:  # what was acknowledged is in the final checkpoint
            inserted += server.commit_pending() if server is not None else 0
            save()
    seconds = time.monotonic() - start
    logger.info("run: %d steps in %d calls, %d inserted, %.1f s", steps, calls, inserted, seconds)
    out = {k: v for k, v in last.items() if k != "steps"}
    out.update(
        steps=float(steps),
        train_calls=float(calls),
        inserted=float(inserted),
        seconds=seconds,
        weights_version=float(learner.weight_store.version),
    )
    return out
