"""DQN on CartPole-v1, rl-zoo3 hyperparameters, 50k env steps: `replaygpu demo cartpole` vs
Stable-Baselines3, whole processes, alternating, one pair per seed.

For each seed (in this order, the other way round for the next seed, and so on): (a) ``python
-m replaygpu demo cartpole --seed S`` in this interpreter's venv (the project's), timed from
start to exit (imports, XLA compilation, training, checkpoints, the learning-curve plot and its
own 20-episode greedy evaluation), then, untimed, ``replaygpu eval RUN_DIR --episodes 20``; (b)
``sb3_dqn.py --seed S`` in the peers venv, timed the same way (imports, training, 20-episode
greedy evaluation). The return reported for replaygpu is the one of ``replaygpu eval`` (episode
seeds 10000.., as sb3_dqn.py's). Prints one line per run, then medians, the wall-clock ratio
SB3 / replaygpu and the ratio of each seed's pair. Targets (issue 23, as DESIGN.md): ratio
>= 3.3 and greedy return >= 475 on every seed.

    bash benchmarks/peers/setup.sh                      # once: the peers venv
    .venv/bin/python benchmarks/peers/cartpole_sb3.py   # seeds 0 1 2
    .venv/bin/python benchmarks/peers/cartpole_sb3.py --seeds 0
    .venv/bin/python benchmarks/peers/cartpole_sb3.py --demo-flags=--double-q  # not SB3's DQN
    .venv/bin/python benchmarks/peers/cartpole_sb3.py --figure benchmarks/figures/cartpole_sb3.png

--figure draws both sides' learning curves over wall-clock time from each process's start
(training episodes' returns, a moving average of 10; median over seeds, range shaded), with the
project's own plotting (`curves.save_wall_clock_curves`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PEERS_PYTHON = os.path.join(HERE, ".venv-peers", "bin", "python")
RETURN = re.compile(r"greedy evaluation.* over (\d+) episodes: mean return ([-\d.]+)")


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def timed(cmd: list[str]) -> tuple[float, str]:
    """Run ``cmd`` from the repository root; ``(seconds, stdout)``; raise with its output."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def episodes_of_run(run_dir: str) -> list[tuple[float, float]]:
    """``[(unix time, return)]`` of a demo run's training episodes, from its TensorBoard events."""
    import tensorflow as tf

    episodes = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("events.out.tfevents."):
            for event in tf.compat.v1.train.summary_iterator(os.path.join(run_dir, name)):
                for value in event.summary.value:
                    if value.tag == "charts/episodic_return":
                        episodes.append((event.wall_time, float(value.tensor.float_val[0])))
    return episodes


def run_replaygpu(seed: int, root: str, flags: list[str]) -> dict[str, Any]:
    run_dir = os.path.join(root, f"cartpole-s{seed}")
    cli = [sys.executable, "-m", "replaygpu"]
    demo = [*cli, "demo", "cartpole", "--seed", str(seed), "--run-dir", run_dir, *flags]
    started = time.time()
    wall, out = timed(demo)
    own = float(RETURN.findall(out)[-1][1])
    _, out = timed([*cli, "eval", run_dir, "--episodes", "20"])
    return {
        "wall_s": wall,
        "eval_mean": float(RETURN.findall(out)[-1][1]),
        "own_eval": own,
        "episodes": [(t - started, r) for t, r in episodes_of_run(run_dir)],
    }


def run_sb3(seed: int) -> dict[str, Any]:
    started = time.time()
    wall, out = timed([PEERS_PYTHON, os.path.join(HERE, "sb3_dqn.py"), "--seed", str(seed)])
    result = json.loads(out.strip().splitlines()[-1])
    return {
        "wall_s": wall,
        "eval_mean": result["eval_mean"],
        "train_s": result["train_s"],
        "episodes": [(t - started, r) for t, r in result["episodes"]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--demo-flags",
        default="",
        help="extra flags of `replaygpu demo cartpole`, e.g. --double-q (then the two sides no "
        "longer train the same algorithm: SB3's DQN is not double DQN)",
    )
    parser.add_argument("--figure", help="save both sides' learning curves to this PNG")
    args = parser.parse_args()
    if not os.path.exists(PEERS_PYTHON):
        sys.exit(f"no peers venv at {PEERS_PYTHON}: run bash benchmarks/peers/setup.sh first")
    print(f"cartpole DQN 50k env steps, whole processes, {os.cpu_count()} CPUs, {load()}")
    runs: dict[str, list[dict[str, Any]]] = {"replaygpu": [], "sb3": []}

    def ours(seed: int, root: str) -> None:
        r = run_replaygpu(seed, root, args.demo_flags.split())
        runs["replaygpu"].append(r)
        print(
            f"replaygpu seed {seed}: wall {r['wall_s']:.1f} s | greedy return "
            f"{r['eval_mean']:.1f} (demo's own eval {r['own_eval']:.1f}) | {load()}",
            flush=True,
        )

    def theirs(seed: int) -> None:
        s = run_sb3(seed)
        runs["sb3"].append(s)
        print(
            f"sb3       seed {seed}: wall {s['wall_s']:.1f} s (learn {s['train_s']:.1f} s) | "
            f"greedy return {s['eval_mean']:.1f} | {load()}",
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="peers-cartpole-") as root:
        for i, seed in enumerate(args.seeds):  # the order flips each round: a load that
            if i % 2:  # rises or falls during the run favours neither side
                theirs(seed)
                ours(seed, root)
            else:
                ours(seed, root)
                theirs(seed)
    for name, rs in runs.items():
        wins = sum(r["eval_mean"] >= 475 for r in rs)
        wall = statistics.median(r["wall_s"] for r in rs)
        ret = statistics.median(r["eval_mean"] for r in rs)
        print(
            f"{name:9} median wall {wall:.1f} s, median return {ret:.1f}, "
            f">= 475 in {wins}/{len(rs)}"
        )
    ratio = statistics.median(r["wall_s"] for r in runs["sb3"]) / statistics.median(
        r["wall_s"] for r in runs["replaygpu"]
    )
    pairs = " ".join(
        f"{s['wall_s'] / r['wall_s']:.2f}"
        for r, s in zip(runs["replaygpu"], runs["sb3"], strict=True)
    )
    print(
        f"wall-clock ratio SB3 / replaygpu (medians): {ratio:.2f}x (target >= 3.3x); "
        f"seed by seed {pairs}"
    )

    if args.figure:
        from curves import save_wall_clock_curves

        curves = {
            {"replaygpu": "replaygpu demo cartpole", "sb3": "Stable-Baselines3 DQN"}[name]: [
                tuple(np.reshape(r["episodes"], (-1, 2)).T) for r in rs
            ]
            for name, rs in runs.items()
        }
        seeds = " ".join(map(str, args.seeds))
        title = f"DQN on CartPole-v1, rl-zoo3 values, 50k env steps (seeds {seeds})"
        print(f"figure: {save_wall_clock_curves(args.figure, curves, title)}")


if __name__ == "__main__":
    main()
