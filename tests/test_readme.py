"""README.md: it keeps its Python blocks, and its links work on the package index (absolute, not
relative to the repository). Its blocks run in tests/test_docs.py, as the docs pages' do.
"""

import re
from pathlib import Path

from markdown_blocks import python_blocks

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


def test_links_are_absolute_so_they_work_on_the_package_index():
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'(?:href|src)="([^"]+)"', text)
    relative = [t for t in targets if not re.match(r"[a-z]+:|#", t)]
    assert not relative, (
        f"relative links (they break on PyPI; link {REPOSITORY}/blob/main/...): {relative}"
    )
    assert any(t.startswith(f"{REPOSITORY}/blob/main/") for t in targets)
