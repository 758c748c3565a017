"""`replaygpu actor ADDRESS`: run actors against a running learner (or replay server).

From a `replaygpu learner` the actors take the env, policy and exploration from its actor
settings, so the address is all they need; flags given here override them. Against a bare
`replaygpu serve`, pass --env. They act with a numpy copy of the learner's weights (no
TensorFlow), one BLAS thread per process. A server that does not answer within 1 s ends the
command with exit status 2 (--wait: keep trying); an outage during the run is ridden out for
--retry-deadline-s. Ctrl-C or SIGTERM stops the actors within 5 s (each flushes for 3 s at most,
one line says what was left unacknowledged), exit status 0, as does a learner whose run ended or
that was stopped. docs/service/index.md and docs/deployment/ray.md have the details.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replaygpu.service.config import AgentSettings

    from .actor_config import ActorConfig


logger = logging.getLogger(__name__)

#: `ActorConfig` fields whose flags come from `replaygpu.service.ops.commands.add_client_flags`.
_CLIENT_FIELDS = ("token", "tls_ca", "tls_cert", "tls_key", "server_name")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: seconds the command tries to reach the server at start without ``--wait``
CONNECT_TIMEOUT_S = 1.0
#: seconds after SIGTERM / Ctrl-C before a running actor process is killed (each flushes for
#: `actor.STOP_FLUSH_S` at most), so the command exits within 5 s
STOP_S = 4.5


def _wait_seconds(text: str) -> float:
    """``--wait``'s value: seconds > 0 (``inf``: no limit)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected seconds > 0 (write the address first: ADDRESS --wait, or "
            "--wait=SECONDS)"
        )
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``actor`` subcommand."""
    from replaygpu.service.ops.commands import add_client_flags, positive_int

    from ..configs import add_config_flags
    from .actor_config import SETTINGS_FIELDS, ActorConfig

    parser = subparsers.add_parser(
        "actor",
        help="run Ape-X actors (gymnasium vector envs, numpy policy) against a replay server",
        description=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("address", help="host:port of a running `replaygpu serve` / learner")
    parser.add_argument(
        "--env",
        "--env-id",
        dest="env_id",
        default=None,
        help="gymnasium env id (default: the learner's; needed against a bare serve)",
    )
    parser.add_argument(
        "--wait",
        nargs="?",
        const=math.inf,
        default=None,
        type=_wait_seconds,
        metavar="SECONDS",
        help="wait for a server that does not answer yet (a learner still starting): until it "
        f"answers, or at most SECONDS; default: give up after {CONNECT_TIMEOUT_S:g} s, in one "
        "line",
    )
    parser.add_argument(
        "--processes",
        type=positive_int,
        default=None,
        help="actor processes to start here (default: all of --num-actors from --actor-index; "
        "replicas that each run one actor of a larger fleet pass --processes 1)",
    )
    ray = parser.add_argument_group('Ray (pip install "replaygpu[ray]")')
    ray.add_argument(
        "--ray",
        action="store_true",
        help="run actors --actor-index .. --num-actors - 1 as Ray actors, restarted on failure",
    )
    ray.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join: auto (the one `ray start` runs on this machine) or the "
        "head's HOST:6379; default: start a local Ray instance (or join $RAY_ADDRESS)",
    )
    ray.add_argument(
        "--ray-num-cpus",
        type=float,
        default=1.0,
        help="CPUs Ray reserves per actor (default 1; 0.5: two actors per CPU)",
    )
    ray.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="times Ray restarts an actor whose process died (default 3; -1: no limit)",
    )
    # token and TLS: the same flags as `replaygpu info` (--token defaults to $REPLAYGPU_TOKEN)
    add_config_flags(parser, ActorConfig, skip=("env_id", *_CLIENT_FIELDS))
    add_client_flags(parser)
    # unset: taken from the learner's actor settings, else ActorConfig's defaults
    parser.set_defaults(**dict.fromkeys(SETTINGS_FIELDS))
    parser.set_defaults(func=run)


def _config(args: argparse.Namespace) -> ActorConfig:
    """Flags given, else the learner's actor settings, else defaults; flags are checked before
    the server is asked (`ActorConfig.check_given`), errors in the flags' names.

    Raises:
        ConfigError: bad flags, or no env id anywhere (a bare serve and no --env).
        ServiceError: the server cannot be asked (unreachable, wrong token, TLS).
    """
    import replaygpu as rg

    from ..configs import flag_message
    from .actor_config import ActorConfig

    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(ActorConfig)
        if getattr(args, f.name) is not None
    }
    try:
        ActorConfig.check_given(given)
    except rg.ConfigError as err:
        raise rg.ConfigError(flag_message(err, given)) from err
    settings = _learner_settings(args)
    if settings is not None:
        try:
            return ActorConfig.from_settings(settings, **given)
        except rg.ConfigError as err:
            raise rg.ConfigError(f"the learner at {args.address} announces {err}") from None
    if "env_id" not in given:
        raise rg.ConfigError(
            f"the server at {args.address} announces no actor settings (a bare `replaygpu "
            "serve`, not a `replaygpu learner`); pass --env ENV_ID"
        )
    return ActorConfig(**given)


def _learner_settings(args: argparse.Namespace) -> AgentSettings | None:
    """Actor settings from ``Info`` (None: a bare server); past `CONNECT_TIMEOUT_S` only if --wait.

    Raises:
        ServiceUnavailableError: the server cannot be reached, or not within ``--wait``.
        ServiceError: it refuses the token or the TLS handshake, or has no table ``--table``.
    """
    from replaygpu.service.actor.connection import reason
    from replaygpu.service.wire.status import ServiceUnavailableError

    try:
        return _ask_settings(args, CONNECT_TIMEOUT_S)
    except ServiceUnavailableError as err:
        why = reason(err)
        if args.wait is None:
            raise ServiceUnavailableError(
                f"cannot reach {args.address} ({why}); is the learner running? pass --wait to "
                "keep retrying"
            ) from None
    limit = None if math.isinf(args.wait) else args.wait
    logger.warning(
        "cannot reach %s (%s); waiting for it %s (--wait)",
        args.address,
        why,
        "until it answers" if limit is None else f"for up to {limit:g} s",
    )
    return _ask_settings(args, limit)


def _ask_settings(args: argparse.Namespace, wait_s: float | None) -> AgentSettings | None:
    """Ask the server for its actor settings, retrying for ``wait_s`` (None: forever)."""
    import replaygpu as rg
    from replaygpu.service.config import ClientConfig
    from replaygpu.service.ops.commands import client_tls

    from .actor import default_prefix

    client = rg.ReplayClient(
        args.address,
        actor_id=f"{default_prefix()}-settings",  # only asks; appends nothing
        table=args.table,
        token=args.token or None,
        tls=client_tls(args),
        config=ClientConfig(retry_deadline_s=wait_s),
    )
    client.close(flush=False)
    return client.actor_settings


def run(args: argparse.Namespace) -> int:
    """Run the actors until they collected their steps, are stopped, or the server is gone."""
    import replaygpu as rg

    if args.ray:
        from .ray_actors import check_ray_options
        from .ray_start import import_ray

        check_ray_options(args.ray_num_cpus, args.max_restarts)
        import_ray()  # a missing extra is said before the server is asked anything
        if args.processes is not None:
            raise rg.ConfigError(
                f"--processes {args.processes} with --ray: Ray starts the actors; pick them "
                "with --num-actors (and --actor-index for the first one to start here)"
            )
        return _run_ray(args, _config(args))
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C while we ask
    try:
        config = _config(args)
    except KeyboardInterrupt:
        logger.warning(
            "stopped while asking %s for its settings: no actor started, nothing left "
            "unacknowledged",
            args.address,
        )
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if args.processes is None:  # all the fleet's actors from actor_index on
        args.processes = config.num_actors - config.actor_index
    if config.actor_index + args.processes > config.num_actors:
        raise rg.ConfigError(
            f"--processes {args.processes} from --actor-index {config.actor_index}: "
            f"expected actor_index + processes <= num_actors ({config.num_actors})"
        )
    configs = [
        dataclasses.replace(config, actor_index=config.actor_index + i)
        for i in range(args.processes)
    ]
    return _run_processes(configs, args.address)


def _run_processes(configs: list[ActorConfig], address: str) -> int:
    """One spawned actor process per config (`fleet.ActorFleet`) until each ends (steps done,
    run finished, or SIGTERM / Ctrl-C). After a signal each flushes for `actor.STOP_FLUSH_S` at
    most; one still running after `STOP_S` (blocked on a silent learner) is killed.

    Raises:
        ReplayError: an actor process failed (each logged why, in one line).
    """
    from replaygpu.errors import ReplayError

    from .fleet import ActorFleet

    fleet = ActorFleet(configs, address, name="replaygpu-actor", quiet=False)
    signals: list[str] = []  # the handler only notes the signal: it may interrupt any lock

    def on_signal(signum: int, frame: object) -> None:
        signals.append(signal.Signals(signum).name)

    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    try:
        # children start ignoring SIGINT (kept across exec; Python then installs no handler):
        # a Ctrl-C reaches the whole process group, and only this process handles it
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        fleet.start()
        for sig in _STOP_SIGNALS:
            signal.signal(sig, on_signal)
        while fleet.running and not signals:
            fleet.drain()
            time.sleep(0.2)
    finally:
        killed = fleet.stop(timeout_s=STOP_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    _log_end(fleet.stats, address, signals[0] if signals else None, killed)
    failed = [
        f"{p.name} (exit {p.exitcode})"
        for p in fleet.processes
        if p.exitcode not in (0, None) and p.name not in killed
    ]
    if failed:
        raise ReplayError(f"actor processes failed: {', '.join(failed)}; see their log above")
    return 0


def _log_end(
    results: dict[int, dict[str, float]], address: str, signal_name: str | None, killed: list[str]
) -> None:
    """One line on how the actors ended, after a signal or when anything was left unacked."""
    from .actor import STOP_FLUSH_S

    total = {
        key: int(sum(r.get(key, 0) for r in results.values()))
        for key in ("env_steps", "acked_transitions", "unacked_transitions", "unacked_requests")
    }
    nbytes = int(sum(r.get("unacked_bytes", 0) for r in results.values()))
    finished = any(r.get("run_finished") for r in results.values())
    why = "the learner's run is finished" if finished else f"no ack within {STOP_FLUSH_S:g} s"
    left = (
        f"{total['unacked_transitions']} transitions in {total['unacked_requests']} requests "
        f"({nbytes} bytes) left unacknowledged by {address} ({why})"
        if total["unacked_requests"]
        else "nothing left unacknowledged"
    )
    if killed:
        left += (
            f"; {', '.join(killed)} did not stop within {STOP_S:g} s (blocked in a call to "
            f"{address}, which does not answer) and {'was' if len(killed) == 1 else 'were'} "
            "killed: what it held unacknowledged is lost, and not counted here"
        )
    if signal_name is None and not total["unacked_requests"] and not killed:
        return
    logger.warning(
        "%s%d env steps, %d transitions acknowledged; %s",
        f"stopped by {signal_name}: " if signal_name else "",
        total["env_steps"],
        total["acked_transitions"],
        left,
    )


def _run_ray(args: argparse.Namespace, config: ActorConfig) -> int:
    """Ray actors ``config.actor_index .. num_actors - 1`` until done (``--steps``), one fails,
    or SIGTERM / Ctrl-C; then stop them (flushing) and Ray."""
    from .ray_actors import start_ray_actors

    fleet = start_ray_actors(
        args.address,
        config,
        num_cpus_per_actor=args.ray_num_cpus,
        max_restarts=args.max_restarts,
        ray_address=args.ray_address,
    )
    stop = threading.Event()
    # after ray.init, which installs a SIGTERM handler of its own that exits at once
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    try:
        while not stop.is_set() and not fleet.wait(0.5):
            if any(s.error for s in fleet.statuses()):
                break  # stop() raises it, after stopping the others
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        results = fleet.stop()
    for actor_id, result in zip(fleet.actor_ids, results, strict=True):
        logger.info(
            "ray actor %s (%s): %d env steps, %d transitions acked",
            actor_id.rsplit("-", 1)[1],
            actor_id,
            result.get("env_steps", 0),
            result.get("acked_transitions", 0),
        )
    return 0
