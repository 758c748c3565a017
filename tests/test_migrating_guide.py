"""docs/migrating.md: every replaygpu code block in the guide runs.

A block marked ``<!-- replaygpu: setup -->`` is run first in each fresh namespace; each block
marked ``<!-- replaygpu -->`` then runs in its own namespace, in a temporary working directory
(checkpoints land there; servers bind 127.0.0.1 port 0). The reference blocks of TF-Agents and
Reverb code carry no marker and are not run.
"""

from pathlib import Path

import pytest
from markdown_blocks import python_blocks, run_block

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "migrating.md"
#: replaygpu blocks the guide holds now; fewer means one was dropped or lost its marker
EXPECTED_SNIPPETS = 9

BLOCKS = python_blocks(GUIDE)
SETUPS = [b for b in BLOCKS if b.marker == "replaygpu: setup"]
SNIPPETS = [b for b in BLOCKS if b.marker == "replaygpu"]


def test_guide_keeps_all_its_replaygpu_snippets():
    assert len(SETUPS) == 1, f"expected one '<!-- replaygpu: setup -->' block, found {len(SETUPS)}"
    assert len(SNIPPETS) >= EXPECTED_SNIPPETS, (
        f"{GUIDE.name} has {len(SNIPPETS)} '<!-- replaygpu -->' python blocks, expected at least "
        f"{EXPECTED_SNIPPETS}"
    )
    # every python block is either marked (run here) or a reference block of the old code
    assert len(BLOCKS) > len(SNIPPETS) + 1, "the guide lost its TF-Agents / Reverb reference blocks"


def test_reference_blocks_are_not_marked_as_replaygpu():
    for block in SNIPPETS:
        assert "tf_agents" not in block.code and "reverb." not in block.code


@pytest.mark.parametrize("block", SNIPPETS, ids=[f"line{b.line}" for b in SNIPPETS])
def test_snippet_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "migrating_guide"}
    run_block(GUIDE, SETUPS[0], namespace)
    run_block(GUIDE, block, namespace)
