"""Replay features: prioritized vs uniform sampling cost, frame-stack throughput, Atari memory.

Sections (each runs in its own subprocess so big tables are freed before the next one):

  prioritized  prioritized sample + priority update vs uniform sample, batch 256, vector
               transitions (obs dim 8), capacity 1e4 / 1e5 / 1e6, inside the fused Learner loop
               (a tf.while_loop of --steps steps per call), with and without XLA. The update_fn
               only reduces the batch, so the figures are the replay cost per step. Also n-step
               (n=3) returns over the prioritized sampler (its `with_view(NStep(3))`), whose
               new-row sync runs once per call as for the prioritized sampler alone.
  tree         where the prioritized step's time goes: the `SumTree` descent (``find``) and
               priority write (``set``) timed alone in a bare tf.while_loop beside the uniform
               Learner step, capacity 1e4 / 1e6, with and without XLA. Prints the floor that
               the tree alone puts under prioritized / uniform (see benchmarks/README.md).
  frames       resident memory (RSS delta) of a 1e6-row 84x84 uint8 frame table, then
               frame-stacked (k=4) sampling from it: obs and next_obs [256, 4, 84, 84] rebuilt
               in the graph and max-reduced by update_fn, in the fused loop, with and without XLA.
  prioritized-frames
               uniform vs prioritized frame stacks (k=4) from a 1e6-row 84x84 frame table, with
               XLA, --rounds x --repeats calls each, taking turns; the prioritized one is
               ``rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4))``, so on a replaygpu
               without that API (or without ~9 GiB free) it prints a skip line. Target
               prioritized / uniform <= 1.5x.
  combos       (not part of "all") every sampler combination through the old names (so one
               script runs on every revision), timed "before" on a git worktree of --before
               (default 112fcfe) and "after" on the working tree (or a worktree of --after),
               call by call in turn, in one long-lived worker process per side and table:
               uniform / prioritized rows, n-step over each, sequences (T=16), frame stacks (k=4,
               n_step 1 and 3), each with and without XLA; uniform / prioritized / n-step on a
               ShardedReplayTable over 2 logical CPUs (without XLA: a sharded loop on CPUs runs
               without it anyway). Per combination the median us/step of each side and the
               ratio after / before (median of back-to-back pairs; target <= 1.1), then the
               worst ratio.

Prints medians of --repeats timed calls and the ratios the targets are stated in. Run:
    python benchmarks/replay_features.py              # all sections (~10 min on 2 cores)
    python benchmarks/replay_features.py --quick      # shorter loops, capacities 1e4 and 1e5
    python benchmarks/replay_features.py --section combos [--before REV] [--after REV]
        [--rounds 3] [--quick]                      # ~3 min on 2 cores, --quick too
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from common import dqn_spec, filled_table

import replaygpu as rg
from replaygpu.frames import frame_rows
from replaygpu.keys import IMPORTANCE_WEIGHTS, MASK, PRIORITIES
from replaygpu.samplers import Distribution, LinearSchedule, make_frame_table
from replaygpu.sharded import mirrored_strategy

BATCH = 256
OBS_DIM = 8
NSTEP_N = 3
NSTEP_PRIO = "n-step over prioritized"
SPEC = dqn_spec(OBS_DIM)


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed_call(learner: rg.Learner, steps: int) -> float:
    """Seconds per step of one ``learner.train(steps)`` call, after an untimed call of
    ``steps / 5`` steps that refills the caches something else has just used."""
    learner.train(max(1, steps // 5))
    start = time.perf_counter()
    out = learner.train(steps)
    sec = (time.perf_counter() - start) / steps
    assert out["steps"] == steps
    return sec


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


def write_exponential_priorities(write, capacity: int) -> None:
    """Give rows ``0 .. capacity - 1`` exponential(1) priorities (seed 0) with ``write(rows, p)``,
    in chunks of 100,000: non-uniform priorities to begin with."""
    rng = np.random.default_rng(0)
    for start in range(0, capacity, 100_000):
        rows = tf.range(start, min(start + 100_000, capacity), dtype=tf.int64)
        write(rows, tf.constant(rng.exponential(size=len(rows))))


def filled_prioritized(table: rg.ReplayTable, capacity: int, fanout: int, xla: bool) -> rg.Sampler:
    """The benchmarked prioritized `Sampler` over ``table``, its priorities already written."""
    sampler = rg.Sampler(
        table,
        rg.Prioritized(
            alpha=0.6, beta=LinearSchedule(0.4, 1.0, 10**6), tree_fanout=fanout, xla=xla
        ),
        seed=1,
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
        "value": tf.reduce_mean(batch[IMPORTANCE_WEIGHTS] * td),
        PRIORITIES: tf.abs(td),
    }


def bench_prioritized(args: argparse.Namespace) -> None:
    capacities = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    print(
        f"prioritized (sum tree fanout {args.fanout}) vs uniform, batch {BATCH}, {args.steps} "
        f"steps/call, median of {args.repeats}; microseconds per step (sample + gather "
        "[+ priority update]); 'prioritized' is the default sampler (its draw and write are XLA "
        "clusters), 'plain ops' the same with xla=False (without an XLA loop only: in one the "
        f"two are the same), '{NSTEP_PRIO}' an NStep(n={NSTEP_N}) view sharing a default "
        "prioritized sampler"
    )
    results: dict[tuple[str, bool, int], float] = {}
    for capacity in capacities:
        table = filled_table(capacity, OBS_DIM, seed=capacity)
        samplers = {"uniform": (rg.Sampler(table, seed=1), uniform_update)}
        for kind, xla_clusters in (("prioritized", True), ("plain ops", False)):
            samplers[kind] = (
                filled_prioritized(table, capacity, args.fanout, xla_clusters),
                prioritized_update,
            )
        wrapped = filled_prioritized(table, capacity, args.fanout, xla=True)
        nstep = wrapped.with_view(rg.NStep(NSTEP_N, gamma=0.99))
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
    # Imported here, not at the top: the combos workers run this file on other revisions.
    from replaygpu.samplers.sum_tree import SumTree

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

    table = filled_table(capacity, OBS_DIM, seed=capacity)
    uni = rg.Sampler(table, seed=1)
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


def frames_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Reads every pixel of both stacks once (a max over uint8 writes nothing big)."""
    obs = tf.cast(tf.reduce_max(batch["obs"]), tf.float32)
    nxt = tf.cast(tf.reduce_max(batch["next_obs"]), tf.float32)
    return {"pixels": obs + nxt + tf.reduce_sum(batch["reward"])}


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
        batch = frame_rows(
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
    table = make_frame_table(rows, device="/CPU:0")
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
    sampler = rg.Sampler(table, rg.Uniform(), rg.FrameStack(4), seed=0)
    steps = max(10, args.steps // 10)
    for xla in (False, True):
        learner = rg.Learner(table, sampler, frames_update, batch_size=BATCH, jit_compile=xla)
        sec = time_calls(learner, steps, args.repeats)
        print(
            f"  frame-stacked sampling k=4, xla={xla!s:5}: {sec * 1e3:6.2f} ms/step, "
            f"{BATCH / sec:,.0f} transitions/s (target >= 150,000)",
            flush=True,
        )
    assert int(sampler.invalid_draws.numpy()) == 0


# ---- prioritized-frames: the new sampler API (distribution x view), working tree only ----


def pixel_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Reads every pixel of both stacks; ``"priorities"`` ``|mean of each obs stack|`` [B]."""
    obs = batch["obs"]
    row_mean = tf.reduce_mean(tf.cast(obs, tf.float32), axis=list(range(1, len(obs.shape))))
    weights = batch.get(IMPORTANCE_WEIGHTS, tf.ones_like(row_mean))
    nxt = tf.cast(tf.reduce_max(batch["next_obs"]), tf.float32)
    value = tf.reduce_mean(tf.cast(weights, tf.float32) * row_mean) + nxt
    return {"pixels": value + tf.reduce_sum(batch["reward"]), "priority": tf.abs(row_mean)}


def pixel_uniform_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    out = pixel_update(batch)
    return {"pixels": out["pixels"]}


def pixel_prioritized_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    out = pixel_update(batch)
    return {"pixels": out["pixels"], PRIORITIES: out["priority"]}


def available_bytes() -> int:
    """MemAvailable of this machine (Linux /proc)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def bench_prioritized_frames(args: argparse.Namespace) -> None:
    missing = [name for name in ("Prioritized", "FrameStack") if not hasattr(rg, name)]
    if missing:
        print(
            f"prioritized-frames: skipped: replaygpu at {Path(rg.__file__).parent} has no "
            f"{', '.join('rg.' + m for m in missing)} (the rg.Sampler(table, distribution, "
            "view) API this section measures)",
            flush=True,
        )
        return
    rows = 100_000 if args.quick else 1_000_000
    need = rows * (84 * 84 + 16) + 2 * 2**30  # the table plus ~2 GiB for TF, XLA and the fill
    if available_bytes() < need:
        print(
            f"prioritized-frames: skipped: a {rows:,d}-row frame table needs about "
            f"{need / 2**30:.1f} GiB free, {available_bytes() / 2**30:.1f} GiB available",
            flush=True,
        )
        return
    table = make_frame_table(rows, device="/CPU:0")
    start = time.perf_counter()
    transitions = fill_frame_table(table, rows, episode=1000)
    print(
        f"prioritized-frames: {rows:,d}-row 84x84 frame table ({table.nbytes / 1e9:.2f} GB), "
        f"{transitions:,d} transitions written in {time.perf_counter() - start:.1f} s; batch "
        f"{BATCH}, k=4, XLA loop, update_fn reads every pixel (and returns |mean obs| as "
        "priorities for the prioritized one)",
        flush=True,
    )
    samplers = {
        "uniform": (
            rg.Sampler(table, rg.Uniform(), rg.FrameStack(4), seed=0),
            pixel_uniform_update,
        ),
        "uniform sorted": (
            rg.Sampler(table, sorted_uniform(), rg.FrameStack(4), seed=0),
            pixel_uniform_update,
        ),
        "prioritized": (
            rg.Sampler(table, rg.Prioritized(), rg.FrameStack(4), seed=0),
            pixel_prioritized_update,
        ),
    }
    learners = {
        kind: rg.Learner(table, sampler, fn, batch_size=BATCH, jit_compile=True)
        for kind, (sampler, fn) in samplers.items()
    }
    steps = max(10, args.steps // 10)
    for learner in learners.values():
        learner.train(steps)  # trace and compile
    times: dict[str, list[float]] = {kind: [] for kind in learners}
    for i in range(args.rounds * args.repeats):  # call by call, in turn which goes first
        for kind in list(learners) if i % 2 == 0 else list(reversed(learners)):
            times[kind].append(timed_call(learners[kind], steps))
    med = {kind: statistics.median(t) for kind, t in times.items()}
    for kind, sec in med.items():
        print(
            f"  {kind:14} frame stack k=4, xla=True: {sec * 1e3:6.2f} ms/step, "
            f"{BATCH / sec:,.0f} transitions/s (median of {len(times[kind])} calls of {steps})",
            flush=True,
        )
    print(
        f"  prioritized / uniform: {med['prioritized'] / med['uniform']:.2f}x (target <= 1.5x); "
        f"prioritized / uniform sorted: {med['prioritized'] / med['uniform sorted']:.2f}x "
        "(uniform rows in ascending order: a stratified draw's access order, without the tree)",
        flush=True,
    )
    del learners, samplers, table


def sorted_uniform() -> Any:
    """A distribution of uniform rows drawn in ascending order: the memory-access pattern of a
    stratified prioritized draw without its tree, to tell the two effects apart."""
    from replaygpu.samplers.uniform import UniformIndex

    class SortedUniformIndex(UniformIndex):
        def draw(self, batch_size: int, stratified: bool = True) -> tuple[tf.Tensor, None]:
            rows, _ = super().draw(batch_size, stratified)
            return tf.sort(rows), None

    @dataclasses.dataclass(frozen=True)
    class SortedUniform(Distribution):
        def build(self, table: Any, seed: int | None, num_shards: int) -> SortedUniformIndex:
            return SortedUniformIndex(table, seed)

    return SortedUniform()


# ---- combos: every sampler combination, before vs after a change, alternating ----

#: the reply line of a combos worker (anything else it prints is passed through)
REPLY = "@@combo "
SIDES = ("before", "after")
#: combos: the shortest timed call, in seconds (short calls are the noisiest on a shared machine)
COMBO_CALL_S = 0.1
SEQUENCE_T = 16
COMBO_SPEC = {**SPEC, "stream": tf.TensorSpec([], tf.int64)}
UpdateFn = Callable[[dict[str, tf.Tensor]], dict[str, tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class Combo:
    """One sampler combination, built through the old names so every revision runs it.

    Attributes:
        name: as printed.
        table: the worker (and table) it runs in: "vector", "frames" or "sharded".
        make: ``make(table) -> (sampler, update_fn)``.
        xla: the ``jit_compile`` settings to time (a sharded loop on CPUs runs without XLA
            whatever it is asked, so those time only False).
    """

    name: str
    table: str
    make: Callable[[Any], tuple[Any, UpdateFn]]
    xla: tuple[bool, ...] = (False, True)


def prioritized(table: Any) -> Any:
    return rg.Sampler(table, rg.Prioritized(alpha=0.6, beta=0.4), seed=1)


def sequence_update(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    mask = batch[MASK]
    value = tf.reduce_mean(batch["obs"]) + tf.reduce_mean(batch["next_obs"])
    return {"value": value + tf.reduce_mean(batch["reward"] * mask)}


COMBOS = [
    Combo("uniform rows", "vector", lambda t: (rg.Sampler(t, seed=1), uniform_update)),
    Combo("prioritized rows", "vector", lambda t: (prioritized(t), prioritized_update)),
    Combo(
        "n-step over uniform",
        "vector",
        lambda t: (
            rg.Sampler(t, rg.Uniform(), rg.NStep(NSTEP_N, gamma=0.99), seed=1),
            uniform_update,
        ),
    ),
    Combo(
        NSTEP_PRIO,
        "vector",
        lambda t: (prioritized(t).with_view(rg.NStep(NSTEP_N, gamma=0.99)), prioritized_update),
    ),
    Combo(
        f"sequence T={SEQUENCE_T}",
        "vector",
        lambda t: (rg.Sampler(t, rg.Uniform(), rg.Sequence(SEQUENCE_T), seed=1), sequence_update),
    ),
    Combo(
        "frame stack k=4",
        "frames",
        lambda t: (rg.Sampler(t, rg.Uniform(), rg.FrameStack(4), seed=1), frames_update),
    ),
    Combo(
        "frame stack k=4 n=3",
        "frames",
        lambda t: (
            rg.Sampler(t, rg.Uniform(), rg.FrameStack(4, n_step=3, gamma=0.99), seed=1),
            frames_update,
        ),
    ),
    Combo(
        "sharded uniform",
        "sharded",
        lambda t: (rg.Sampler(t, seed=1), uniform_update),
        xla=(False,),
    ),
    Combo(
        "sharded prioritized", "sharded", lambda t: (prioritized(t), prioritized_update), (False,)
    ),
    Combo(
        "sharded n-step",
        "sharded",
        lambda t: (
            rg.Sampler(
                t, rg.Uniform(), rg.NStep(NSTEP_N, gamma=0.99, stream_field="stream"), seed=1
            ),
            uniform_update,
        ),
        xla=(False,),
    ),
]


def combo_capacities(quick: bool) -> dict[str, int]:
    """Rows of each worker's table."""
    if quick:
        return {"vector": 20_000, "frames": 20_000, "sharded": 20_000}
    return {"vector": 100_000, "frames": 100_000, "sharded": 100_000}


def fill_streams(table: Any, capacity: int) -> None:
    """``capacity`` vector rows: episodes ending with probability 0.01 a step (mean length
    100), written by 8 actors (``stream`` 0-7) in turn, 1000 consecutive rows each."""
    rng = np.random.default_rng(0)
    for start in range(0, capacity, 10_000):
        n = min(10_000, capacity - start)
        obs = rng.normal(size=(n + 1, OBS_DIM)).astype(np.float32)
        table.append(
            {
                "obs": obs[:-1],
                "action": rng.integers(0, 4, n),
                "reward": rng.normal(size=n).astype(np.float32),
                "next_obs": obs[1:],
                "terminated": rng.random(n) < 0.01,
                "truncated": np.zeros(n, bool),
                "stream": (start + np.arange(n)) // 1000 % 8,
            }
        )


def combo_worker(args: argparse.Namespace) -> None:
    """Serve the parent of `bench_combos`: build one table, then time what stdin asks.

    Each stdin line is ``[combo name, xla, steps]`` (JSON); the reply is one line, `REPLY` and
    the seconds per step of one `timed_call` (its untimed call first refills the caches that the
    other side's process has just used; a learner's first call, which traces and compiles, is a
    whole untimed call). Learners are made on first use and kept.
    """
    # Each of the ~10 learners here traces once (their tracing counts say so), but TensorFlow
    # counts the traces of all instances of Learner._train_graph and warns of "retracing".
    tf.get_logger().setLevel("ERROR")
    strategy = None
    if args.group == "sharded":  # before any other TensorFlow op
        strategy = mirrored_strategy("/cpu:0,/cpu:1")
    capacity = combo_capacities(args.quick)[args.group]
    if args.group == "frames":
        table = make_frame_table(capacity, device="/CPU:0")
        fill_frame_table(table, capacity, episode=500)
    else:
        if strategy is None:
            table = rg.ReplayTable(COMBO_SPEC, capacity)
        else:
            table = rg.ShardedReplayTable(COMBO_SPEC, capacity, strategy, shard_by="stream")
        fill_streams(table, capacity)
    combos = {c.name: c for c in COMBOS if c.table == args.group}
    learners: dict[tuple[str, bool], rg.Learner] = {}
    print(REPLY + json.dumps({"replaygpu": rg.__file__}), flush=True)
    for line in sys.stdin:
        name, xla, steps = json.loads(line)
        learner = learners.get((name, xla))
        if learner is None:
            sampler, fn = combos[name].make(table)
            learner = rg.Learner(table, sampler, fn, batch_size=BATCH, jit_compile=xla)
            learner.train(steps)
            learners[(name, xla)] = learner
        sec = timed_call(learner, steps)
        assert learner.trace_count == 1, f"{name}: the loop was traced {learner.trace_count} times"
        print(REPLY + json.dumps({"time": sec}), flush=True)


class Worker:
    """A `combo_worker` subprocess importing replaygpu from ``tree``."""

    def __init__(
        self, side: str, tree: Path, group: str, args: argparse.Namespace, cwd: Path
    ) -> None:
        self.label = f"{side} {group}"
        cmd = [sys.executable, __file__, "--section", "combo-worker", "--group", group]
        cmd += ["--quick"] if args.quick else []
        self.proc = subprocess.Popen(
            cmd,
            env=tree_env(tree),
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def reply(self) -> dict[str, Any]:
        """The next reply line, passing other output through."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY) :])
            print(f"  [{self.label}] {line}", end="")
        raise RuntimeError(f"combos worker '{self.label}' exited with {self.proc.wait()}")

    def ask(self, name: str, xla: bool, steps: int) -> float:
        """Seconds per step of one timed call of ``steps`` steps of combination ``name``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([name, xla, steps]) + "\n")
        self.proc.stdin.flush()
        return self.reply()["time"]

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the worker's loop ends at EOF
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a process that imports replaygpu from ``tree`` (the installed
    editable finder comes after ``PYTHONPATH``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    return env


def check_tree(side: str, tree: Path, cwd: Path) -> None:
    """Print where ``side`` imports replaygpu from; raise unless it is ``tree``.

    Runs in ``cwd``, a folder without a replaygpu (``python -c`` puts the current folder first
    on sys.path, ahead of ``PYTHONPATH``)."""
    got = subprocess.run(
        [sys.executable, "-c", "import replaygpu; print(replaygpu.__file__)"],
        env=tree_env(tree),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"  {side:6}: replaygpu from {got}", flush=True)
    if not Path(got).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"{side}: replaygpu imported from {got}, expected under {tree}")


def git(*argv: str, cwd: Path) -> str:
    done = subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"git {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout.strip()


def measure_combos(
    workers: dict[tuple[str, str], Worker], args: argparse.Namespace
) -> tuple[dict[tuple[str, bool], dict[str, list[list[float]]]], dict[tuple[str, bool], int]]:
    """``{(combo, xla): {side: [seconds per step of each call] per round}}`` and
    ``{(combo, xla): steps per call}``.

    First each side runs each combination once, untimed (it traces and compiles), with
    ``--steps`` steps a call (a tenth for frames); the steps are then raised where a call would
    last less than `COMBO_CALL_S` (the same steps on both sides). A round times every
    combination ``--repeats`` times on each side, call by call, the sides taking turns (before,
    after, after, before, ...), so a burst of load from another process falls on both alike."""
    plan = [(c, xla) for c in COMBOS for xla in c.xla]
    steps = {}
    for combo, xla in plan:
        base = max(10, args.steps // 10) if combo.table == "frames" else args.steps
        sec = max(workers[(side, combo.table)].ask(combo.name, xla, base) for side in SIDES)
        steps[(combo.name, xla)] = max(base, math.ceil(COMBO_CALL_S / sec))
    rounds, repeats = args.rounds, args.repeats
    times = {(c.name, xla): {"before": [], "after": []} for c, xla in plan}
    for r in range(rounds):
        start = time.perf_counter()
        for i, (combo, xla) in enumerate(plan):
            got: dict[str, list[float]] = {"before": [], "after": []}
            for j in range(repeats):
                for side in ("before", "after") if (r + i + j) % 2 == 0 else ("after", "before"):
                    worker = workers[(side, combo.table)]
                    got[side].append(worker.ask(combo.name, xla, steps[(combo.name, xla)]))
            for side, calls in got.items():
                times[(combo.name, xla)][side].append(calls)
        print(f"  round {r + 1}/{rounds} done in {time.perf_counter() - start:.0f} s", flush=True)
    return times, steps


def report_combos(
    times: dict[tuple[str, bool], dict[str, list[list[float]]]], steps: dict[tuple[str, bool], int]
) -> None:
    """Per combination: the median seconds per step of each side over all calls, and the ratio
    after / before as the median of the ratios of the calls made back to back (pairs share the
    machine's load of the moment, so a burst or a slow phase of the shared machine cancels
    out); then the range of that median over single rounds (how noisy the ratio is)."""
    print(
        f"  {'combination':24} {'xla':5} {'steps':>6} {'before us':>10} {'after us':>10} "
        f"{'after/before':>12}  per-round range"
    )
    worst = (0.0, "")
    for (name, xla), sides in times.items():
        before, after = (
            statistics.median([t for calls in sides[s] for t in calls]) for s in ("before", "after")
        )
        pairs = [
            [a / b for b, a in zip(b_calls, a_calls, strict=True)]
            for b_calls, a_calls in zip(sides["before"], sides["after"], strict=True)
        ]
        ratio = statistics.median([q for rnd in pairs for q in rnd])
        rounds = [statistics.median(rnd) for rnd in pairs]
        worst = max(worst, (ratio, f"{name}, xla={xla}"))
        print(
            f"  {name:24} {xla!s:5} {steps[(name, xla)]:6d} {before * 1e6:10.1f} "
            f"{after * 1e6:10.1f} "
            f"{ratio:11.2f}x  {min(rounds):.2f}-{max(rounds):.2f}",
            flush=True,
        )
    verdict = "met" if worst[0] <= 1.1 else "NOT met"
    print(f"  worst ratio: {worst[0]:.2f}x ({worst[1]}); target <= 1.1x: {verdict}", flush=True)


def bench_combos(args: argparse.Namespace) -> None:
    root = Path(__file__).resolve().parents[1]
    tmp = Path(tempfile.mkdtemp(prefix="replaygpu-combos-"))
    trees: dict[str, Path] = {}
    workers: dict[tuple[str, str], Worker] = {}
    try:
        for side, rev in (("before", args.before), ("after", args.after)):
            if rev is None:
                trees[side] = root
                continue
            trees[side] = tmp / side
            git("worktree", "add", "--detach", str(trees[side]), rev, cwd=root)
        names = {
            side: git("rev-parse", "--short", rev, cwd=root) if rev else "working tree"
            for side, rev in (("before", args.before), ("after", args.after))
        }
        caps = combo_capacities(args.quick)
        print(
            f"combos: before = {args.before} ({names['before']}), after = "
            f"{args.after or 'the working tree'} ({names['after']}); batch {BATCH}, "
            f"{args.steps} steps/call ({max(10, args.steps // 10)} for frames) or more for a "
            f"call of >= {COMBO_CALL_S} s, {args.rounds} rounds of {args.repeats} calls per "
            "side, alternating call by call; ratio = median of back-to-back pairs; rows: vector "
            f"{caps['vector']:,d}, frames {caps['frames']:,d} (84x84), sharded "
            f"{caps['sharded']:,d} over /cpu:0,/cpu:1",
            flush=True,
        )
        for side, tree in trees.items():
            check_tree(side, tree, tmp)
        groups = sorted({c.table for c in COMBOS})
        for side, tree in trees.items():
            for group in groups:
                workers[(side, group)] = Worker(side, tree, group, args, tmp)
        for (side, group), worker in workers.items():
            got = worker.reply()["replaygpu"]
            if not Path(got).resolve().is_relative_to(trees[side].resolve()):
                raise RuntimeError(f"worker {side} {group} imported replaygpu from {got}")
        report_combos(*measure_combos(workers, args))
    finally:
        for worker in workers.values():
            worker.close()
        for tree in trees.values():
            if tree != root:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(tree)],
                    cwd=root,
                    check=False,
                    capture_output=True,
                )
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sections = ["prioritized", "tree", "frames", "prioritized-frames", "combos", "all"]
    parser.add_argument(
        "--section",
        choices=[*sections, "combo-worker"],
        default="all",
        help="'all' runs every section but combos; combo-worker is combos' own subprocess",
    )
    parser.add_argument("--steps", type=int, default=500, help="SGD steps per timed call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--fanout", type=int, default=8, help="sum tree fanout (prioritized)")
    parser.add_argument(
        "--before", default="112fcfe", help="combos: the git revision timed as 'before'"
    )
    parser.add_argument(
        "--after", default=None, help="combos: a revision timed as 'after' (default: working tree)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="combos, prioritized-frames: alternating rounds"
    )
    parser.add_argument("--group", choices=["vector", "frames", "sharded"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.section == "all":
        print(
            f"# {time.strftime('%Y-%m-%d')} {platform.node()} {platform.processor() or ''} "
            f"{os.cpu_count()} cores, tensorflow {tf.__version__}, load {os.getloadavg()}"
        )
        for section in ("prioritized", "tree", "frames", "prioritized-frames"):
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
                "--rounds",
                str(args.rounds),
            ] + (["--quick"] if args.quick else [])
            subprocess.run(cmd, check=True)
        print(f"# load after: {os.getloadavg()}")
        return
    sections = {
        "prioritized": bench_prioritized,
        "tree": bench_tree,
        "frames": bench_frames,
        "prioritized-frames": bench_prioritized_frames,
        "combos": bench_combos,
        "combo-worker": combo_worker,
    }
    sections[args.section](args)


if __name__ == "__main__":
    main()
