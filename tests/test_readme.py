"""README.md: every Python block is a complete program, and runs; its links work on the package
index (absolute, not relative to the repository).

Each block runs in a fresh namespace in a temporary working directory (checkpoints land there,
servers bind 127.0.0.1 port 0), as a reader would paste it into a file. The docs' blocks run in
tests/test_docs.py, the programs of examples/ in tests/test_examples.py.
"""

import io
import re
import tokenize
from pathlib import Path

import pytest
from markdown_blocks import python_blocks, run_block

README = Path(__file__).resolve().parents[1] / "README.md"
#: Python blocks the README holds now (the library, the service); the rest live in docs/
EXPECTED_BLOCKS = 2
#: where the README's links point (pyproject.toml's project URLs name the same repository)
REPOSITORY = "https://github.com/replaygpu/replaygpu"

BLOCKS = python_blocks(README)


def test_readme_keeps_its_python_blocks():
    assert len(BLOCKS) >= EXPECTED_BLOCKS, (
        f"README.md has {len(BLOCKS)} python blocks, expected at least {EXPECTED_BLOCKS}"
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", BLOCKS, ids=[f"line{b.line}" for b in BLOCKS])
def test_python_block_runs_as_a_complete_program(block, tmp_path, monkeypatch):
    ellipses = [tok for tok in tokenize.generate_tokens(io.StringIO(block.code).readline)
                if tok.string == "..."]  # fmt: skip
    assert not ellipses, "a fragment with `...`: write the block as a program that runs"
    monkeypatch.chdir(tmp_path)
    run_block(README, block, {"__name__": "__main__"})


def test_links_are_absolute_so_they_work_on_the_package_index():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'(?:href|src)="([^"]+)"', text)
    relative = [t for t in targets if not re.match(r"[a-z]+:|#", t)]
    assert not relative, (
        f"relative links (they break on PyPI; link {REPOSITORY}/blob/main/...): {relative}"
    )
    assert any(t.startswith(f"{REPOSITORY}/blob/main/") for t in targets)
