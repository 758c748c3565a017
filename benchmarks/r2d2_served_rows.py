"""Rows and bytes the served R2D2 learner stores per env step (issue 35, item 2).

Starts ``replaygpu learner --agent r2d2`` (its defaults: sequence_length 30, period 10, LSTM 64;
no training: --learning-starts above the run) and one ``replaygpu actor ADDRESS --steps N``
with 2 envs, then reads the learner's ``Info``: rows inserted, and bytes per row from the
table's spec. Prints rows / env step and bytes / env step. Run with the interpreter of the
checkout to measure (``python benchmarks/r2d2_served_rows.py --env-steps 4000``).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import numpy as np

import replaygpu as rg

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=4000)
    parser.add_argument("--env", default="CartPole-v1")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "replaygpu"]
    learner = subprocess.Popen(
        [*cli, "learner", "--agent", "r2d2", "--env", args.env, "--address", "127.0.0.1:0",
         "--steps", "0", "--learning-starts", str(10 * args.env_steps), "--num-actors", "1"],
        stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    try:
        for line in learner.stderr:
            found = re.search(r"serving at (\S+);", line)
            if found:
                break
        else:
            sys.exit("the learner never served")
        address = found.group(1)
        subprocess.run(
            [*cli, "actor", address, "--steps", str(args.env_steps), "--num-envs", "2"],
            check=True, capture_output=True, env=ENV, timeout=600,
        )  # fmt: skip
        with rg.ReplayClient(address, actor_id="probe") as client:
            table = client.info().tables[0]
        row_bytes = sum(
            int(np.prod(list(f.shape), dtype=np.int64)) * np.dtype(f.dtype).itemsize
            for f in table.spec
        )
        rows = table.inserted
        print(
            f"{args.env}: {args.env_steps} env steps -> {rows} rows of {row_bytes} bytes "
            f"({', '.join(f.name for f in table.spec)}): {rows / args.env_steps:.2f} rows and "
            f"{rows * row_bytes / args.env_steps:.0f} bytes per env step"
        )
    finally:
        learner.terminate()
        learner.communicate(timeout=120)


if __name__ == "__main__":
    main()
