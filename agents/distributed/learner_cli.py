"""`replaygpu learner --agent dqn|sac|r2d2 --env ENV_ID`: the standalone learner service, its
loop (`train_to_end`) and what it shows (`LearnerReport`).

One `LearnerService` serves any agent's replay table over gRPC, trains as the actors' rows
arrive (under a samples-per-insert rate limiter) and publishes weights; `replaygpu actor ADDRESS`
learns the rest from it. With --checkpoint-dir it resumes from the newest checkpoint there and
saves one every --checkpoint-every-s and a last one on SIGTERM or Ctrl-C; acknowledged rows are
safe as of the last checkpoint, or at once with --journal-dir. Once --steps rows arrived it trains
out their replay budget, evaluates --eval-episodes greedy episodes and exits (after a scrape of
--metrics-port read it, --metrics-wait-s at most). TensorBoard (--logdir) gets the demos' tags at
the env step (rows inserted) they belong to, each at most once per --summary-every-s.
docs/service/index.md has the details.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..registry import LEARNER_AGENTS

if TYPE_CHECKING:
    from .learner import LearnerService

logger = logging.getLogger(__name__)

#: default seconds between TensorBoard writes of a tag (360 points an hour). A CartPole learner
#: with two actors (2 cores, ~500 SGD steps/s) wrote 12.3 MB an hour writing every value, 0.20
#: MB at 10 s (docs/service/metrics.md)
SUMMARY_EVERY_S = 10.0

#: seconds a finished learner keeps serving connected actors, so each reads ``run_finished``
FINISH_GRACE_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``learner`` subcommand; its flags depend on ``--agent`` (see `learner_parser`)."""
    parser = subparsers.add_parser(
        "learner",
        help="run the learner service: serve a table, train, publish weights, checkpoint",
        description=__doc__.split("\n\n", 1)[1],
        add_help=False,
    )
    parser.add_argument("-h", "--help", action="store_true", help="show the flags and exit")
    parser.set_defaults(func=run, pass_unknown=True, options=[])


def learner_parser(agent: str, env_id: str | None = None) -> argparse.ArgumentParser:
    """Full flag parser of ``replaygpu learner``; the env picks the config (ALE: DQN on frames)."""
    from replaygpu.cli import CommandParser
    from replaygpu.service.ops.commands import add_server_flags, seconds

    from ..configs import add_config_flags
    from ..registry import algorithm, served

    config_cls = algorithm(served(agent, env_id)).config_class()
    parser = CommandParser(
        prog="replaygpu learner",
        description=f"{__doc__.split(chr(10) * 2, 1)[1].strip()}\n\nFlags of --agent {agent}: "
        f"{(config_cls.__doc__ or '').strip()}",
    )
    parser.add_argument(
        "--agent", choices=LEARNER_AGENTS, default="dqn", help="algorithm (default: dqn)"
    )
    parser.add_argument("--env", dest="env_id", default=argparse.SUPPRESS, help="= --env-id")
    parser.add_argument(
        "--metrics-wait-s",
        type=seconds,
        default=60.0,
        help="once a run with --steps is finished and evaluated, keep --metrics-port up until "
        "a scrape read the final evaluation (replaygpu_eval_return), this many seconds at "
        "most (default 60, Prometheus's default scrape interval; 0: exit at once)",
    )
    add_server_flags(parser)
    parser.add_argument(
        "--logdir",
        help="write TensorBoard scalars here (loss, Q, episode return and length from the "
        "actors' reports, SGD steps/s, samples per insert, eval return); default: the "
        "--checkpoint-dir, none without one",
    )
    parser.add_argument(
        "--summary-every-s",
        type=seconds,
        default=SUMMARY_EVERY_S,
        help="write each TensorBoard tag at most every this many seconds, the mean of its "
        "values since (evaluations at once; default %(default)g; 0: every value, which for a "
        "fast learner is megabytes an hour)",
    )
    add_config_flags(parser, config_cls)
    return parser


def _agent_of(options: list[str]) -> tuple[str, str | None]:
    """``(--agent, --env or --env-id)`` of the command line, before its other flags are known."""
    from replaygpu.cli import CommandParser

    pre = CommandParser(prog="replaygpu learner", add_help=False)
    pre.add_argument("--agent", choices=LEARNER_AGENTS, default="dqn")
    pre.add_argument("--env", "--env-id", dest="env_id", default=None)
    known, _ = pre.parse_known_args(options)
    return known.agent, known.env_id


def run(args: argparse.Namespace) -> int:
    """Serve and train until done or a signal; flags are checked before TensorFlow is imported."""
    from replaygpu.service.ops.commands import server_config, server_tls
    from replaygpu.service.server.binding import require_free_ports

    from ..configs import config_from_args
    from ..registry import algorithm, served

    agent, env_id = _agent_of(args.options)
    parser = learner_parser(agent, env_id)
    opts = parser.parse_args(args.options + (["--help"] if args.help else []))
    name = served(agent, env_id)
    config = config_from_args(algorithm(name).config_class(), opts, parser)
    tls = server_tls(opts)
    service_config = server_config(opts)
    require_free_ports(config.address, opts.metrics_port)  # before TensorFlow: one line at once

    from replaygpu.service.ops.metrics import start_metrics_server

    from ..runs import RunControl
    from .learner import LearnerService

    with RunControl(opts.checkpoint_dir, opts.checkpoint_every_s, config) as control:
        service = LearnerService(config, control, opts.token, tls, service_config)
        metrics, report, trained, finished = None, None, False, False
        try:
            logdir = opts.logdir or opts.checkpoint_dir
            report = LearnerReport(service, logdir, summary_every_s=opts.summary_every_s)
            if opts.metrics_port is not None:
                host = service.address.rsplit(":", 1)[0]
                metrics = start_metrics_server(
                    opts.metrics_port, service.server, service.stats, address=host
                )
            print(
                f"replaygpu learner ({agent}, {config.env_id}) serving at {service.address}; "
                f"actors: replaygpu actor {service.address} --num-actors N",
                file=sys.stderr,
                flush=True,
            )
            trained = True
            finished = train_to_end(service, report)
        finally:
            if report is not None:
                report.close()
            if metrics is not None:
                if finished and report.evaluated_at is not None:
                    wait_s = opts.metrics_wait_s
                    _wait_for_scrape(metrics, report.evaluated_at, wait_s, control.stop)
                metrics.close()
            service.close(save=trained)  # a start that failed leaves the folder as it was
    if control.signal_name:
        logger.info("stopped by %s at SGD step %d", control.signal_name, service.sgd_steps)
    return 0


def _wait_for_scrape(
    metrics: Any, evaluated_at: float, timeout_s: float, stop: threading.Event
) -> None:
    """Serve /metrics until a scrape read the final evaluation, ``timeout_s`` or a stop at most."""
    if not timeout_s or metrics.wait_scraped(evaluated_at, 0.0):
        return
    logger.info(
        "waiting up to %.0f s for a scrape of %s to read the final evaluation (--metrics-wait-s)",
        timeout_s,
        metrics.url,
    )
    deadline = time.monotonic() + timeout_s
    while not metrics.wait_scraped(evaluated_at, min(0.5, deadline - time.monotonic())):
        if stop.is_set() or time.monotonic() >= deadline:
            logger.warning(
                "no scrape of %s in %.0f s after the final evaluation; it is in the log and "
                "TensorBoard only",
                metrics.url,
                timeout_s,
            )
            return


def train_to_end(
    service: LearnerService, report: LearnerReport | None = None, grace_s: float = FINISH_GRACE_S
) -> bool:
    """``replaygpu learner``'s loop: ``service.step`` until done, polling ``report`` (None: no TB).

    At ``steps`` rows the run finishes for the fleet (`ReplayServer.finish_at`: later appends
    are acked, not inserted); the learner trains out its replay budget, evaluates, and serves
    until no actor is connected, ``grace_s`` at most. A stop signal ends it at once, without
    evaluation: SIGINT for the fleet too (`ReplayServer.finish_run`: actors exit 0), SIGTERM (a
    restart) as a crash (actors wait and resend). Returns whether the run finished.
    """
    report = report or LearnerReport(service)
    if service.config.steps:
        service.server.finish_at(service.config.steps)
    while True:
        ran = service.step()
        report.poll()
        if service.done(ran):
            break
        service.evaluate_when_due()
    if service.run is not None and service.run.stop.is_set():
        if service.run.signal_name == "SIGINT":  # for good; SIGTERM: a restart may follow
            service.server.finish_run()
        return False
    logger.info(
        "run finished: %d transitions inserted, SGD step %d (budget %d rows; the batch "
        "that reached it: %d rows)",
        service.table.total_inserted,
        service.sgd_steps,
        service.config.steps,
        service.server.finishing_rows,
    )
    service.evaluate_when_due(final=True)  # before the final checkpoint
    with service.handed_back() as evaluated:
        report.evaluate(service.config.eval_episodes, evaluated)
    deadline = time.monotonic() + grace_s
    while service.server.open_streams and time.monotonic() < deadline:
        if service.run is not None and service.run.stop.is_set():
            break
        service.commit()
        time.sleep(0.05)
    if service.server.open_streams:
        logger.warning(
            "%d actor streams still open %.0f s after the run finished; stopping anyway",
            service.server.open_streams,
            grace_s,
        )
    return True


class LearnerReport:
    """Reports a `learner.LearnerService`'s run while its training loop polls it.

    Args:
        service: its ``recorder`` becomes this report's TensorBoard one.
        logdir: the TensorBoard event file's folder; None: no events (the evaluations while
            training are the service's, `LearnerService.evaluate_when_due`).
        log_every_s: seconds between progress lines (and rate scalars).
        summary_every_s: seconds between TensorBoard writes of one tag; 0: every value.

    Attributes:
        evaluated_at: `time.monotonic` time the final evaluation was recorded (None: none yet),
            the one /metrics must be scraped after (`MetricsServer.wait_scraped`).
    """

    def __init__(
        self,
        service: Any,
        logdir: str | None = None,
        log_every_s: float = 10.0,
        summary_every_s: float = SUMMARY_EVERY_S,
    ) -> None:
        if log_every_s <= 0:
            raise ValueError(f"LearnerReport: log_every_s={log_every_s}; expected > 0")
        self.service = service
        self.stats = service.server.run_stats
        from ..progress import EventsRecorder  # TensorFlow: not before the flags are checked

        self.recorder = EventsRecorder(logdir or None, summary_every_s)  # a mean per tag pends
        self.evaluated_at: float | None = None
        service.recorder = self.recorder
        self.log_every_s = log_every_s
        now = time.monotonic()
        self._last_log = now
        self._rows = (now, service.table.total_inserted)

    def poll(self) -> None:
        """Between train calls: log reported episodes, and progress when due."""
        self._log_episodes()
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s:
            self._last_log = now
            self.log_progress()

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

    def evaluate(self, episodes: int, evaluated: str = "its weights") -> np.ndarray:
        """The final greedy evaluation (`LearnerService.evaluate`, on seeds ``seed + 10_000``...),
        also recorded as ``eval/mean_return``; its returns (none for ``episodes`` 0)."""
        if episodes <= 0:
            return np.zeros(0)
        service = self.service
        returns = service.evaluate(episodes, service.config.seed + 10_000, evaluated)
        self.evaluated_at = time.monotonic()
        self.recorder.metrics(service.env_steps(), {"eval/mean_return": float(np.mean(returns))})
        return returns

    def close(self) -> None:
        """Log the last episodes and progress; close the event file."""
        self._log_episodes()
        self.log_progress()
        self.recorder.close()

    def _log_episodes(self) -> None:
        """Record the episodes reported since the last call at the current env step."""
        steps = self.service.env_steps()
        for episodic_return, length in self.stats.take_new():
            self.recorder.episode(steps, episodic_return, length)
