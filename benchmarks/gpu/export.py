"""Export the fused, XLA-compiled train calls for a GPU machine without TensorFlow.

For each case this writes, under ``--out``:

- ``CASE.hlo.pb``: the HLO module of ``learner.train_function`` for ``k`` steps
  (``experimental_get_compiler_ir(k)(stage="hlo_serialized")``, the device-neutral stage);
- ``CASE.inputs.npz``: the value of every parameter, in order (``num_steps``, then each
  captured variable: table fields, counters, the sampler's random state, networks, optimizer),
  except the ones the manifest marks generated (too large to carry; made on the device);
- ``CASE.reference.npz``: what one SGD step returned here from the same state (the metric
  vector and every variable it updated), for the parity check; absent for timing-only cases;
- ``CASE.json``: the manifest: parameter names, shapes, dtypes, which are generated, which
  output updates which parameter (HLO ``input_output_alias``), ``k``, and the CPU's own time.

Every learner runs its SGD steps in counted loops of ``chunk_steps = k`` (`rg.Learner`), so a
call of ``k`` steps is one loop whose trip count XLA knows. ``benchmarks/gpu/run.py`` (JAX, no
TensorFlow) reads these. Run:
    python benchmarks/gpu/export.py --out /tmp/gpu-kit            # every case (~2 GB of RAM
                                                                  # for the 1e6-frame table)
    python benchmarks/gpu/export.py --out /tmp/gpu-kit --quick    # small cases, for CI
    python benchmarks/gpu/export.py --out /tmp/gpu-kit --device-check  # dqn64 dqn256 r2d2-paper
                                                                       # atari
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/ for its helpers
from learner_throughput import make_data, uniform_learner

import replaygpu as rg

#: in a timing-only case, parameters larger than this are generated on the device
CARRY_LIMIT = 64 << 10
#: SGD steps of the parity call
PARITY_STEPS = 1
#: the reference keeps at most this many elements of each updated parameter (a fixed stride)
REFERENCE_ELEMENTS = 1 << 16
#: the cases of the device check (``check.py``, README "Counted loops on the GPU")
DEVICE_CHECK = ("dqn64", "dqn256", "r2d2-paper", "atari")


class Case:
    """One exported train call: a learner, its other stateful objects, and ``k``."""

    def __init__(
        self, name: str, learner: rg.Learner, owners: list[Any], k: int, parity: bool
    ) -> None:
        self.name, self.learner, self.k, self.parity = name, learner, k, parity
        self.owners = owners  # kept alive while the case is exported
        #: values to carry instead of a variable's own (``{id(variable): array}``)
        self.preset: dict[int, np.ndarray] = {}


def dqn_case(hidden: int, capacity: int, k: int) -> Case:
    """Seed 001's comparison: the double-DQN update of ``benchmarks/learner_throughput.py``
    (MLP ``hidden``x``hidden``, batch 256, obs 8, 4 actions), uniform in-graph sampling."""
    table = rg.ReplayTable(rg_spec(), capacity)
    table.append(make_data(capacity))
    learner = uniform_learner(table, hidden, jit=True, chunk_steps=k)
    return Case(f"dqn{hidden}", learner, [], k, parity=True)


def rg_spec() -> dict[str, tf.TensorSpec]:
    from common import dqn_spec

    return dqn_spec(8)


def built(config: Any, fill: int, k: int, seed: int = 0) -> tuple[rg.Learner, Any]:
    """The served learner of ``config`` (its builder's table, agent and sampler), its table
    filled with ``fill`` random rows, its calls of ``k`` steps one counted loop
    (``chunk_steps=k``)."""
    from replaygpu.agents.builder import make_parts

    parts = make_parts(config)
    if fill:
        parts.table.append(random_rows(parts.table.spec, fill, seed, actions=2))
    learner = rg.Learner(
        parts.table,
        parts.sampler,
        parts.agent.update,
        config.batch_size,
        jit_compile=True,
        autograph=True,
        chunk_steps=k,
    )
    return learner, parts.agent


def random_rows(spec: dict, n: int, seed: int, actions: int) -> dict[str, np.ndarray]:
    """``n`` random rows of ``spec``: 2% episode ends, small floats, actions in range."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, leaf in spec.items():
        shape = [n, *leaf.shape]
        if leaf.dtype == tf.bool:
            out[name] = rng.random(shape) < 0.02
        elif leaf.dtype == tf.uint8:
            out[name] = rng.integers(0, 256, shape, dtype=np.uint8)
        elif leaf.dtype.is_floating:
            out[name] = rng.standard_normal(shape).astype(leaf.dtype.as_numpy_dtype)
        else:
            out[name] = rng.integers(0, actions, shape).astype(leaf.dtype.as_numpy_dtype)
    if "first" in out:  # a frame table: a reset frame after each final row
        out["first"][1:] |= out["final"][:-1]
    if "state_stored" in out:
        out["state_stored"][::10] = True
    return out


def atari_case(capacity: int, fill: int, k: int, parity: bool) -> Case:
    """Ape-X on Atari: the Nature CNN on prioritized 4-frame stacks with 3-step returns."""
    from replaygpu.agents.dqn.config import ApexAtariConfig

    config = ApexAtariConfig(
        env_id="ALE/Pong-v5",
        buffer_size=capacity,
        learning_starts=64,
        segment_steps=256,
        jit_compile="on",
    )
    learner, agent = built(config, fill, k)
    name = "atari" if parity else f"atari-{capacity:.0e}".replace("+0", "")
    case = Case(name, learner, [agent], k, parity)
    if not fill:  # timing only: the table counts as full (its rows are generated there)
        table = learner.table
        full = np.asarray(capacity, np.int64)
        case.preset = {id(table.size_var): full, id(table.inserted_var): full}
    return case


def sac_case(capacity: int, k: int) -> Case:
    from replaygpu.agents.sac.config import SACLearnerConfig

    learner, agent = built(SACLearnerConfig(buffer_size=capacity), capacity, k)
    return Case("sac", learner, [agent], k, parity=True)


def r2d2_case(capacity: int, k: int) -> Case:
    from replaygpu.agents.r2d2.config import R2D2LearnerConfig

    learner, agent = built(R2D2LearnerConfig(buffer_size=capacity), capacity, k)
    return Case("r2d2", learner, [agent], k, parity=True)


def r2d2_paper_case(k: int) -> Case:
    """R2D2 at the paper's shape (issue 35): batch 64, burn-in 40 + unroll 80, LSTM 64, the
    state stored every 40 steps; the LSTM runs in a loop over time (XLA)."""
    from replaygpu.agents.r2d2.config import R2D2LearnerConfig

    config = R2D2LearnerConfig(
        sequence_length=120,
        burn_in=40,
        period=40,
        lstm_units=64,
        torso_size=64,
        batch_size=64,
        buffer_size=8192,
    )
    learner, agent = built(config, config.buffer_size, k)
    return Case("r2d2-paper", learner, [agent], k, parity=True)


def keras_case(net: str, variant: str, k: int) -> Case:
    """One update of ``benchmarks/keras_layers.py`` (issue 36, item 5): DQN on ``net`` (an MLP
    or the Nature CNN) of plain variables with a plain Adam ("hand-written") or Keras layers with
    Keras's Adam, as measured on the H200 before the agents moved to Keras layers."""
    import keras_layers

    rows = 64 if net == "cnn" else None  # 64 frame-stack rows (3.6 MB): the kit is carried
    table = keras_layers.table(net, rows)
    learner = keras_layers.learner(net, variant, table, xla=True, chunk_steps=k)
    return Case(f"{net}-{'keras' if variant == 'keras' else 'hand'}", learner, [], k, parity=True)


def cases(quick: bool) -> dict[str, Callable[[], Case]]:
    """The cases by name, each made only when exported."""
    if quick:
        return {
            "dqn64": lambda: dqn_case(64, 4096, 10),
            "atari": lambda: atari_case(1024, 1024, 2, parity=True),
            "sac": lambda: sac_case(4096, 10),
        }
    return {
        "dqn64": lambda: dqn_case(64, 50_000, 100),
        "dqn256": lambda: dqn_case(256, 50_000, 100),
        "atari": lambda: atari_case(1024, 1024, 10, parity=True),
        "sac": lambda: sac_case(50_000, 100),
        "r2d2": lambda: r2d2_case(20_000, 10),
        "atari-1e6": lambda: atari_case(1_000_000, 0, 10, parity=False),
        "r2d2-paper": lambda: r2d2_paper_case(10),
        "mlp-hand": lambda: keras_case("mlp", "hand-written", 100),
        "mlp-keras": lambda: keras_case("mlp", "keras", 100),
        "cnn-hand": lambda: keras_case("cnn", "hand-written", 20),
        "cnn-keras": lambda: keras_case("cnn", "keras", 20),
    }


def export(case: Case, out: Path) -> dict[str, Any]:
    """Write the case's files; return its manifest."""
    fn = case.learner.train_function
    k = tf.constant(case.k, tf.int64)
    hlo = fn.experimental_get_compiler_ir(k)(stage="hlo_serialized")
    concrete = fn.get_concrete_function(k)
    by_handle = {id(v.handle): v for v in concrete.variables}
    params = [{"name": "num_steps", "shape": [], "dtype": "int64"}]
    values: dict[str, np.ndarray] = {"p0": np.asarray(case.k, np.int64)}
    for i, handle in enumerate(concrete.captured_inputs, start=1):
        var = by_handle.get(id(handle))
        if var is None:
            raise RuntimeError(f"{case.name}: captured input {i} is no variable of the case")
        size = var.shape.num_elements() * var.dtype.size
        generated = not case.parity and size > CARRY_LIMIT
        params.append(
            {
                "name": var.name,
                "shape": var.shape.as_list(),
                "dtype": var.dtype.name,
                "generated": generated,
            }
        )
        if not generated:
            values[f"p{i}"] = case.preset.get(id(var), var.numpy())
    out.joinpath(f"{case.name}.hlo.pb").write_bytes(hlo)
    np.savez_compressed(out / f"{case.name}.inputs.npz", **values)
    manifest = {
        "name": case.name,
        "k": case.k,
        "chunk_steps": case.learner.chunk_steps,
        "params": params,
        "parity": case.parity,
    }
    if case.parity:
        # One SGD step from the exported state, compiled here by XLA:CPU. One, not k: Adam
        # turns a last-bit difference of a near-zero gradient into a step of the learning
        # rate, and k steps of that hide what a second implementation really changes.
        start = time.perf_counter()
        result = fn(tf.constant(PARITY_STEPS, tf.int64)).numpy()
        manifest["cpu_seconds_first_call"] = time.perf_counter() - start
        manifest["parity_steps"] = PARITY_STEPS
        after = {"result": result}
        for i, handle in enumerate(concrete.captured_inputs, start=1):
            now = by_handle[id(handle)].numpy()
            if not np.array_equal(now, values[f"p{i}"]):  # what the call updated
                after[f"p{i}"] = reference_slice(now)
        np.savez_compressed(out / f"{case.name}.reference.npz", **after)
        manifest["reference_elements"] = REFERENCE_ELEMENTS
        manifest["metrics"] = ["steps", *case.learner.metric_names]
        times = []
        for _ in range(3):
            start = time.perf_counter()
            fn(k).numpy()
            times.append(time.perf_counter() - start)
        manifest["cpu_steps_per_s"] = case.k / float(np.median(times))
    out.joinpath(f"{case.name}.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def reference_slice(value: np.ndarray) -> np.ndarray:
    """At most `REFERENCE_ELEMENTS` elements of ``value``, flat with a fixed stride (``run.py``
    compares the same slice)."""
    flat = value.reshape(-1)
    stride = -(-flat.size // REFERENCE_ELEMENTS)
    return flat[::stride]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the kit's files")
    parser.add_argument("--quick", action="store_true", help="small cases (CI)")
    parser.add_argument("--cases", nargs="*", help="only these cases (names as printed)")
    parser.add_argument(
        "--device-check",
        action="store_true",
        help=f"only the device check's cases ({', '.join(DEVICE_CHECK)})",
    )
    args = parser.parse_args()
    if args.device_check:
        args.cases = [*(args.cases or []), *DEVICE_CHECK]
    args.out.mkdir(parents=True, exist_ok=True)
    tf.random.set_seed(0)
    for name, make in cases(args.quick).items():
        if args.cases and name not in args.cases:
            continue
        start = time.perf_counter()
        case = make()
        manifest = export(case, args.out)
        carried = sum(f.stat().st_size for f in args.out.glob(f"{case.name}.*"))
        cpu = manifest.get("cpu_steps_per_s")
        print(
            f"{case.name}: k={case.k}, {len(manifest['params'])} parameters, "
            f"{carried / 2**20:.1f} MiB to carry"
            + (f", {cpu:.0f} SGD steps/s here (XLA:CPU, TensorFlow)" if cpu else "")
            + f" [{time.perf_counter() - start:.0f} s]",
            flush=True,
        )
        del case


if __name__ == "__main__":
    main()
