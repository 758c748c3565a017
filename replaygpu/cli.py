"""The `replaygpu` command line: the library's own commands (``serve``, ``info``, ``health``)
and those that installed packages add.

Each subcommand lives in the module that owns it and registers itself through a
``register(subparsers)`` function (each module's ``run(args)`` runs it). The library's are in
`replaygpu.service.ops.commands`; a package adds its own through an entry point in the group
`COMMAND_GROUP` naming such a module (replaygpu's agents add ``demo``, ``eval``, ``learner``
and ``actor`` so, in pyproject.toml), so the library names none of them. Nothing here imports
TensorFlow, so `replaygpu --help` starts fast.

Expected failures (bad flags or values, bad files, an unknown env id, an unwritable folder, an
unreachable or refusing server, a missing optional dependency) end with one line on stderr and
exit status 2; ``--debug`` shows the traceback instead. Flags are parsed and checked before a
command imports TensorFlow, so such a line comes at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib.metadata import entry_points
from typing import NoReturn

#: the entry-point group of modules that add subcommands (``register(subparsers)``)
COMMAND_GROUP = "replaygpu.commands"

#: exit status of an expected failure (as argparse's usage errors)
USAGE_ERROR = 2


#: top-level module of an optional dependency -> how to install it (`missing_dependency`)
EXTRAS = {
    "tensorflow": 'pip install "replaygpu[cpu]" (or "replaygpu[gpu]" for an NVIDIA GPU)',
    **dict.fromkeys(("tqdm", "matplotlib", "tensorboard"), 'pip install "replaygpu[demos]"'),
    "ray": 'pip install "replaygpu[ray]"',
    **dict.fromkeys(("ale_py", "cv2"), 'pip install "replaygpu[atari]"'),
}


class CommandParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose errors are one line on stderr, ``PROG: error:
    MESSAGE``, with exit status `USAGE_ERROR` and no usage block before it (``--help`` prints
    the usage). The parsers of subcommands (``add_subparsers``) are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand whose module is installed."""
    from replaygpu._version import __version__

    parser = CommandParser(
        prog="replaygpu",
        description="Device-resident replay buffers and fused learners for TensorFlow 2.",
    )
    parser.add_argument("--version", action="version", version=f"replaygpu {__version__}")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks of errors (and DEBUG logs)"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in command_modules():
        importlib.import_module(module_name).register(sub)
    return parser


def command_modules() -> list[str]:
    """The modules that register subcommands: the library's, then each `COMMAND_GROUP` entry
    point's (by name; a module named twice registers once)."""
    added = sorted(entry_points(group=COMMAND_GROUP), key=lambda entry: entry.name)
    return list(dict.fromkeys(["replaygpu.service.ops.commands", *(e.value for e in added)]))


def expected_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix, reported in one line: the library's own (commands
    turn bad files, values and addresses into `ConfigError`s where they meet them) and
    gymnasium's unknown-env errors (looked up only if gymnasium was loaded). Anything else is
    a bug and keeps its traceback."""
    from replaygpu.errors import ReplayError

    kinds: list[type[BaseException]] = [ReplayError]
    gym_error = sys.modules.get("gymnasium.error")
    if gym_error is not None:
        kinds.append(gym_error.Error)
    return tuple(kinds)


def missing_dependency(err: BaseException) -> str | None:
    """What to install for a `ModuleNotFoundError` of an optional dependency (`EXTRAS`), in one
    line; None for any other error."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    module = err.name.split(".")[0]
    how = EXTRAS.get(module)
    return None if how is None else f"{module} is not installed; install it with: {how}"


def one_line(err: BaseException) -> str:
    """``Type: message`` on one line, the parameters it names as their flags."""
    from replaygpu.service.ops.commands import with_flags

    text = with_flags(" ".join(str(err).split()) or repr(err))
    return f"{type(err).__name__}: {text}"


#: exit status of a command whose reader closed the pipe, as a shell reports SIGPIPE (128 + 13)
CLOSED_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `replaygpu` console script.

    A reader that closes the pipe early (``replaygpu info ADDR | head -3``) ends the command
    quietly with `CLOSED_PIPE`, as ``cat`` does, not with a BrokenPipeError traceback.
    """
    try:
        code = _run(argv)
        sys.stdout.flush()  # a closed pipe shows here as often as in a print
        return code
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own flush at exit cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return CLOSED_PIPE


def _run(argv: list[str] | None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if "--debug" in extra:  # also after the subcommand: `replaygpu learner ... --debug`
        extra = [a for a in extra if a != "--debug"]
        args.debug = True
    if extra and not getattr(args, "pass_unknown", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:  # a command that parses its own flags (`learner`: they depend on --agent)
        args.options = extra + list(getattr(args, "options", []))
    level = "DEBUG" if args.debug else str(args.log_level).upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.debug:  # TensorFlow's checkpoint code logs every save through absl at INFO
        logging.getLogger("absl").setLevel(logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        raise  # main ends the command quietly
    except KeyboardInterrupt:
        print(f"replaygpu {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        missing = missing_dependency(err)
        if args.debug or not (missing or isinstance(err, expected_errors())):
            raise
        print(f"replaygpu {args.command}: error: {missing or one_line(err)}", file=sys.stderr)
        return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
