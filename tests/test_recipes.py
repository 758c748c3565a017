"""docs/recipes.md: every recipe runs as a complete program, with its budget cut.

Each ``<!-- recipe -->`` block runs in its own namespace and temporary working directory, with
``STEPS`` set to 400 env steps and ``LEARNING_STARTS`` to 200, so that it acts, writes rows one
step at a time, traces and runs its fused update under XLA where it asks for it, updates its
target networks and evaluates. Learning itself is measured in benchmarks/README.md.
"""

import re
from pathlib import Path

import pytest
from markdown_blocks import Block, python_blocks, run_block

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
#: recipes the page holds now: Keras 3 DQN, DDPG, SAC, pixels on a frame table
EXPECTED = ["DQN CartPole", "DDPG Pendulum", "SAC Pendulum", "Pong"]
BLOCKS = [b for b in python_blocks(RECIPES) if b.marker == "recipe"]
CUTS = {"STEPS": 400, "LEARNING_STARTS": 200}


def cut_budget(block: Block) -> Block:
    code = block.code
    for name, value in CUTS.items():
        code, count = re.subn(rf"^{name} = .*$", f"{name} = {value}", code, flags=re.M)
        assert count == 1, f"the recipe at line {block.line} sets {name} {count} times"
    return Block(block.line, code, block.marker)


def test_the_page_keeps_its_four_recipes():
    assert [next(e for e in EXPECTED if e in b.code) for b in BLOCKS] == EXPECTED


@pytest.mark.parametrize("block", BLOCKS, ids=EXPECTED)
def test_recipe_runs(block, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_block(RECIPES, cut_budget(block), {"__name__": "recipe"})
    assert re.search(
        r"(greedy return -?\d+\.\d over 10 episodes|\d+ frame rows)", capsys.readouterr().out
    )
