"""The standalone learner of every algorithm: a served table, the agent's rate-limited update,
weights for the actors, checkpoints. Run by ``replaygpu learner`` (`learner_cli.train_to_end`)
and, with actor processes, by the Ape-X demos (`train`). A config's `Builder` (in the
algorithm's package, named in `registry.ALGORITHMS`; the protocol is `agents.builder`) makes
table, agent and sampler; the actor
settings tell ``replaygpu actor ADDRESS`` what to run (`ActorConfig.to_settings`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import replaygpu as rg
from replaygpu.learner.weights import read_source
from replaygpu.service.config import AgentSettings, ServerConfig
from replaygpu.service.ops.auth import TLSConfig
from replaygpu.service.server.ledger import SequenceLedger
from replaygpu.service.server.loop import step as learner_step

from ..builder import make_learner, make_parts
from ..config_fields import BestOfEvaluations
from ..configs import total_sgd_steps
from ..evaluation import BestPolicy, assign_all, evaluate_while_training, evaluation_due
from ..progress import FINAL_WEIGHTS, NullRecorder, Recorder, TrainResult
from ..registry import builder_for, name_of
from ..runs import JsonState, LoopState, RunControl, stopped_early
from .fleet import ActorFleet, actor_configs

logger = logging.getLogger(__name__)


def make_agent(config: Any, env: Any) -> Any:
    """The networks of a learner run (what ``replaygpu eval`` restores)."""
    return builder_for(config).make_agent(config, env)


def evaluate_agent(config: Any, agent: Any, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes of a learner run's agent (``replaygpu eval``)."""
    return builder_for(config).evaluate(config, agent, episodes, seed)


class LearnerService:
    """A served learner of any algorithm: its config's `Builder` makes the parts.

    Args:
        config: a served algorithm's config (`registry.ALGORITHMS`).
        run: checkpoints and stop signals (restored from at once); None: neither.
        token, tls, server_config: for `rg.serve` (the builder may raise the message limit).

    Raises:
        ConfigError: a config no builder takes, bad env for the agent, address that cannot be
            bound, a checkpoint of another run.
    """

    def __init__(
        self,
        config: Any,
        run: RunControl | None = None,
        token: str | None = None,
        tls: TLSConfig | None = None,
        server_config: ServerConfig | None = None,
    ) -> None:
        parts = make_parts(config)
        self.builder = builder = parts.builder
        self.config, self.run = config, run
        self.table, self.agent, self.sampler = parts.table, parts.agent, parts.sampler
        self.learner = make_learner(config, parts)
        self.ledger = SequenceLedger()
        self.loop = LoopState()
        self.saved_stats = JsonState("run_stats")  # the episodes reported, across restarts
        #: env steps taken: the table's rows, unless a driver counts the actors' reports (a
        #: frame table holds one more row per episode)
        self.env_steps: Callable[[], int] = lambda: self.table.total_inserted
        state = dict(table=self.table, sampler=self.sampler, learner=self.learner, agent=self.agent)
        state.update(ledger=self.ledger, loop=self.loop, run_stats=self.saved_stats)
        #: greedy evaluations while training and the best one's weights (`BestOfEvaluations`
        #: configs); in every checkpoint, whatever keep_best says, so a resumed run may change it
        self.best: BestPolicy | None = None
        if isinstance(config, BestOfEvaluations):
            self.best = state["best_policy"] = BestPolicy(self._policy_values())
        self.restored = run.attach(**state) if run is not None else None
        if self.best is not None and not config.keep_best:
            self.best.forget()
        if self.restored:
            logger.info(
                "resumed from %s: %d transitions inserted, SGD step %d",
                self.restored,
                self.table.total_inserted,
                self.sgd_steps,
            )
        self.learner.train(0)  # trace and compile the fused loop before actors connect
        self.server = rg.serve(
            self.learner,
            config.address,
            token,
            tls,
            config=builder.server_config(config, server_config),
            ledger=self.ledger,
            actor_settings=self.actor_settings,
        )
        self.server.run_stats.target_steps = total_sgd_steps(config) if config.steps else 0
        self.server.run_stats.resume(self.saved_stats.value())
        self.learner.publish_weights(builder.policy(self.agent))
        self._last_sync = int(self.loop.last_sync.numpy())  # 0, or the restored run's
        self._rate = (time.monotonic(), self.sgd_steps, 0.0)
        self._polled_env_steps = int(self.loop.env_steps.numpy())  # for `evaluate_when_due`
        self.recorder: Recorder = NullRecorder()

    @property
    def actor_settings(self) -> AgentSettings:
        """What ``replaygpu actor ADDRESS`` learns from this learner's ``Info``."""
        return self.builder.actor_settings(self.config)

    @property
    def address(self) -> str:
        """``host:port``, the port resolved."""
        return self.server.address

    @property
    def sgd_steps(self) -> int:
        """SGD steps taken, restored runs included."""
        return int(self.learner.steps.numpy())

    def step(self, idle_wait_s: float = 0.5) -> int:
        """Commit, train one call, publish weights; sync and checkpoint when due. SGD steps run."""
        out = learner_step(self.server, self.learner, self.config.steps_per_call, idle_wait_s)
        ran = int(out["steps"])
        if ran:
            steps = self.sgd_steps
            if (
                self.builder.syncs_target
                and steps - self._last_sync >= self.config.target_update_interval
            ):
                self.agent.sync_target()
                self._last_sync = steps
            self.learner.publish_weights(self.builder.policy(self.agent))
            losses = {k: v for k, v in out.items() if k.startswith("losses/")}
            self.recorder.metrics(self.env_steps(), losses)
            self.server.run_stats.set_loss(losses.get(self.builder.loss_key, float("nan")))
        if self.run is not None and self.run.due() and not self.run.stop.is_set():
            self._capture()
            self.run.save(self.server)
        return ran

    def evaluate_when_due(self, final: bool = False) -> None:
        """A greedy evaluation while training (``periodic_eval_episodes`` on the same seeds each
        time) when a multiple of ``eval_every`` env steps passed since the last call, and with
        ``final`` and ``keep_best`` (the final weights compete too); recorded (``/metrics`` shows
        it), and with ``keep_best`` its weights offered to `best`. Nothing for configs without
        evaluations."""
        if self.best is None:
            return
        config, before = self.config, self._polled_env_steps
        self._polled_env_steps = now = self.env_steps()
        if not evaluation_due(config, before, now, final):
            return
        play = functools.partial(self.evaluate, evaluated="the current weights", env_step=now)
        evaluate_while_training(config, self.recorder, self.best, now, play, self._policy_values())

    def evaluate(
        self, episodes: int, seed: int, evaluated: str, env_step: int | None = None
    ) -> np.ndarray:
        """Greedy returns of ``episodes`` episodes (seeds ``seed + i``) of the weights that
        ``evaluated`` names; their mean becomes the run's eval return (Info, /metrics) and is
        logged, at ``env_step`` for an evaluation while training (`evaluate_when_due`)."""
        returns = self.builder.evaluate(self.config, self.agent, episodes, seed)
        mean, at = float(np.mean(returns)), f"SGD step {self.sgd_steps}"
        self.server.run_stats.set_eval(mean, self.sgd_steps)
        logger.info(
            "greedy evaluation at %s: return %.1f +- %.1f over %d episodes (%s)",
            at if env_step is None else f"env step {env_step} ({at})",
            mean,
            float(np.std(returns)),
            len(returns),
            evaluated,
        )
        return returns

    @contextlib.contextmanager
    def handed_back(self) -> Iterator[str]:
        """Inside: the agent's policy holds the weights the run hands back, with ``keep_best``
        the best evaluation's, else the final ones; yields what they are. The final weights
        return on exit (the final checkpoint and a resumed run train on from them)."""
        if self.best is None or not self.best.found:
            yield FINAL_WEIGHTS
            return
        variables = read_source(self.builder.policy(self.agent))[1]  # the policy actors get
        final = self._policy_values()
        try:
            yield self.best.load_into(variables)
        finally:
            assign_all(variables, final)

    def _policy_values(self) -> list[np.ndarray]:
        return [v.numpy() for v in read_source(self.builder.policy(self.agent))[1]]

    def done(self, ran: int) -> bool:
        """Whether the run is over: ``steps`` rows arrived and the last call could not train
        (the replay budget is spent), or a stop signal came (the only end with ``steps`` 0)."""
        if self.run is not None and self.run.stop.is_set():
            return True
        if not self.config.steps:  # a service: until stopped
            return False
        return self.table.total_inserted >= self.config.steps and ran == 0

    def stats(self) -> dict[str, float]:
        """For the metrics endpoint and the log (the rate since the last call)."""
        now, steps = time.monotonic(), self.sgd_steps
        then, then_steps, rate = self._rate
        if now - then >= 1.0:
            rate = (steps - then_steps) / (now - then)
            self._rate = (now, steps, rate)
        run = self.run
        return {
            "sgd_steps": float(steps),
            "sgd_steps_per_s": rate,
            "checkpoints": float(run.checkpoints if run else 0),
            "checkpoint_seconds": float(run.checkpoint_seconds if run else 0.0),
        }

    def commit(self) -> int:
        """Commit what the actors staged, without training (e.g. while they flush and stop)."""
        with self.server.training_turn():
            return self.server.commit_pending()

    def close(self, save: bool = True) -> str | None:
        """Stop serving (uncommitted staged batches get UNAVAILABLE, so their actors resend them
        to the next learner), then write the final checkpoint unless ``save`` is False; its path."""
        self.server.stop()
        if self.run is None or not save:
            return None
        self._capture()
        path = self.run.save(final=True)
        if path:
            logger.info("final checkpoint %s (SGD step %d)", path, self.sgd_steps)
        return path

    def _capture(self) -> None:
        """The loop's counters and the run's episode figures into the checkpoint."""
        self.loop.capture(self.env_steps(), self._last_sync)
        self.saved_stats.capture(self.server.run_stats.state())


def train(
    config: Any, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """The served demos' driver: a `LearnerService` with ``config.num_actors`` actor processes
    until ``steps`` arrived and the replay budget is spent (or a stop signal), then evaluate.

    With ``run``: resume (actors collect the rest of ``steps``, with new env seeds), save
    periodically, checkpoint and stop on SIGTERM or Ctrl-C. ``steps`` 0: until stopped.

    Raises:
        ConfigError: a config no builder takes, or an env its algorithm cannot run.
        RuntimeError: an actor process fails.
    """
    service = LearnerService(config, run)
    service.recorder = recorder = recorder or NullRecorder()
    base = int(service.loop.env_steps.numpy())  # 0, or what the restored run had collected
    configs = actor_configs(config, service.actor_settings, max(0, config.steps - base), base)
    fleet = ActorFleet(configs, service.address, recorder, base, name=f"{name_of(config)}-actor")
    service.env_steps = lambda: fleet.env_steps
    first_steps, sgd_seconds, compile_seconds = 0, 0.0, 0.0
    start = time.perf_counter()
    try:
        fleet.start()
        while True:
            actors_done = fleet.finished  # before: data may still come
            began = time.perf_counter()
            ran = service.step()
            if ran:
                if not first_steps:
                    compile_seconds, first_steps = time.perf_counter() - began, ran
                else:
                    sgd_seconds += time.perf_counter() - began
            fleet.drain()
            recorder.progress(fleet.env_steps, service.sgd_steps, fleet.recent_return)
            fleet.raise_failed()
            if service.run is not None and service.run.stop.is_set():
                break  # the final checkpoint follows
            if actors_done and not ran:
                service.evaluate_when_due(final=True)  # before the final checkpoint
                break
            service.evaluate_when_due()
    finally:
        fleet.stop(service.commit)
        service.close()
    elapsed = time.perf_counter() - start
    stopped = stopped_early(run, fleet.env_steps, config.steps or math.inf)
    with service.handed_back() as evaluated:
        eval_returns = (
            np.zeros(0)
            if stopped or not config.eval_episodes
            else service.evaluate(config.eval_episodes, config.seed + 10_000, evaluated)
        )
    recorder.metrics(fleet.env_steps, {"charts/rows_acked": float(fleet.acked)})
    trained = service.sgd_steps - first_steps
    return TrainResult(
        eval_returns=eval_returns,
        env_steps=fleet.env_steps,
        sgd_steps=service.sgd_steps,
        train_seconds=elapsed,
        env_steps_per_s=fleet.env_steps_per_s,
        sgd_steps_per_s=trained / sgd_seconds if sgd_seconds > 0 else float("nan"),
        compile_seconds=compile_seconds,
        episodes=len(fleet.returns),
        stopped=stopped,
        evaluated=evaluated,
    )
