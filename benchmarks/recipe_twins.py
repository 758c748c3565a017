"""Each recipe of `docs/recipes.md` against the same program on a plain numpy buffer (issue 36).

The twin is the recipe's own text with one line changed: ``import replaygpu as rg`` becomes
``import recipe_twins as rg``, whose `ReplayTable`, `Sampler` and `Learner` are what a Keras
user writes without replaygpu: one preallocated numpy array per field, a write per field each
env step, and per SGD step a numpy minibatch handed to the update in one ``tf.function`` (XLA
when the recipe asks for it). Everything else (networks, optimizers, exploration, the
evaluation, the seed) is the recipe's. Each (recipe, variant) runs in a fresh process, the
variants alternating, whole programs timed (imports, compilation and the evaluation included);
the summary gives medians and ratios. The pixel recipe is left out: its budget is a GPU's, and
its numpy twin would need frame stacks of its own. Run::

    python benchmarks/recipe_twins.py --recipes dqn ddpg sac --repeats 2
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
#: recipe name -> the heading its block follows
HEADINGS = {
    "dqn": "## DQN on CartPole",
    "ddpg": "## DDPG on Pendulum",
    "sac": "## SAC on Pendulum",
}
IMPORT = "import replaygpu as rg\n"


class ReplayTable:
    """A ring buffer of numpy arrays, one per field of ``spec``."""

    def __init__(self, spec: dict, capacity: int, **_: Any) -> None:
        self.capacity = int(capacity)
        self.arrays = {
            k: np.zeros((self.capacity, *s.shape), s.dtype.as_numpy_dtype) for k, s in spec.items()
        }
        self.size = self.next = 0

    def writer(self, chunk: int = 0) -> ReplayTable:
        """Rows are written in place at once: the table is its own writer."""
        return self

    def add(self, row: dict) -> None:
        for k, array in self.arrays.items():
            array[self.next] = row[k]
        self.next = (self.next + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)


class Sampler:
    """Uniform row indices drawn with numpy."""

    def __init__(self, table: ReplayTable, *_: Any, seed: int = 0) -> None:
        self.table, self.rng = table, np.random.default_rng(seed)

    def minibatch(self, batch_size: int) -> dict[str, np.ndarray]:
        rows = self.rng.integers(self.table.size, size=batch_size)
        return {k: array[rows] for k, array in self.table.arrays.items()}


class Learner:
    """``train(k)``: k SGD steps, each a numpy minibatch and one call of the compiled update."""

    def __init__(
        self,
        table: ReplayTable,
        sampler: Sampler,
        update_fn: Callable,
        batch_size: int,
        jit_compile: bool = False,
        **_: Any,
    ) -> None:
        import tensorflow as tf

        self.sampler, self.batch_size = sampler, batch_size
        self.step = tf.function(update_fn, jit_compile=jit_compile)

    def train(self, steps: int) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for _ in range(steps):
            metrics = self.step(self.sampler.minibatch(self.batch_size))
        return {"steps": steps, **{k: np.asarray(v) for k, v in metrics.items()}}


def recipe(name: str) -> str:
    """The Python block that follows ``name``'s heading in docs/recipes.md."""
    text = RECIPES.read_text()
    after = text[text.index(HEADINGS[name]) :]
    block = re.search(r"```python\n(.*?)```", after, re.S)
    if block is None or IMPORT not in block.group(1):
        raise SystemExit(f"{RECIPES}: no recipe block with {IMPORT.strip()!r} after {name}")
    return block.group(1)


def run(name: str, variant: str, steps: int | None = None) -> dict[str, float | str]:
    """One whole program in a fresh process (``steps``: its STEPS cut, for a smoke run): wall
    and CPU seconds, and its printed result."""
    code = recipe(name)
    if steps is not None:
        code = re.sub(r"^STEPS = [\d_]+", f"STEPS = {steps}", code, count=1, flags=re.M)
    if variant == "numpy":
        code = code.replace(IMPORT, "import recipe_twins as rg\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    found = re.search(r"greedy return (-?[\d.]+)", out.stdout)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "greedy_return": float(found.group(1)) if found else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", choices=sorted(HEADINGS), default=sorted(HEADINGS))
    parser.add_argument("--repeats", type=int, default=2, help="runs per (recipe, variant)")
    parser.add_argument("--steps", type=int, default=None, help="cut each recipe's STEPS")
    args = parser.parse_args()
    print(
        f"# {platform.node()}, python {platform.python_version()}, load "
        f"{os.getloadavg()[0]:.2f}; recipes of docs/recipes.md, seed 0, "
        f"{f'STEPS cut to {args.steps}' if args.steps else 'at their own budgets'}"
    )
    for name in args.recipes:
        results: dict[str, list[dict]] = {"numpy": [], "replaygpu": []}
        for i in range(args.repeats):
            order = ["numpy", "replaygpu"] if i % 2 == 0 else ["replaygpu", "numpy"]
            for variant in order:
                result = run(name, variant, args.steps)
                results[variant].append(result)
                print(
                    f"{name:5s} {variant:9s} run {i}: wall {result['wall_s']:6.1f} s, CPU "
                    f"{result['cpu_s']:6.1f} s, greedy return {result['greedy_return']:8.1f} "
                    f"(load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
        med = {
            v: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s")}
            for v, rs in results.items()
        }
        print(
            f"{name:5s} numpy / replaygpu (medians): wall "
            f"{med['numpy']['wall_s'] / med['replaygpu']['wall_s']:.2f}x, CPU "
            f"{med['numpy']['cpu_s'] / med['replaygpu']['cpu_s']:.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
