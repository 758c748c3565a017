"""docs/migrating.md: every replaygpu code block in the guide runs.

A block marked ``<!-- replaygpu: setup -->`` is run first in each fresh namespace; each block
marked ``<!-- replaygpu -->`` then runs in its own namespace, in a temporary working directory
(checkpoints land there; servers bind 127.0.0.1 port 0). The reference blocks of TF-Agents and
Reverb code carry no marker and are not run.
"""

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
#: replaygpu blocks the guide holds now; fewer means one was dropped or lost its marker
EXPECTED_SNIPPETS = 9

_BLOCK = re.compile(r"<!-- replaygpu(?P<setup>: setup)? -->\n```python\n(?P<code>.*?)\n```", re.S)


def guide_blocks() -> tuple[str, list[tuple[int, str]]]:
    """(the setup block, [(line number, code)] of the other replaygpu blocks)."""
    text = GUIDE.read_text(encoding="utf-8")
    setup, snippets = [], []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        (setup if match.group("setup") else snippets).append((line, match.group("code")))
    assert len(setup) == 1, f"expected one '<!-- replaygpu: setup -->' block, found {len(setup)}"
    return setup[0][1], snippets


SETUP, SNIPPETS = guide_blocks()


def test_guide_keeps_all_its_replaygpu_snippets():
    assert len(SNIPPETS) >= EXPECTED_SNIPPETS, (
        f"{GUIDE.name} has {len(SNIPPETS)} '<!-- replaygpu -->' python blocks, expected at least "
        f"{EXPECTED_SNIPPETS}"
    )
    text = GUIDE.read_text(encoding="utf-8")
    # every python block is either marked (run here) or a reference block of the old code
    fences = text.count("```python")
    assert fences > len(SNIPPETS) + 1, "the guide lost its TF-Agents / Reverb reference blocks"


def test_reference_blocks_are_not_marked_as_replaygpu():
    for _, code in SNIPPETS:
        assert "tf_agents" not in code and "reverb." not in code


@pytest.mark.parametrize("line, code", SNIPPETS, ids=[f"line{line}" for line, _ in SNIPPETS])
def test_snippet_runs(line, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "migrating_guide"}
    exec(compile(SETUP, f"{GUIDE}:setup", "exec"), namespace)
    # pad so a traceback's line numbers are the guide's
    exec(compile("\n" * (line - 1) + code, str(GUIDE), "exec"), namespace)
