"""`benchmarks/recipe_twins.py`: the numpy twin of the pixel recipe reads the transitions
`rg.FrameStack` reads, so the two programs compare the same learning on different buffers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import tensorflow as tf

from replaygpu.samplers import FrameStack, make_frame_table

_spec = importlib.util.spec_from_file_location(
    "recipe_twins", Path(__file__).resolve().parents[1] / "benchmarks" / "recipe_twins.py"
)
twins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(twins)


def frame_rows(rng: np.random.Generator, steps: int):
    """Frame-table rows of short episodes, some ending in a final row; frame i is all i."""
    count = 0
    for step in range(steps):
        row = {
            "frame": np.full((3, 3), count, np.uint8),
            "action": int(rng.integers(4)),
            "reward": float(rng.normal()),
            "terminated": bool(rng.random() < 0.1),
            "truncated": False,
            "first": step == 0 or rng.random() < 0.1,
            "final": False,
        }
        yield row
        count += 1
        if rng.random() < 0.1:
            yield {
                **row,
                "frame": np.full((3, 3), count, np.uint8),
                "action": 0,
                "reward": 0.0,
                "terminated": False,
                "first": False,
                "final": True,
            }
            count += 1


def test_the_numpy_twin_draws_and_stacks_the_rows_frame_stack_does_across_the_ring():
    capacity, checked = 40, 0
    ours = make_frame_table(capacity, (3, 3))
    writer = ours.writer(chunk=7)
    twin = twins.make_frame_table(capacity, (3, 3))
    sampler = twins.Sampler(twin, twins.Uniform(), twins.FrameStack(4), seed=0)
    view = FrameStack(4)
    for i, row in enumerate(frame_rows(np.random.default_rng(1), 150)):
        writer.add(row)
        twin.add(row)
        if i % 9 != 8:
            continue
        writer.flush()
        rows = np.arange(min(twin.size, capacity))
        valid = sampler.history(rows)[1]
        np.testing.assert_array_equal(view.history(ours, tf.constant(rows))[1].numpy(), valid)
        drawable = rows[valid]
        expected = view.read(ours, tf.constant(drawable))
        for name, value in sampler.read(drawable).items():
            np.testing.assert_array_equal(expected[name].numpy(), value, err_msg=name)
        checked += len(drawable)
    assert twin.size == capacity and checked > 300  # the ring wrapped, many rows compared
    batch = sampler.minibatch(32)
    assert batch["obs"].shape == (32, 4, 3, 3)
    assert np.all(batch["next_obs"][:, :3] == batch["obs"][:, 1:])
