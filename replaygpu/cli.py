"""The `replaygpu` command line: ``serve``, ``info``, ``health``, and those installed packages add.

A subcommand's module has ``register(subparsers)``; the library's is
`replaygpu.service.ops.commands`, others come from `COMMAND_GROUP` entry points (the agents'
``demo``, ``eval``, ``learner``, ``actor``), so the library names none. No TensorFlow import
here: `replaygpu --help` starts fast.

Expected failures (bad flags, values or files, unknown env id, unwritable folder, unreachable
server, missing optional dependency) end with one stderr line and exit status 2 (``--debug``:
the traceback), at once, as flags are checked before TensorFlow is imported.
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
    """Errors as one stderr line, ``PROG: error: MESSAGE``, exit status `USAGE_ERROR`, no usage
    block; subcommand parsers are of this class too."""

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
    # the library's module, then `COMMAND_GROUP`'s by entry name, each once
    added = sorted(entry_points(group=COMMAND_GROUP), key=lambda entry: entry.name)
    for module_name in dict.fromkeys(["replaygpu.service.ops.commands", *(e.value for e in added)]):
        importlib.import_module(module_name).register(sub)
    return parser


def expected_errors() -> tuple[type[BaseException], ...]:
    """The user's errors, reported in one line: the library's (commands raise `ConfigError` for
    bad files, values, addresses) and gymnasium's, if loaded; others keep their traceback."""
    from replaygpu.errors import ReplayError

    kinds: list[type[BaseException]] = [ReplayError]
    gym_error = sys.modules.get("gymnasium.error")
    if gym_error is not None:
        kinds.append(gym_error.Error)
    return tuple(kinds)


def missing_dependency(err: BaseException) -> str | None:
    """One line on what to install for a missing optional dependency (`EXTRAS`), else None."""
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
    """The `replaygpu` console script; a closed pipe (``| head -3``) ends it quietly with
    `CLOSED_PIPE`, as ``cat`` does."""
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
