"""The `replaygpu` command line: demos, the learner service, actors and inspection.

Each subcommand lives in the module that owns it and registers itself through a
``register(subparsers)`` function; this file only wires them together, and imports them lazily
so `replaygpu --help` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

#: subcommand name -> module with ``register(subparsers)``; each module's ``run(args)`` runs it.
COMMANDS = {
    "demo": "agents.demos",
    "actor": "agents.actor_cli",
    "serve": "replaygpu.service.commands",
    "info": "replaygpu.service.commands",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand whose module is installed."""
    parser = argparse.ArgumentParser(
        prog="replaygpu",
        description="Device-resident replay buffers and fused learners for TensorFlow 2.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in dict.fromkeys(COMMANDS.values()):
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `replaygpu` console script."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
