"""docs/: the site builds with warnings as errors, its Python blocks (and the README's) run, and
its API reference covers the public modules.

A block is a fenced ``python`` block; it runs in a fresh namespace in a temporary working
directory, as a reader would paste it into a file (the test session's two logical CPU devices,
conftest.py, stand in for the two GPUs of the several-GPU page). Two kinds do not run here: a
block that includes a program from examples/ (``--8<--``; tests/test_examples.py runs those)
and a block marked ``<!-- reference: not run -->`` (another library's code, shown beside ours).
"""

import importlib.util
import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
from markdown_blocks import python_blocks, run_block

import replaygpu

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: the docs pages and the README, whose blocks run here alike
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
BLOCKS = [
    (page, block)
    for page in PAGES
    for block in python_blocks(page)
    if block.marker != "reference: not run" and not block.code.startswith("--8<--")
]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's notice, not a warning
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    assert (tmp_path / "reference" / "core" / "index.html").is_file()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "page, block", BLOCKS, ids=[f"{p.relative_to(ROOT)}:{b.line}" for p, b in BLOCKS]
)
def test_python_block_runs_as_a_complete_program(page, block, tmp_path, monkeypatch):
    ellipses = [tok for tok in tokenize.generate_tokens(io.StringIO(block.code).readline)
                if tok.string == "..."]  # fmt: skip
    assert not ellipses, "a fragment with `...`: write the block as a program that runs"
    monkeypatch.chdir(tmp_path)
    run_block(page, block, {"__name__": "__main__"})


def test_the_docs_keep_their_runnable_blocks():
    # the learner, tables, samplers, checkpoints, service, several-GPU and Ray pages: a program each
    pages = {page.relative_to(DOCS).as_posix() for page, _ in BLOCKS if page.parent != ROOT}
    expected = {
        *(f"concepts/{name}.md" for name in ("learner", "tables", "samplers", "checkpoints")),
        *(f"deployment/{name}.md" for name in ("multi-gpu", "ray")),
        "service/index.md",
    }
    assert expected <= pages, expected - pages


def test_the_api_reference_documents_each_public_module_and_rg_name():
    text = "\n".join(p.read_text(encoding="utf-8") for p in (DOCS / "reference").glob("*.md"))
    directives = re.findall(r"^::: ([\w.]+)$", text, re.M)
    modules = [d for d in directives if _is_module(d)]
    objects = [d.rsplit(".", 1) for d in directives if not _is_module(d)]
    assert sorted(modules) == sorted(set(replaygpu.PUBLIC_MODULES) - {"replaygpu"})
    # the core page: rg's own names, each from the module that defines it
    for module, name in objects:
        assert name in replaygpu.__all__ and getattr(replaygpu, name).__module__ == module, name


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module, not a module
        return False


def test_the_benchmarks_page_links_every_dated_log_and_only_files_that_exist():
    readme = ROOT / "benchmarks" / "README.md"
    links = re.findall(r"\]\(([^)#\s]+)\)", readme.read_text(encoding="utf-8"))
    missing = [link for link in links if not (readme.parent / link).exists()]
    assert not missing, f"benchmarks/README.md links files that are not there: {missing}"
    logs = {p.relative_to(readme.parent).as_posix() for p in readme.parent.glob("results/*.md")}
    assert logs <= set(links), f"dated logs the page does not link: {sorted(logs - set(links))}"
