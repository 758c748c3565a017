"""SAC on MuJoCo: `replaygpu demo halfcheetah` (or ``--env`` another MuJoCo env) against
Stable-Baselines3's SAC with the same rl-zoo3 hyperparameters, whole processes, alternating
per seed as `cartpole_sb3.py` does (issue 35, item 3).

Per seed: (a) ``python -m replaygpu demo halfcheetah --env-id ENV --steps N --seed S`` (updates
batched: 64 SGD steps per 64 env steps), timed from start to exit, then ``replaygpu eval`` over
10 episodes (seeds 10000..); (b) ``sb3_sac.py`` with the same train frequency and gradient
steps (64/64); (c) with ``--sb3-default``, SB3's own 1/1 as the reference return. Prints one
line per run, medians, the wall-clock ratio SB3 (64/64) / replaygpu and, with --figure, both
sides' learning curves over wall-clock time.

    bash benchmarks/peers/setup.sh
    .venv/bin/python benchmarks/peers/mujoco_sb3.py --seeds 0 1 2 --steps 100000 --sb3-default \
        --figure benchmarks/figures/halfcheetah_sb3.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from cartpole_sb3 import HERE, PEERS_PYTHON, RETURN, episodes_of_run, load, timed

SIDES = ["replaygpu", "sb3-64/64", "sb3-1/1"]
NAMES = {"replaygpu": "replaygpu", "sb3-64/64": "sb3 64/64", "sb3-1/1": "sb3 1/1"}


def run_replaygpu(env: str, seed: int, steps: int, root: str) -> dict[str, Any]:
    run_dir = os.path.join(root, f"{env}-s{seed}")
    cli = [sys.executable, "-m", "replaygpu"]
    flags = ["--env-id", env, "--steps", str(steps), "--seed", str(seed), "--run-dir", run_dir]
    started = time.time()
    wall, _ = timed([*cli, "demo", "halfcheetah", *flags])
    _, out = timed([*cli, "eval", run_dir, "--episodes", "10"])
    return {
        "wall_s": wall,
        "eval_mean": float(RETURN.findall(out)[-1][1]),
        "episodes": [(t - started, r) for t, r in episodes_of_run(run_dir)],
    }


def run_sb3(env: str, seed: int, steps: int, freq: int) -> dict[str, Any]:
    script = os.path.join(HERE, "sb3_sac.py")
    chunking = ["--train-freq", str(freq), "--gradient-steps", str(freq)]
    started = time.time()
    cmd = [PEERS_PYTHON, script, "--env", env, "--seed", str(seed), "--steps", str(steps)]
    wall, out = timed([*cmd, *chunking])
    result = json.loads(out.strip().splitlines()[-1])
    return {
        "wall_s": wall,
        "eval_mean": result["eval_mean"],
        "episodes": [(t - started, r) for t, r in result["episodes"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="HalfCheetah-v5")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--sb3-default", action="store_true", help="also SB3 at 1/1")
    parser.add_argument(
        "--sides",
        nargs="+",
        choices=SIDES,
        default=SIDES[:2],
        help="which runs per seed (default: replaygpu and SB3 64/64; --sb3-default adds sb3-1/1)",
    )
    parser.add_argument("--figure", help="save the learning curves to this PNG")
    parser.add_argument("--out", help="write every run (returns, walls, episodes) as JSON")
    args = parser.parse_args()
    if not os.path.exists(PEERS_PYTHON):
        sys.exit(f"no peers venv at {PEERS_PYTHON}: run bash benchmarks/peers/setup.sh first")
    print(f"SAC on {args.env}, {args.steps} env steps, whole processes, {load()}", flush=True)
    chosen = [*args.sides, *(["sb3-1/1"] if args.sb3_default else [])]
    sides: dict[str, list[dict[str, Any]]] = {NAMES[s]: [] for s in SIDES if s in chosen}
    with tempfile.TemporaryDirectory(prefix="peers-mujoco-") as root:
        runs = {
            "replaygpu": lambda s: run_replaygpu(args.env, s, args.steps, root),
            "sb3 64/64": lambda s: run_sb3(args.env, s, args.steps, 64),
            "sb3 1/1": lambda s: run_sb3(args.env, s, args.steps, 1),
        }
        for i, seed in enumerate(args.seeds):
            pair = [n for n in ("replaygpu", "sb3 64/64") if n in sides][:: -1 if i % 2 else 1]
            for name in [*pair, *(["sb3 1/1"] if "sb3 1/1" in sides else [])]:  # flips each seed
                r = runs[name](seed)
                sides[name].append({"seed": seed, **r})
                print(
                    f"{name:9} seed {seed}: wall {r['wall_s']:.0f} s | return "
                    f"{r['eval_mean']:.1f} | {load()}",
                    flush=True,
                )
                if args.out:  # after every run: a long benchmark cut short keeps what it ran
                    with open(args.out, "w") as f:
                        json.dump({"env": args.env, "steps": args.steps, **sides}, f)
    for name, rs in sides.items():
        wall = statistics.median(r["wall_s"] for r in rs)
        ret = statistics.median(r["eval_mean"] for r in rs)
        print(f"{name:9} median wall {wall:.0f} s, median return {ret:.1f}")
    if "replaygpu" in sides and "sb3 64/64" in sides:
        ours = statistics.median(r["wall_s"] for r in sides["replaygpu"])
        ratio = statistics.median(r["wall_s"] for r in sides["sb3 64/64"]) / ours
        print(f"wall-clock ratio SB3 64/64 / replaygpu (medians): {ratio:.2f}x (target >= 3x)")
    if args.figure:
        from curves import save_wall_clock_curves

        curves = {
            name: [tuple(np.reshape(r["episodes"], (-1, 2)).T) for r in rs]
            for name, rs in sides.items()
        }
        title = f"SAC on {args.env}, rl-zoo3 values, {args.steps} env steps"
        print(f"figure: {save_wall_clock_curves(args.figure, curves, title)}")


if __name__ == "__main__":
    main()
