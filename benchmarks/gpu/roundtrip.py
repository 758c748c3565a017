"""The card's round trip per loop iteration, without TensorFlow: one small body in a loop whose
trip count XLA knows against the same body in a loop whose bound arrives at run time.

- ``fori``: ``jax.lax.fori_loop(0, n, ...)`` with ``n`` a Python int (a static bound: the
  optimized HLO says ``known_trip_count``; XLA:GPU queues every iteration);
- ``while``: ``jax.lax.while_loop`` with ``i < n`` and ``n`` a traced argument (XLA cannot count
  it; XLA:GPU copies the predicate to the host and waits before every iteration).

The body is one elementwise update of a ``[BODY_ELEMENTS]`` float32 vector (one fused kernel on
a GPU), so the time per iteration is the loop's own cost. Each form runs at each of
``iterations``; the per-iteration figure that leaves the fixed cost of a call out is the slope
between the fewest and the most iterations, and the round trip is ``while`` minus ``fori``.

Run alone: ``python benchmarks/gpu/roundtrip.py [--iterations 100 1000 10000]``; ``run.py
--roundtrip`` runs it in the same process as the cases (so under the same ``XLA_FLAGS``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import hlo_loops
import jax
import jax.numpy as jnp

#: elements of the loop's state (4 KiB of float32: launch bound on any GPU)
BODY_ELEMENTS = 1024
#: iteration counts of each loop form
ITERATIONS = (100, 1000, 10_000)


def body(x: jax.Array) -> jax.Array:
    """One iteration: an elementwise update that XLA cannot fold across iterations."""
    return jnp.sin(x) * 0.5 + 0.25


def fori(n: int) -> Callable[[jax.Array], jax.Array]:
    """``n`` iterations with a static bound (counted)."""

    def static_bound(x: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, n, lambda _, x: body(x), x)

    return jax.jit(static_bound)


@jax.jit
def runtime_bound(x: jax.Array, n: jax.Array) -> jax.Array:
    """``n`` iterations with ``n`` traced: a bound XLA cannot count."""
    zero = jnp.zeros((), n.dtype)
    _, x = jax.lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, body(c[1])), (zero, x))
    return x


def timed(call: Callable[[], jax.Array], repeats: int) -> float:
    """Median seconds of ``call`` (after one call that compiles and warms up)."""
    jax.block_until_ready(call())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(device: Any, iterations: tuple[int, ...] = ITERATIONS, repeats: int = 5) -> dict:
    """Per-iteration times of both forms at each count, their slopes, the round trip, and the
    loops XLA compiled for each (op name, known trip count, kernels per iteration)."""
    counts = sorted(set(iterations))
    x = jax.device_put(jnp.linspace(0.0, 1.0, BODY_ELEMENTS, dtype=jnp.float32), device)
    forms: dict[str, dict[str, Any]] = {"fori": {}, "while": {}}
    seconds: dict[str, list[float]] = {"fori": [], "while": []}
    for n in counts:
        bound = jax.device_put(jnp.asarray(n, jnp.int32), device)
        calls = {
            "fori": (fori(n), (x,)),
            "while": (runtime_bound, (x, bound)),
        }
        for form, (fn, args) in calls.items():
            s = timed(lambda fn=fn, args=args: fn(*args), repeats)
            seconds[form].append(s)
            forms[form].setdefault("us_per_iteration", {})[str(n)] = s / n * 1e6
            if "loops" not in forms[form] or form == "fori":  # one program per n for fori
                text = fn.lower(*args).compile().as_text()
                forms[form]["loops"] = hlo_loops.loops(text)
    for form in forms:
        if len(counts) > 1:
            slope = (seconds[form][-1] - seconds[form][0]) / (counts[-1] - counts[0])
        else:
            slope = seconds[form][0] / counts[0]
        forms[form]["us_per_iteration_slope"] = slope * 1e6
    return {
        "body_elements": BODY_ELEMENTS,
        "iterations": counts,
        "repeats": repeats,
        **forms,
        "round_trip_us": forms["while"]["us_per_iteration_slope"]
        - forms["fori"]["us_per_iteration_slope"],
    }


def line(report: dict[str, Any]) -> str:
    """One line: both slopes and their difference, with the loops' trip counts."""
    fori_loops = hlo_loops.summary(report["fori"]["loops"])
    while_loops = hlo_loops.summary(report["while"]["loops"])
    return (
        f"round trip: fori (static bound; {fori_loops}) "
        f"{report['fori']['us_per_iteration_slope']:.2f} us/iteration, while_loop (runtime "
        f"bound; {while_loops}) {report['while']['us_per_iteration_slope']:.2f}, difference "
        f"{report['round_trip_us']:.2f} us (slope over {report['iterations']} iterations)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, nargs="+", default=list(ITERATIONS))
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report = measure(jax.devices()[0], tuple(args.iterations), args.repeats)
    print(line(report))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
