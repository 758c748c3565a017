"""Replay features: prioritized vs uniform sampling cost, frame-stack throughput, Atari memory.

Sections (each runs in its own subprocess so big tables are freed before the next one):

  prioritized  prioritized sample + priority update vs uniform sample, batch 256, vector
               transitions (obs dim 8), capacity 1e4 / 1e5 / 1e6, inside the fused Learner loop
               (a tf.while_loop of --steps steps per call), with and without XLA. The update_fn
               only reduces the batch, so the figures are the replay cost per step. Also n-step
               (n=3) returns over the prioritized sampler (`NStepSampler` wrapping it), whose
               new-row sync runs once per call as for the prioritized sampler alone.
  tree         where the prioritized step's time goes: the `SumTree` descent (``find``) and
               priority write (``set``) timed alone in a bare tf.while_loop beside the uniform
               Learner step, capacity 1e4 / 1e6, with and without XLA. Prints the floor that
               the tree alone puts under prioritized / uniform (see benchmarks/README.md).
  frames       resident memory (RSS delta) of a 1e6-row 84x84 uint8 frame table, then
               frame-stacked (k=4) sampling from it: obs and next_obs [256, 4, 84, 84] rebuilt
               in the graph and max-reduced by update_fn, in the fused loop, with and without XLA.

Prints medians of --repeats timed calls and the ratios the targets are stated in. Run:
    python benchmarks/replay_features.py              # all sections (~10 min on 2 cores)
    python benchmarks/replay_features.py --quick      # shorter loops, capacities 1e4 and 1e5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import replaygpu as rg
from replaygpu.samplers.sum_tree import SumTree

BATCH = 256
OBS_DIM = 8
NSTEP_N = 3
NSTEP_PRIO = "n-step over prioritized"
SPEC = {
    "obs": tf.TensorSpec([OBS_DIM], tf.float32),
    "action": tf.TensorSpec([], tf.int64),
    "reward": tf.TensorSpec([], tf.float32),
    "next_obs": tf.TensorSpec([OBS_DIM], tf.float32),
    "terminated": tf.TensorSpec([], tf.bool),
    "truncated": tf.TensorSpec([], tf.bool),
}


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def time_calls(learner: rg.Learner, steps: int, repeats: int) -> float:
    """Median seconds per step over ``repeats`` calls of ``learner.train(steps)``."""
    learner.train(steps)  # trace, compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = learner.train(steps)
        times.append((time.perf_counter() - start) / steps)
        assert out["steps"] == steps
    return statistics.median(times)


def fill_vector_table(capacity: int, seed: int) -> rg.ReplayTable:
    rng = np.random.default_rng(seed)
    table = rg.ReplayTable(SPEC, capacity)
    chunk = 100_000
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        table.append(
            {
                "obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
                "action": rng.integers(0, 4, n),
                "reward": rng.normal(size=n).astype(np.float32),
                "next_obs": rng.normal(size=(n, OBS_DIM)).astype(np.float32),
                "terminated": rng.random(n) < 0.01,
                "truncated": np.zeros(n, bool),
            }
        )
    return table


def write_exponential_priorities(write, capacity: int) -> None:
    """Give rows ``0 .. capacity - 1`` exponential(1) priorities (seed 0) with ``write(rows, p)``,
    in chunks of 100,000: non-uniform priorities to begin with."""
    rng = np.random.default_rng(0)
    for start in range(0, capacity, 100_000):
        rows = tf.range(start, min(start + 100_000, capacity), dtype=tf.int64)
        write(rows, tf.constant(rng.exponential(size=len(rows))))


def filled_prioritized(
    table: rg.ReplayTable, capacity: int, fanout: int, xla: bool
) -> rg.PrioritizedSampler:
    """The benchmarked `PrioritizedSampler` over ``table``, its priorities already written."""
    sampler = rg.PrioritizedSampler(
        table,
        alpha=0.6,
        beta=rg.LinearSchedule(0.4, 1.0, 10**6),
        seed=1,
        tree_fanout=fanout,
        xla=xla,
    )
    write_exponential_priorities(sampler.update_priorities, capacity)
    return sampler


def uniform_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    value = tf.reduce_mean(batch["obs"], axis=1) + batch["reward"]
    return {"value": tf.reduce_mean(value + tf.reduce_mean(batch["next_obs"], axis=1))}


def prioritized_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    value = tf.reduce_mean(batch["obs"], axis=1) + batch["reward"]
    td = value + tf.reduce_mean(batch["next_obs"], axis=1)
    return {
        "value": tf.reduce_mean(batch[rg.IMPORTANCE_WEIGHTS] * td),
        rg.PRIORITIES: tf.abs(td),
    }


def bench_prioritized(args: argparse.Namespace) -> None:
    capacities = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    print(
        f"prioritized (sum tree fanout {args.fanout}) vs uniform, batch {BATCH}, {args.steps} "
        f"steps/call, median of {args.repeats}; microseconds per step (sample + gather "
        "[+ priority update]); 'prioritized' is the default sampler (its draw and write are XLA "
        "clusters), 'plain ops' the same with xla=False (without an XLA loop only: in one the "
        f"two are the same), '{NSTEP_PRIO}' an NStepSampler (n={NSTEP_N}) wrapping a default "
        "prioritized sampler"
    )
    results: dict[tuple[str, bool, int], float] = {}
    for capacity in capacities:
        table = fill_vector_table(capacity, seed=capacity)
        samplers = {"uniform": (rg.UniformSampler(table, seed=1), uniform_update)}
        for kind, xla_clusters in (("prioritized", True), ("plain ops", False)):
            samplers[kind] = (
                filled_prioritized(table, capacity, args.fanout, xla_clusters),
                prioritized_update,
            )
        wrapped = filled_prioritized(table, capacity, args.fanout, xla=True)
        nstep = rg.NStepSampler(wrapped, n=NSTEP_N, gamma=0.99)
        samplers[NSTEP_PRIO] = (nstep, prioritized_update)
        for xla in (False, True):
            for kind, (sampler, fn) in samplers.items():
                if xla and kind == "plain ops":
                    continue
                learner = rg.Learner(table, sampler, fn, batch_size=BATCH, jit_compile=xla)
                sec = time_calls(learner, args.steps, args.repeats)
                results[(kind, xla, capacity)] = sec
                print(
                    f"  capacity {capacity:>9,d}  xla={xla!s:5}  {kind:23}  "
                    f"{sec * 1e6:8.1f} us/step  {BATCH / sec / 1e6:6.2f} M transitions/s",
                    flush=True,
                )
        del table, samplers
    big, small = capacities[-1], capacities[0]
    for xla, kind in ((False, "prioritized"), (False, "plain ops"), (True, "prioritized")):
        p_big, p_small = results[(kind, xla, big)], results[(kind, xla, small)]
        u_big = results[("uniform", xla, big)]
        print(
            f"  xla={xla!s:5} {kind:11} cost {big:,d} / {small:,d}: {p_big / p_small:.2f}x "
            f"(target <= 1.5x); / uniform at {big:,d}: {p_big / u_big:.2f}x (target <= 3x)"
        )
    for xla in (False, True):
        n_big, p_big = results[(NSTEP_PRIO, xla, big)], results[("prioritized", xla, big)]
        print(f"  xla={xla!s:5} {NSTEP_PRIO} / prioritized at {big:,d}: {n_big / p_big:.2f}x")


def time_loop(body, xla: bool, steps: int, repeats: int) -> float:
    """Median seconds per iteration of a ``steps``-long tf.while_loop running ``body()``."""

    @tf.function(jit_compile=xla)
    def loop(n: tf.Tensor) -> tf.Tensor:
        def step(i: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            return i + 1, acc + body()

        zero = (tf.constant(0, tf.int64), tf.constant(0.0, tf.float64))
        return tf.while_loop(lambda i, _: i < n, step, zero)[1]

    loop(tf.constant(10, tf.int64))  # trace and compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loop(tf.constant(steps, tf.int64)).numpy()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times)


def bench_tree(args: argparse.Namespace) -> None:
    capacities = [10_000, 100_000] if args.quick else [10_000, 1_000_000]
    print(
        f"sum tree parts (fanout {args.fanout}), batch {BATCH}, {args.steps}-step loops, median "
        f"of {args.repeats}; microseconds per step"
    )
    for capacity in capacities:
        measure_tree(capacity, args)


def measure_tree(capacity: int, args: argparse.Namespace) -> None:
    """Time ``find`` and ``set`` of a filled `SumTree` alone, beside the uniform Learner step."""
    tree = SumTree(capacity, fanout=args.fanout)
    write_exponential_priorities(tree.set, capacity)
    total = float(tree.total().numpy())
    gen = tf.random.Generator.from_seed(0)

    def draw() -> tf.Tensor:  # the loop and the random draw every body below also pays
        return tf.cast(tf.reduce_sum(gen.uniform([BATCH], 0, capacity, tf.int64)), tf.float64)

    def find() -> tf.Tensor:
        leaves, _ = tree.find(gen.uniform([BATCH], 0.0, total, tf.float64))
        return tf.cast(tf.reduce_sum(leaves), tf.float64)

    def write() -> tf.Tensor:
        rows = gen.uniform([BATCH], 0, capacity, tf.int64)
        tree.set(rows, gen.uniform([BATCH], 0.5, 1.5, tf.float64))
        return tf.cast(tf.reduce_sum(rows), tf.float64)

    table = fill_vector_table(capacity, seed=capacity)
    uni = rg.UniformSampler(table, seed=1)
    for xla in (False, True):
        learner = rg.Learner(table, uni, uniform_update, batch_size=BATCH, jit_compile=xla)
        uniform = time_calls(learner, args.steps, args.repeats)
        base = time_loop(draw, xla, args.steps, args.repeats)
        t_find = time_loop(find, xla, args.steps, args.repeats) - base
        t_set = time_loop(write, xla, args.steps, args.repeats) - base
        print(
            f"  capacity {capacity:>9,d} (depth {tree.depth}) xla={xla!s:5}  uniform Learner "
            f"step {uniform * 1e6:6.1f}  |  find {t_find * 1e6:6.1f} "
            f"({t_find / tree.depth * 1e6:4.1f}/level)  set {t_set * 1e6:6.1f}  |  floor of "
            f"prioritized / uniform, (uniform + find + set) / uniform: "
            f"{(uniform + t_find + t_set) / uniform:.2f}x",
            flush=True,
        )


def fill_frame_table(table: rg.ReplayTable, rows: int, episode: int) -> int:
    """Append ``rows`` rows of episodes of ``episode`` steps (+1 final row each)."""
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, size=(4096, 84, 84), dtype=np.uint8)
    written, transitions, t = 0, 0, 0
    chunk = 8192
    while written < rows:
        n = min(chunk, rows - written)
        steps = min(n, episode - t)  # transitions in this chunk, within one episode
        ends = t + steps == episode
        take = steps - 1 if ends and steps == n else steps  # leave room for the final row
        if take < 1:
            take, ends = n - 1, True
        frames = pool[(written + np.arange(take + 1)) % len(pool)]
        done = np.zeros(take, bool)
        done[-1] = ends
        batch = rg.frame_rows(
            frames,
            rng.integers(0, 6, take),
            np.ones(take, np.float32),
            done,
            np.zeros(take, bool),
            first=t == 0,
        )
        table.append(batch)
        got = len(batch["frame"])
        written += got
        transitions += take
        t = 0 if ends else t + take
    return transitions


def bench_frames(args: argparse.Namespace) -> None:
    rows = 100_000 if args.quick else 1_000_000
    before = rss_bytes()
    table = rg.make_frame_table(rows, device="/CPU:0")
    after = rss_bytes()
    print(
        f"frame table: {rows:,d} rows of 84x84 uint8 + 16 B: nbytes {table.nbytes / 1e9:.3f} GB, "
        f"RSS delta {(after - before) / 1e9:.3f} GB (target <= 7.5 GB for 1e6)",
        flush=True,
    )
    start = time.perf_counter()
    transitions = fill_frame_table(table, rows, episode=1000)
    print(
        f"  filled with {transitions:,d} transitions (episodes of 1000 steps) in "
        f"{time.perf_counter() - start:.1f} s; RSS now {(rss_bytes() - before) / 1e9:.3f} GB "
        "above the start",
        flush=True,
    )
    sampler = rg.FrameStackSampler(table, stack=4, seed=0)

    def update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        # Read every pixel of both stacks once (a max over uint8 writes nothing big).
        obs = tf.cast(tf.reduce_max(batch["obs"]), tf.float32)
        nxt = tf.cast(tf.reduce_max(batch["next_obs"]), tf.float32)
        return {"pixels": obs + nxt + tf.reduce_sum(batch["reward"])}

    steps = max(10, args.steps // 10)
    for xla in (False, True):
        learner = rg.Learner(table, sampler, update, batch_size=BATCH, jit_compile=xla)
        sec = time_calls(learner, steps, args.repeats)
        print(
            f"  frame-stacked sampling k=4, xla={xla!s:5}: {sec * 1e3:6.2f} ms/step, "
            f"{BATCH / sec:,.0f} transitions/s (target >= 150,000)",
            flush=True,
        )
    assert int(sampler.invalid_draws.numpy()) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sections = ["prioritized", "tree", "frames", "all"]
    parser.add_argument("--section", choices=sections, default="all")
    parser.add_argument("--steps", type=int, default=500, help="SGD steps per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fanout", type=int, default=8, help="sum tree fanout (prioritized)")
    args = parser.parse_args()
    if args.section == "all":
        print(
            f"# {time.strftime('%Y-%m-%d')} {platform.node()} {platform.processor() or ''} "
            f"{os.cpu_count()} cores, tensorflow {tf.__version__}, load {os.getloadavg()}"
        )
        for section in ("prioritized", "tree", "frames"):
            cmd = [
                sys.executable,
                __file__,
                "--section",
                section,
                "--steps",
                str(args.steps),
                "--repeats",
                str(args.repeats),
                "--fanout",
                str(args.fanout),
            ] + (["--quick"] if args.quick else [])
            subprocess.run(cmd, check=True)
        print(f"# load after: {os.getloadavg()}")
        return
    sections = {"prioritized": bench_prioritized, "tree": bench_tree, "frames": bench_frames}
    sections[args.section](args)


if __name__ == "__main__":
    main()
