"""The floor of `replaygpu demo cartpole` on this machine: import, compilation and SGD alone.

Builds the demo's DQN update (rl-zoo3's CartPole-v1 hyperparameters: batch 64, MLP 256x256) on
a table of 50k random CartPole-shaped rows and times, in one process: the TensorFlow + agents
import, the first ``Learner.train(128)`` call (trace + XLA compilation), and the demo's other
training calls (191 of 128 steps and a last one of 40 after the last, shorter chunk: 24,616 SGD
steps in all in 50k env steps), run one after the other as the demo runs them, with the demo's
learning-rate schedule. Without double DQN (the demo's default, rl-zoo3's SB3 DQN) and with it.
No env step is taken: whatever the demo does beyond this is acting, logging and evaluation
(the greedy evaluations while training included). The imports and the exit get the demo's
treatment (`demos.imports_frozen`), so the floor stays one.

``--vs-demo`` runs the floor (not double DQN, the demo's default) and the demo itself as whole
processes, alternating (floor first in even rounds, demo first in odd ones), one pair per seed,
timed the same way from start to exit; it prints each run, the medians and the ratio
demo / floor (issue 23's target: <= 1.15x). Run:

    python benchmarks/cartpole_floor.py              # both variants, one subprocess each
    python benchmarks/cartpole_floor.py --vs-demo    # floor and demo alternating, seeds 0 1 2
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETURN = re.compile(r"greedy evaluation over \d+ episodes: mean return ([-\d.]+)")


def measure(double_q: bool) -> None:
    start = time.perf_counter()
    from replaygpu.agents.demos import DEMOS, imports_frozen  # the demo's own import and exit

    threads = DEMOS["cartpole"].intra_op_threads  # the demo's TensorFlow threads, too
    if threads is not None:
        os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(threads))
    with imports_frozen():
        import numpy as np

        import replaygpu as rg
        from replaygpu.agents.configs import training_calls
        from replaygpu.agents.dqn.agent import DQN, DQNConfig
        from replaygpu.agents.envs import make_vector_env
        from replaygpu.specs import specs_from_env

    import_s = time.perf_counter() - start
    config = DQNConfig(double_q=double_q)
    calls = training_calls(config)
    table = rg.ReplayTable(specs_from_env(make_vector_env("CartPole-v1", 1, 0)), 100_000)
    rng, n = np.random.default_rng(0), 50_000
    table.append(
        {
            "obs": rng.normal(size=(n, 4)).astype(np.float32),
            "action": rng.integers(2, size=n),
            "reward": np.ones(n, np.float32),
            "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
        }
    )
    agent = DQN(4, 2, config, config.learning_rate_schedule)
    sampler = rg.Sampler(table, seed=0)
    learner = rg.Learner(
        table, sampler, agent.update, config.batch_size, jit_compile=True, autograph=False
    )
    start = time.perf_counter()
    learner.train(calls[0])
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    for num_steps in calls[1:]:
        learner.train(num_steps)
    rest_s = time.perf_counter() - start
    print(
        f"double_q={double_q}: import {import_s:.1f} s, first call {first_s:.2f} s, "
        f"{rest_s / sum(calls[1:]) * 1e3:.3f} ms a step -> "
        f"{sum(calls)} SGD steps in {len(calls)} calls; "
        f"floor {import_s + first_s + rest_s:.1f} s",
        flush=True,
    )


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(cmd: list[str]) -> tuple[float, float, str]:
    """Run ``cmd`` from the repository root: ``(wall s, CPU s of the process, stdout)``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def vs_demo(seeds: list[int]) -> None:
    """Floor and demo as whole processes, alternating; medians and the ratio.

    The order flips every round (floor, demo, demo, floor, ...), so a load that rises or falls
    during the run favours neither side.
    """
    print(f"cartpole demo vs its floor, whole processes, {os.cpu_count()} CPUs, {load()}")
    floors, demos = [], []

    def floor() -> None:
        wall, cpu, out = timed([sys.executable, __file__, "--child", "single"])
        floors.append(wall)
        print(f"floor        : wall {wall:.1f} s, CPU {cpu:.1f} s | {out.strip()} | {load()}")

    def demo(seed: int, run_dir: str) -> None:
        cmd = [sys.executable, "-m", "replaygpu", "demo", "cartpole", "--seed", str(seed)]
        wall, cpu, out = timed([*cmd, "--run-dir", run_dir])
        demos.append(wall)
        ret = RETURN.findall(out)
        print(
            f"demo seed {seed:<3d}: wall {wall:.1f} s, CPU {cpu:.1f} s | greedy return "
            f"{ret[-1] if ret else '?'} | {load()}",
            flush=True,
        )

    with tempfile.TemporaryDirectory(prefix="cartpole-floor-") as root:
        for i, seed in enumerate(seeds):
            run_dir = os.path.join(root, f"{i}-s{seed}")  # a new run, never a resumed one
            if i % 2:
                demo(seed, run_dir)
                floor()
            else:
                floor()
                demo(seed, run_dir)
    floor_s, demo_s = statistics.median(floors), statistics.median(demos)
    pairs = " ".join(f"{d / f:.3f}" for d, f in zip(demos, floors, strict=True))
    print(
        f"median wall: demo {demo_s:.1f} s, floor {floor_s:.1f} s; demo / floor "
        f"{demo_s / floor_s:.3f}x (target <= 1.15x); round by round {pairs}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--vs-demo", action="store_true", help="time the demo and its floor, alternating"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--vs-demo seeds")
    parser.add_argument("--child", choices=["double", "single"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(args.child == "double")
        return
    if args.vs_demo:
        vs_demo(args.seeds)
        return
    print(f"{os.cpu_count()} CPUs, {load()}")
    for variant in ("single", "double"):  # a fresh process each: the import is measured too
        subprocess.run([sys.executable, __file__, "--child", variant], check=True)


if __name__ == "__main__":
    main()
