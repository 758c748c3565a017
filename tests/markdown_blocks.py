"""Run the Python code blocks of a Markdown file: what the tests of README.md and
docs/migrating.md share.

A block is a fenced ``python`` block, optionally marked by an HTML comment on the line before
it (``<!-- replaygpu -->``, ``<!-- replaygpu: setup -->``), which a test may use to pick blocks.
A block runs with `run_block`, compiled under the Markdown file's name and padded so that its
line numbers are the file's: a traceback points into the Markdown file, and AutoGraph (which
reads a function's source through them) finds the source of functions the block defines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_FENCE = re.compile(r"(?:<!-- (?P<marker>[^\n]*?) -->\n)?```python\n(?P<code>.*?)\n```", re.S)


@dataclass(frozen=True)
class Block:
    """A ``python`` block of a Markdown file: its first code line (1-based), code and marker
    (the text of the comment before it; None without one)."""

    line: int
    code: str
    marker: str | None


def python_blocks(path: Path) -> list[Block]:
    """Every ``python`` block of the Markdown file ``path``, in order."""
    text = path.read_text(encoding="utf-8")
    return [
        Block(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("marker"))
        for m in _FENCE.finditer(text)
    ]


def run_block(path: Path, block: Block, namespace: dict[str, Any]) -> None:
    """Execute ``block`` of the Markdown file ``path`` in ``namespace``."""
    code = "\n" * (block.line - 1) + block.code
    exec(compile(code, str(path), "exec"), namespace)
