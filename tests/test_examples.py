"""examples/: every program runs as it stands, and the docs show each one.

A recipe (docs/recipes.md) runs with ``STEPS`` cut to 400 env steps and ``LEARNING_STARTS`` to
200, so that it acts, writes rows one step at a time, traces and runs its fused update (under
XLA where it asks for it), updates its target networks and evaluates; learning itself is
measured in benchmarks/. The migration guide's program runs whole. Each runs in its own
namespace and temporary working directory, compiled under its own path so that AutoGraph finds
the source of the functions it defines.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
#: recipe -> the line it prints last: a greedy evaluation, or the frame table's rows
RECIPES = {
    "dqn_cartpole.py": r"greedy return -?\d+\.\d over 10 episodes",
    "ddpg_pendulum.py": r"greedy return -?\d+\.\d over 10 episodes",
    "sac_pendulum.py": r"greedy return -?\d+\.\d over 10 episodes",
    "pixels_pong.py": r"\d+ frame rows",
}
PROGRAMS = sorted(p.name for p in EXAMPLES.glob("*.py"))
CUTS = {"STEPS": 400, "LEARNING_STARTS": 200}
SECTION = re.compile(r"^# --8<-- \[start:(\w+)\]$", re.M)


def cut_budget(name: str, code: str) -> str:
    for constant, value in CUTS.items():
        code, count = re.subn(rf"^{constant} = .*$", f"{constant} = {value}", code, flags=re.M)
        assert count == 1, f"{name} sets {constant} {count} times"
    return code


def test_the_examples_are_the_four_recipes_and_the_migration_guide():
    assert sorted([*RECIPES, "migrating.py"]) == PROGRAMS


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", PROGRAMS)
def test_example_runs_as_a_complete_program(name, tmp_path, monkeypatch, capsys):
    path = EXAMPLES / name
    code = path.read_text(encoding="utf-8")
    if name in RECIPES:
        code = cut_budget(name, code)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(path), "exec"), {"__name__": "__main__"})
    if name in RECIPES:
        assert re.search(RECIPES[name], capsys.readouterr().out)


def test_every_example_and_every_section_is_shown_in_the_docs_once():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in DOCS.rglob("*.md"))
    for name in PROGRAMS:
        sections = SECTION.findall((EXAMPLES / name).read_text(encoding="utf-8"))
        for include in [f"examples/{name}:{s}" for s in sections] or [f"examples/{name}"]:
            assert pages.count(f'--8<-- "{include}"') == 1, f"docs include {include} not once"
