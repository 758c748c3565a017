"""Each recipe of `docs/recipes.md` (its program in `examples/`) against the same program on a
plain numpy buffer (issue 36).

The twin is the recipe's own text with one line changed: ``import replaygpu as rg`` becomes
``import recipe_twins as rg``, whose `ReplayTable`, `Sampler` and `Learner` are what a Keras
user writes without replaygpu: one preallocated numpy array per field, a write per field each
env step, and per SGD step a numpy minibatch handed to the update in one ``tf.function`` (XLA
when the recipe asks for it). Everything else (networks, optimizers, exploration, the
evaluation, the seed) is the recipe's. The pixel recipe's twin also takes its
``make_frame_table`` from here: one numpy row per frame, as the recipe's table stores them, and
the ``[B, 4, 84, 84]`` stacks gathered in numpy per minibatch, by the rules of `rg.FrameStack`
(an episode's first frame repeated before it; no final row, none whose next frame is unwritten).

Each (recipe, variant) runs in a fresh process, the variants alternating, whole programs timed
(imports, compilation and the evaluation included); the summary gives medians and ratios.
``--set NAME=VALUE`` replaces a recipe's top-level constant, to cut a budget meant for a GPU::

    python benchmarks/recipe_twins.py --recipes dqn ddpg sac --repeats 2
    python benchmarks/recipe_twins.py --recipes pixels --set STEPS=30000 LEARNING_STARTS=5000
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

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
#: recipe name -> its program in examples/ (docs/recipes.md shows each)
PROGRAMS = {
    "dqn": "dqn_cartpole.py",
    "ddpg": "ddpg_pendulum.py",
    "sac": "sac_pendulum.py",
    "pixels": "pixels_pong.py",
}
IMPORT = "import replaygpu as rg\n"
#: the lines the twin changes: the buffer's imports, nothing else
FRAME_TABLE = "import make_frame_table\n"
TWIN = {
    IMPORT: "import recipe_twins as rg\n",
    f"from replaygpu.samplers {FRAME_TABLE}": f"from recipe_twins {FRAME_TABLE}",
}


class ReplayTable:
    """A ring buffer of numpy arrays, one per field of ``spec``."""

    def __init__(self, spec: dict, capacity: int, **_: Any) -> None:
        self.capacity = int(capacity)
        self.arrays = {
            k: np.zeros((self.capacity, *s.shape), s.dtype.as_numpy_dtype) for k, s in spec.items()
        }
        self.size = self.next = 0
        self.nbytes = sum(a.nbytes for a in self.arrays.values())
        self.device = "numpy"

    def writer(self, chunk: int = 0) -> ReplayTable:
        """Rows are written in place at once: the table is its own writer."""
        return self

    def flush(self) -> int:
        """Nothing is staged."""
        return 0

    def add(self, row: dict) -> None:
        for k, array in self.arrays.items():
            array[self.next] = row[k]
        self.next = (self.next + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)


def make_frame_table(capacity: int, frame_shape: tuple[int, ...] = (84, 84)) -> ReplayTable:
    """A numpy ring of frame-table rows (the same fields and dtypes as replaygpu's)."""
    from replaygpu.samplers import make_frame_spec

    return ReplayTable(make_frame_spec(frame_shape), capacity)


class Uniform:
    """Rows drawn uniformly (the only distribution the recipes use)."""


class FrameStack:
    """Marks a sampler as one of frame stacks of ``stack`` frames."""

    def __init__(self, stack: int) -> None:
        self.stack = int(stack)


class Sampler:
    """Uniform row indices drawn with numpy; with a `FrameStack`, transitions with stacks."""

    def __init__(self, table: ReplayTable, *views: Any, seed: int = 0) -> None:
        self.table, self.rng = table, np.random.default_rng(seed)
        self.stack = next((v.stack for v in views if isinstance(v, FrameStack)), None)

    def minibatch(self, batch_size: int) -> dict[str, np.ndarray]:
        if self.stack is not None:
            return self.frame_stacks(batch_size)
        rows = self.rng.integers(self.table.size, size=batch_size)
        return {k: array[rows] for k, array in self.table.arrays.items()}

    def frame_stacks(self, batch_size: int) -> dict[str, np.ndarray]:
        """Valid rows drawn by rejection, with their obs and next_obs stacks."""
        table = self.table
        oldest = (table.next - table.size) % table.capacity
        picked: list[np.ndarray] = []
        while sum(len(p) for p in picked) < batch_size:
            rows = (oldest + self.rng.integers(table.size, size=2 * batch_size)) % table.capacity
            picked.append(rows[self.history(rows)[1]])
        return self.read(np.concatenate(picked)[:batch_size])

    def history(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Frames back to each row's episode start (<= k-1), and whether the row is drawable:
        not final, its next frame written and of its episode, its stack within the ring."""
        table, k, cap = self.table, self.stack, self.table.capacity
        first, final = table.arrays["first"], table.arrays["final"]
        looked_back = first[(rows[:, None] - np.arange(k)) % cap]
        looked_back[:, -1] = True
        dist = looked_back.argmax(axis=1)
        oldest = (table.next - table.size) % cap
        valid = (
            ~final[rows]
            & ((table.next - 1 - rows) % cap >= 1)
            & ~first[(rows + 1) % cap]
            & (dist <= (rows - oldest) % cap)
        )
        return dist, valid

    def read(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The transitions of drawable ``rows``: stacks of k frames, the first one repeated
        before an episode's start, and next_obs one frame on."""
        table, k = self.table, self.stack
        back = np.minimum(np.arange(k - 1, -2, -1)[None, :], self.history(rows)[0][:, None])
        frames = table.arrays["frame"][(rows[:, None] - back) % table.capacity]
        batch = {"obs": frames[:, :k], "next_obs": frames[:, 1:]}
        for name in ("action", "reward", "terminated", "truncated"):
            batch[name] = table.arrays[name][rows]
        return batch


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
    """The program of recipe ``name``, from examples/."""
    path = EXAMPLES / PROGRAMS[name]
    code = path.read_text()
    if IMPORT not in code:
        raise SystemExit(f"{path}: the recipe does not {IMPORT.strip()!r}")
    return code


def run(name: str, variant: str, constants: dict[str, str]) -> dict[str, Any]:
    """One whole program in a fresh process, ``constants`` (name -> value) replacing the
    recipe's: wall and CPU seconds, and the last line it printed (its result)."""
    code = recipe(name)
    for constant, value in constants.items():
        code, count = re.subn(rf"^{constant} = .*$", f"{constant} = {value}", code, flags=re.M)
        if count != 1:
            raise SystemExit(f"--set {constant}: the {name} recipe sets it {count} times")
    if variant == "numpy":
        for line, twin in TWIN.items():
            code = code.replace(line, twin)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    lines = out.stdout.strip().splitlines()
    return {"wall_s": wall, "cpu_s": cpu, "printed": lines[-1] if lines else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", choices=sorted(PROGRAMS), default=sorted(PROGRAMS))
    parser.add_argument("--repeats", type=int, default=2, help="runs per (recipe, variant)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="replace the recipes' top-level constants, e.g. STEPS=30000 LEARNING_STARTS=5000",
    )
    args = parser.parse_args()
    constants = dict(item.split("=", 1) for item in args.set)
    print(
        f"# {platform.node()}, python {platform.python_version()}, load "
        f"{os.getloadavg()[0]:.2f}; recipes of docs/recipes.md, seed 0, "
        f"{' '.join(args.set) if args.set else 'at their own budgets'}"
    )
    for name in args.recipes:
        results: dict[str, list[dict]] = {"numpy": [], "replaygpu": []}
        for i in range(args.repeats):
            order = ["numpy", "replaygpu"] if i % 2 == 0 else ["replaygpu", "numpy"]
            for variant in order:
                result = run(name, variant, constants)
                results[variant].append(result)
                print(
                    f"{name:5s} {variant:9s} run {i}: wall {result['wall_s']:6.1f} s, CPU "
                    f"{result['cpu_s']:6.1f} s (load {os.getloadavg()[0]:.2f}) | "
                    f"{result['printed']}",
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
