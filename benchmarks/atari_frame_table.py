"""Memory of a 1e6-row Atari frame table: ``table.nbytes`` and the process RSS around it.

``python benchmarks/atari_frame_table.py [--capacity 1000000]``: makes a `make_frame_table`
of 84x84 uint8 frames on the CPU, fills every row once (so every page is touched), and prints
the table's bytes and the process's resident set size before and after.
"""

from __future__ import annotations

import argparse
import resource

import numpy as np
import tensorflow as tf

from replaygpu.frames import frame_rows
from replaygpu.samplers import make_frame_table


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=50_000, help="rows per append")
    args = parser.parse_args()
    before = rss_bytes()
    table = make_frame_table(args.capacity, (84, 84), device="/cpu:0")
    made = rss_bytes()
    frames = np.random.default_rng(0).integers(0, 256, (args.chunk + 1, 84, 84), np.uint8)
    n = args.chunk
    rows = frame_rows(
        frames, np.zeros(n, np.int64), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), first=True
    )
    for _ in range(args.capacity // n):
        table.append(rows)
    filled = rss_bytes()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gb = 1e9
    print(
        f"frame table capacity {args.capacity:,} rows of 84x84 uint8 (TF {tf.__version__}): "
        f"table.nbytes {table.nbytes / gb:.3f} GB ({table.nbytes / 2**30:.3f} GiB); "
        f"RSS {before / gb:.2f} GB before, {made / gb:.2f} GB after allocation, "
        f"{filled / gb:.2f} GB filled ({table.size:,} rows), peak {peak / gb:.2f} GB"
    )


if __name__ == "__main__":
    main()
