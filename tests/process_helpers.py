"""Helpers for tests that run ``python -m replaygpu ...`` subprocesses (a learner, actors)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

#: the subprocesses' environment: TensorFlow's C++ log quiet
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def cli(*args: str) -> list[str]:
    """The command line of ``replaygpu ARGS`` in this interpreter."""
    return [sys.executable, "-m", "replaygpu", *args]


def wait_for_line(proc: subprocess.Popen, pattern: str, lines: list[str]) -> re.Match:
    """Read ``proc``'s stderr until a line matches ``pattern`` (the lines read go to ``lines``)."""
    for line in proc.stderr:
        lines.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"{pattern!r} never printed:\n{''.join(lines[-40:])}")


def reap(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it still runs (a failed test leaves no process behind)."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
