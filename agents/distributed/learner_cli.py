"""`replaygpu learner --agent dqn|sac --env ENV_ID`: the standalone learner service.

One service runs every agent: DQN on vector observations, DQN on Atari frames (an ``ALE/...``
env: a frame table, the Nature CNN, prioritized frame stacks with 3-step returns), SAC. It serves
its replay table over gRPC, trains the agent's update under a samples-per-insert rate
limiter as the actors' transitions arrive, and publishes weights; ``replaygpu actor ADDRESS``
learns the env, the policy and its exploration from it. With ``--checkpoint-dir`` it resumes
from the newest checkpoint there (the episode count and recent returns included), saves one
every ``--checkpoint-every-s`` and a last one on SIGTERM or Ctrl-C (Ctrl-C also tells its
actors it stops for good: they exit 0; after SIGTERM they wait for a restart); acknowledged rows
are safe
as of the last checkpoint, or at once with ``--journal-dir`` (a learner killed with SIGKILL
replays the journal over its checkpoint when it restarts). Once the run's ``--steps``
transitions arrived it tells the actors that the run is finished (they exit), trains out its
replay budget, evaluates ``--eval-episodes`` greedy episodes, and exits, after a scrape of
``--metrics-port`` read that evaluation (``--metrics-wait-s`` at most); a signal stops it at
once. It writes TensorBoard scalars to ``--logdir`` (default: the checkpoint folder), each tag
at most every ``--summary-every-s``, and logs progress every 10 s.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Any

from ..registry import LEARNER_AGENTS

logger = logging.getLogger(__name__)

#: `report.SUMMARY_EVERY_S`, which this module cannot import before TensorFlow
SUMMARY_EVERY_S = 10.0


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
    """The full flag parser of ``replaygpu learner --agent AGENT --env ENV_ID`` (the env picks
    the config: an ALE game runs DQN on frames)."""
    from replaygpu.cli import CommandParser
    from replaygpu.service.ops.commands import (
        add_server_flags,
        add_server_security_flags,
        port_number,
    )

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
    parser.add_argument("--checkpoint-dir", help="resume from and save checkpoints here")
    parser.add_argument(
        "--checkpoint-every-s", type=float, default=300.0, help="seconds between checkpoints"
    )
    parser.add_argument(
        "--metrics-port",
        type=port_number,
        help="serve Prometheus metrics on this port (default: off)",
    )
    parser.add_argument(
        "--metrics-wait-s",
        type=_seconds,
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
        "--eval-every-s",
        type=_seconds,
        default=0.0,
        help="run a greedy evaluation of --eval-episodes episodes every this many seconds, "
        "beside training (default 0: only the one at the end of a run with --steps)",
    )
    parser.add_argument(
        "--summary-every-s",
        type=_seconds,
        default=SUMMARY_EVERY_S,
        help="write each TensorBoard tag at most every this many seconds, the mean of its "
        "values since (evaluations at once; default %(default)g; 0: every value, which for a "
        "fast learner is megabytes an hour)",
    )
    add_server_security_flags(parser)
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
    """Serve and train until the run is done or a signal stops it. Flags and values are
    checked before TensorFlow is imported."""
    from replaygpu.service.learner.binding import require_free_ports
    from replaygpu.service.ops.commands import server_config, server_tls

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

    from ..runs import RunControl
    from .learner import LearnerService
    from .report import LearnerReport

    control = RunControl(opts.checkpoint_dir, opts.checkpoint_every_s, config)
    with control:
        service = LearnerService(config, control, opts.token, tls, service_config)
        metrics, report, trained, finished = None, None, False, False
        try:
            report = LearnerReport(
                service,
                opts.logdir or opts.checkpoint_dir,
                opts.eval_every_s,
                summary_every_s=opts.summary_every_s,
            )
            if opts.metrics_port is not None:
                metrics = _start_metrics(opts.metrics_port, service)
            print(
                f"replaygpu learner ({agent}, {config.env_id}) serving at {service.address}; "
                f"actors: replaygpu actor {service.address} --num-actors N",
                file=sys.stderr,
                flush=True,
            )
            trained = True
            finished = service.train_to_end(report)
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


def _seconds(text: str) -> float:
    """A number of seconds >= 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:  # also NaN
        raise argparse.ArgumentTypeError(f"got {text!r}, expected seconds >= 0 (0: off)")
    return value


def _wait_for_scrape(
    metrics: Any, evaluated_at: float, timeout_s: float, stop: threading.Event
) -> None:
    """Keep /metrics up until a scrape read the final evaluation, ``timeout_s`` at most (a
    stop signal ends the wait)."""
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


def _start_metrics(port: int, service: Any) -> Any:
    from replaygpu.service.ops.metrics import start_metrics_server

    host = service.address.rsplit(":", 1)[0]
    return start_metrics_server(port, service.server, service.stats, address=host)
