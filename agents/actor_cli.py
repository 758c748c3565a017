"""`replaygpu actor ADDRESS --env ID`: run Ape-X actors against a running replay server.

The actors need no TensorFlow: they act with a numpy copy of the weights the learner publishes.
``--processes P`` starts P actor processes with indices ``actor_index .. actor_index + P - 1``
of a fleet of ``--num-actors`` actors (each explores with its Ape-X epsilon). Ctrl-C or SIGTERM
stops them after they flush what they collected.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing as mp
import signal
import threading

logger = logging.getLogger(__name__)

#: `ActorConfig` fields whose flags come from `replaygpu.service.commands.add_client_flags`.
_CLIENT_FIELDS = ("token", "tls_ca", "tls_cert", "tls_key", "server_name")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``actor`` subcommand."""
    from agents.actor import ActorConfig
    from agents.flags import add_config_flags
    from replaygpu.service.commands import add_client_flags

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
        default=ActorConfig.env_id,
        help=f"gymnasium env id with Discrete actions (default: {ActorConfig.env_id})",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="actor processes to start here (default: 1)",
    )
    # token and TLS: the same flags as `replaygpu info` (--token defaults to $REPLAYGPU_TOKEN)
    add_config_flags(parser, ActorConfig, skip=("env_id", *_CLIENT_FIELDS))
    add_client_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the actors until they collected their steps, are stopped, or the server is gone."""
    import replaygpu as rg
    from agents.actor import ActorConfig, run_actor, run_actor_process
    from agents.flags import config_from_args

    try:
        config = config_from_args(ActorConfig, args)
        if args.processes < 1 or config.actor_index + args.processes > config.num_actors:
            raise rg.ConfigError(
                f"--processes {args.processes} from --actor-index {config.actor_index}: "
                f"expected 1 <= processes and actor_index + processes <= num_actors "
                f"({config.num_actors})"
            )
    except ValueError as err:
        print(f"replaygpu actor: error: {err}")
        return 2
    if args.processes == 1:
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            run_actor(config, args.address, stop=stop)
        except KeyboardInterrupt:
            stop.set()
        except rg.ReplayError as err:
            print(f"replaygpu actor: {err}")
            return 1
        finally:
            signal.signal(signal.SIGTERM, previous)
        return 0

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [
        ctx.Process(
            target=run_actor_process,
            args=(
                dataclasses.replace(config, actor_index=config.actor_index + i),
                args.address,
                stop,
            ),
            name=f"replaygpu-actor-{config.actor_index + i}",
        )
        for i in range(args.processes)
    ]
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        for p in procs:
            p.start()
        for p in procs:
            while p.is_alive():
                p.join(0.5)
    except KeyboardInterrupt:
        stop.set()
    finally:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                logger.warning("actor process %s did not stop; terminating it", p.name)
                p.terminate()
                p.join()
        signal.signal(signal.SIGTERM, previous)
    failed = [p.name for p in procs if p.exitcode not in (0, None)]
    if failed:
        print(f"replaygpu actor: {', '.join(failed)} failed (see the log above)")
        return 1
    return 0
