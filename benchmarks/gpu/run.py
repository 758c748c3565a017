"""Run the exported train calls on whatever device JAX has: parity, SGD steps/s, memory, and the
same DQN update in JAX + flashbax beside them.

Needs JAX (0.11.2 was used; Python 3.12), numpy, and for the DQN baselines flashbax and optax;
no TensorFlow, no replaygpu. For each ``CASE.json`` that ``export.py`` wrote into ``--kit``:

1. the HLO is converted to StableHLO (``hlo_to_stablehlo``); the ``mhlo.copy`` ops the
   conversion leaves are replaced by their inputs (the CUDA plugin refuses them; a copy changes
   no value) and the module is compiled for the first JAX device;
2. parity: one SGD step from the exported state, compared with what TensorFlow computed on the
   exporting machine (integers, the random state and counters among them, must be identical;
   floats within ``--rtol``); timing-only cases (a table generated on the device) skip it;
3. timing: ``--repeats`` calls, each fed the variables the previous one updated, as the learner
   runs; SGD steps/s is the steps the call reports over the median call time;
4. the loops XLA compiled (``hlo_loops``, from the optimized HLO of this device): each
   ``while`` with its op name and known trip count or none, and the kernels of one SGD step
   (the body of the counted ``sgd_steps`` loop);
5. the device's peak memory (GPUs report it; the CPU does not);
6. for the DQN cases, the same update (double DQN, Huber, Adam 1e-3, Polyak 0.005, batch 256)
   in JAX: (a) fused: a flashbax item buffer on the device and ``lax.scan`` over k steps per call;
   (b) fed per step: numpy indices and gather on the host, one jitted step per SGD step
   (seed 001's comparison, numpy host feed against the fused loop);
7. with ``--roundtrip``, the pure-JAX pair of ``roundtrip.py`` (a counted against an uncounted
   loop of one small body).

One process runs under one ``XLA_FLAGS`` (XLA reads it once); ``check.py`` runs this once per
flag set. The ``--json`` report is rewritten after each case, so a run cut short keeps what it
finished.

Run:
    python benchmarks/gpu/run.py --kit /tmp/gpu-kit             # every case in the folder
    python benchmarks/gpu/run.py --kit /tmp/gpu-kit --repeats 3 --json out.json --roundtrip
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import hlo_loops
import jax
import roundtrip

jax.config.update("jax_enable_x64", True)  # the learner's counters and random state are int64

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax._src import xla_bridge  # noqa: E402
from jax._src.interpreters import mlir as jax_mlir  # noqa: E402
from jax._src.lib import _jax  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402

ALIAS = re.compile(r"parameter_number = (\d+) : i64\}, output_index = array<i64: (\d+)>")


def compile_hlo(hlo: bytes, device: Any) -> tuple[Any, dict[int, int]]:
    """The executable of an HLO module on ``device`` and its ``{output: parameter}`` aliases."""
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(_jax.mlir.hlo_to_stablehlo(hlo))
        pairs = ALIAS.findall(str(module.operation.attributes["mhlo.input_output_alias"]))
        aliases = {int(out): int(param) for param, out in pairs}
        copies: list[Any] = []

        def walk(op: Any) -> None:
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        if inner.operation.name == "mhlo.copy":
                            copies.append(inner)
                        walk(inner.operation)

        walk(module.operation)
        for op in copies:
            op.result.replace_all_uses_with(op.operands[0])
            op.operation.erase()
        # with its locations, which carry TensorFlow's op names into the compiled HLO's
        # metadata (`sgd_chunks/sgd_steps`, ...), where `hlo_loops` finds the loops by name
        text = module.operation.get_asm(enable_debug_info=True)
    backend = xla_bridge.get_backend(device.platform)
    exe = backend.compile_and_load(text, _jax.DeviceList((device,)), _jax.CompileOptions())
    return exe, aliases


def generated(param: dict[str, Any], key: Any, device: Any) -> jax.Array:
    """A parameter too large to carry, made on the device: frames (uint8 of rank >= 3) random
    (4096 random rows, repeated), other integers 0, floats uniform in [0, 0.01). The shapes,
    and so every op's cost, are the real ones; the values are not (such cases are timed, not
    compared)."""
    shape, dtype = tuple(param["shape"]), np.dtype(param["dtype"])
    with jax.default_device(device):
        if dtype == np.uint8 and len(shape) >= 3:
            # random rows repeated: a draw of the whole table would take 4 bytes a pixel
            block = jax.random.bits(key, (min(shape[0], 4096), *shape[1:]), dtype=jnp.uint8)
            return jnp.resize(block, shape)
        if np.issubdtype(dtype, np.floating):
            return jax.random.uniform(key, shape, dtype=dtype, maxval=0.01)
        return jnp.zeros(shape, dtype)


def inputs_of(kit: Path, manifest: dict[str, Any], device: Any) -> list[jax.Array]:
    values = np.load(kit / f"{manifest['name']}.inputs.npz")
    key = jax.random.key(0)
    out = []
    for i, param in enumerate(manifest["params"]):
        if param.get("generated"):
            key, sub = jax.random.split(key)
            out.append(generated(param, sub, device))
        else:
            out.append(jax.device_put(values[f"p{i}"], device))
    return out


def reference_slice(value: np.ndarray, elements: int) -> np.ndarray:
    flat = value.reshape(-1)
    return flat[:: -(-flat.size // elements)]


def parity(
    kit: Path, manifest: dict[str, Any], outputs: list[Any], aliases: dict[int, int], rtol: float
) -> dict[str, Any]:
    """Compare one call's outputs with TensorFlow's: integers exactly, floats relatively."""
    reference = np.load(kit / f"{manifest['name']}.reference.npz")
    pairs = [("result", np.asarray(outputs[0]), reference["result"])]
    for out, param in aliases.items():
        key = f"p{param}"
        if key in reference:
            got = reference_slice(np.asarray(outputs[out]), manifest["reference_elements"])
            pairs.append((manifest["params"][param]["name"], got, reference[key]))
    worst_float, worst_name, int_mismatches = 0.0, "", []
    for name, got, want in pairs:
        if np.issubdtype(want.dtype, np.floating):
            same = (got == want) | (np.isnan(got) & np.isnan(want))  # infinities, NaNs alike
            with np.errstate(invalid="ignore"):
                rel = np.abs(got - want) / np.maximum(np.abs(want), 1.0)
            diff = float(np.max(np.where(same, 0.0, rel), initial=0.0))
            if diff > worst_float:
                worst_float, worst_name = diff, name
        elif not np.array_equal(got, want):
            int_mismatches.append(name)
    return {
        "compared": len(pairs),
        "max_float_rel_diff": worst_float,
        "worst": worst_name,
        "int_mismatches": int_mismatches,
        "ok": not int_mismatches and worst_float <= rtol,
        "loss_here": float(np.asarray(outputs[0])[1]) if len(outputs[0]) > 1 else None,
        "loss_tf": float(reference["result"][1]) if len(reference["result"]) > 1 else None,
    }


def time_calls(
    exe: Any, args: list[jax.Array], aliases: dict[int, int], repeats: int
) -> tuple[float, float]:
    """(median seconds per call, SGD steps per call), feeding updated variables forward."""
    args = list(args)

    def call() -> float:
        outs = exe.execute(args)
        jax.block_until_ready(outs)
        for out, param in aliases.items():
            args[param] = outs[out]
        return float(np.asarray(outs[0])[0])

    call()  # warm-up: the first call of a prioritized table also syncs its new rows
    times, steps = [], 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        steps = call()
        times.append(time.perf_counter() - start)
    return statistics.median(times), steps


# -- the DQN update in JAX ---------------------------------------------------------------------


def dqn_tables(manifest: dict[str, Any], kit: Path) -> dict[str, np.ndarray]:
    """The exported table's fields by name (``obs``, ``action``, ...) and its filled size."""
    values = np.load(kit / f"{manifest['name']}.inputs.npz")
    fields = {}
    for i, param in enumerate(manifest["params"]):
        name = param["name"].split(":")[0]
        if name in ("obs", "action", "reward", "next_obs", "terminated", "size"):
            fields.setdefault(name, values[f"p{i}"])
    return fields


def jax_dqn(fields: dict[str, np.ndarray], hidden: int, k: int, device: Any) -> dict[str, float]:
    """SGD steps/s of the same DQN update in JAX: fused with flashbax + lax.scan, and fed per
    step from numpy on the host."""
    import flashbax as fbx
    import optax

    size = int(fields["size"])
    data = {
        "obs": fields["obs"][:size].astype(np.float32),
        "action": fields["action"][:size].astype(np.int32),
        "reward": fields["reward"][:size].astype(np.float32),
        "next_obs": fields["next_obs"][:size].astype(np.float32),
        "terminated": fields["terminated"][:size].astype(np.float32),
    }
    obs_dim, actions, batch = data["obs"].shape[1], int(data["action"].max()) + 1, 256
    sizes = [obs_dim, hidden, hidden, max(actions, 2)]
    key = jax.random.key(0)
    params = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        key, sub = jax.random.split(key)
        w = jax.random.normal(sub, (fan_in, fan_out), jnp.float32) * np.sqrt(2 / fan_in)
        params.append((w, jnp.zeros(fan_out, jnp.float32)))
    optimizer = optax.adam(1e-3)

    def mlp(p: Any, x: jax.Array) -> jax.Array:
        for i, (w, b) in enumerate(p):
            x = x @ w + b
            x = jax.nn.relu(x) if i < len(p) - 1 else x
        return x

    def step(state: Any, b: dict[str, jax.Array]) -> tuple[Any, jax.Array]:
        q, target, opt = state
        next_a = jnp.argmax(mlp(q, b["next_obs"]), axis=1)
        next_v = jnp.take_along_axis(mlp(target, b["next_obs"]), next_a[:, None], 1)[:, 0]
        y = jax.lax.stop_gradient(b["reward"] + 0.99 * (1.0 - b["terminated"]) * next_v)

        def loss_fn(p: Any) -> jax.Array:
            q_a = jnp.take_along_axis(mlp(p, b["obs"]), b["action"][:, None], 1)[:, 0]
            return jnp.mean(optax.huber_loss(q_a, y))

        loss, grads = jax.value_and_grad(loss_fn)(q)
        updates, opt = optimizer.update(grads, opt, q)
        q = optax.apply_updates(q, updates)
        target = optax.incremental_update(q, target, 0.005)
        return (q, target, opt), loss

    buffer = fbx.make_item_buffer(size, 1, batch, add_batches=True)
    with jax.default_device(device):
        item = jax.tree.map(lambda x: jnp.asarray(x[0]), data)
        state = buffer.init(item)
        state = jax.jit(buffer.add, donate_argnums=0)(state, jax.tree.map(jnp.asarray, data))
        learner = (params, params, optimizer.init(params))

    @jax.jit
    def fused(learner: Any, buffer_state: Any, key: jax.Array) -> tuple[Any, jax.Array]:
        def one(carry: Any, key: jax.Array) -> tuple[Any, jax.Array]:
            sample = buffer.sample(buffer_state, key).experience
            return step(carry, sample)

        learner, losses = jax.lax.scan(one, learner, jax.random.split(key, k))
        return learner, losses.mean()

    single = jax.jit(step)
    rng = np.random.default_rng(0)

    def run_fused(calls: int) -> float:
        nonlocal learner, key
        start = time.perf_counter()
        for _ in range(calls):
            key, sub = jax.random.split(key)
            learner, loss = fused(learner, state, sub)
        jax.block_until_ready(loss)
        return k * calls / (time.perf_counter() - start)

    def run_host_feed(steps: int) -> float:
        nonlocal learner
        start = time.perf_counter()
        for _ in range(steps):
            idx = rng.integers(0, size, batch)
            fed = {name: jax.device_put(col[idx], device) for name, col in data.items()}
            learner, loss = single(learner, fed)
        jax.block_until_ready(loss)
        return steps / (time.perf_counter() - start)

    run_fused(1), run_host_feed(2)  # compile
    return {
        "jax_flashbax_fused": statistics.median(run_fused(3) for _ in range(3)),
        "jax_host_feed": statistics.median(run_host_feed(3 * k) for _ in range(3)),
    }


def run_case(kit: Path, manifest: dict[str, Any], device: Any, args: argparse.Namespace) -> dict:
    name = manifest["name"]
    start = time.perf_counter()
    exe, aliases = compile_hlo((kit / f"{name}.hlo.pb").read_bytes(), device)
    compile_s = time.perf_counter() - start
    inputs = inputs_of(kit, manifest, device)
    report: dict[str, Any] = {"case": name, "k": manifest["k"], "compile_s": compile_s}
    if manifest["parity"]:
        steps = jax.device_put(np.asarray(manifest["parity_steps"], np.int64), device)
        outputs = exe.execute([steps, *inputs[1:]])  # donates what it updates: carry it on
        report["parity"] = parity(kit, manifest, outputs, aliases, args.rtol)
        for out, param in aliases.items():
            inputs[param] = outputs[out]
    loops = hlo_loops.loops(exe.hlo_modules()[0].to_string())
    sgd = hlo_loops.sgd_loop(loops)
    report["loops"] = loops
    report["sgd_loop"] = sgd
    report["kernels_per_step"] = sgd["kernels_per_iteration"] if sgd else None
    seconds, steps = time_calls(exe, inputs, aliases, args.repeats)
    report["steps_per_call"] = steps
    report["steps_per_s"] = steps / seconds
    report["us_per_step"] = seconds / steps * 1e6 if steps else None
    report["cpu_steps_per_s_tensorflow"] = manifest.get("cpu_steps_per_s")
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats:
        report["peak_memory_bytes"] = stats.get("peak_bytes_in_use")
    if name.startswith("dqn") and not args.no_baselines:
        hidden = int(name.removeprefix("dqn"))
        report.update(jax_dqn(dqn_tables(manifest, kit), hidden, manifest["k"], device))
    return report


def line(report: dict[str, Any], device: Any) -> str:
    parts = [
        f"replaygpu fused loop (exported HLO, k={report['k']}) "
        f"{report['steps_per_s']:,.0f} SGD steps/s"
    ]
    if "jax_flashbax_fused" in report:
        fused, fed = report["jax_flashbax_fused"], report["jax_host_feed"]
        parts.append(f"JAX + flashbax fused {fused:,.0f} ({report['steps_per_s'] / fused:.2f}x)")
        parts.append(f"JAX fed per step {fed:,.0f} ({report['steps_per_s'] / fed:.2f}x)")
    if "parity" in report:
        p = report["parity"]
        verdict = "ok" if p["ok"] else "MISMATCH"
        parts.append(
            f"parity {verdict} ({p['compared']} outputs, max float rel diff "
            f"{p['max_float_rel_diff']:.1e} in {p['worst'] or '-'}, int mismatches "
            f"{p['int_mismatches'] or 0})"
        )
    if report.get("peak_memory_bytes"):
        parts.append(f"peak memory {report['peak_memory_bytes'] / 2**30:.2f} GiB")
    parts.append(f"compile {report['compile_s']:.1f} s")
    if report.get("kernels_per_step") is not None:
        parts.append(f"{report['kernels_per_step']} kernels per step")
    parts.append(f"loops: {hlo_loops.summary(report.get('loops', []))}")
    return f"{report['case']} on {device.device_kind}: " + "; ".join(parts)


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` to ``path`` whole or not at all (a set cut short keeps the last one)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(report, indent=1))
    partial.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kit", type=Path, required=True, help="the folder export.py wrote")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per case")
    parser.add_argument("--rtol", type=float, default=1e-3, help="parity tolerance of floats")
    parser.add_argument("--no-baselines", action="store_true", help="skip the JAX DQN updates")
    parser.add_argument("--cases", nargs="*", help="only these cases")
    parser.add_argument("--json", type=Path, help="write the reports here")
    parser.add_argument(
        "--roundtrip", action="store_true", help="also time roundtrip.py's counted/uncounted pair"
    )
    parser.add_argument(
        "--roundtrip-iterations",
        type=int,
        nargs="+",
        default=list(roundtrip.ITERATIONS),
        help="loop iterations of the pair",
    )
    parser.add_argument("--flag-set", default="", help="the name of this run's XLA_FLAGS")
    args = parser.parse_args()
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}", flush=True)
    out: dict[str, Any] = {
        "device": device.device_kind,
        "platform": device.platform,
        "jax": jax.__version__,
        "flag_set": args.flag_set,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "cases": [],
    }
    reports = out["cases"]
    for path in sorted(args.kit.glob("*.json")):
        manifest = json.loads(path.read_text())
        if "params" not in manifest or (args.cases and manifest["name"] not in args.cases):
            continue
        report = run_case(args.kit, manifest, device, args)
        reports.append(report)
        print(line(report, device), flush=True)
        if args.json:
            write_report(args.json, out)
    if args.roundtrip:
        out["roundtrip"] = roundtrip.measure(device, tuple(args.roundtrip_iterations), args.repeats)
        print(roundtrip.line(out["roundtrip"]), flush=True)
    if args.json:
        write_report(args.json, out)
    failed = [r["case"] for r in reports if not r.get("parity", {"ok": True})["ok"]]
    if failed:
        raise SystemExit(f"parity failed: {failed}")


if __name__ == "__main__":
    main()
