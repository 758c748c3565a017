"""`benchmarks/peers/curves.py`: the benchmarks' learning curves over wall-clock time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")

_spec = importlib.util.spec_from_file_location(
    "curves", Path(__file__).resolve().parents[1] / "benchmarks" / "peers" / "curves.py"
)
_curves = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_curves)
save_wall_clock_curves = _curves.save_wall_clock_curves


def test_curves_of_two_sides_with_seeds_shaded_make_a_png(tmp_path):
    rng = np.random.default_rng(0)

    def seed_run(speed: float) -> tuple[np.ndarray, np.ndarray]:
        seconds = np.sort(rng.uniform(1.0, 60.0, 80))
        return seconds, np.minimum(500.0, speed * seconds + rng.normal(0, 20, 80))

    curves = {"fast": [seed_run(20.0) for _ in range(3)], "slow": [seed_run(5.0) for _ in range(3)]}
    path = save_wall_clock_curves(str(tmp_path / "curves.png"), curves, "two sides")
    with open(path, "rb") as f:
        header = f.read(8)
    assert header == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (400, 700)  # 7 x 4 inches at 100 dpi
    # lines and shading drawn: far more than the axes' few colours
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 50


def test_runs_of_few_episodes_or_none_still_make_a_figure(tmp_path):
    few = (np.array([1.0, 2.0, 3.0]), np.array([10.0, 20.0, 30.0]))
    none = (np.array([]), np.array([]))
    curves = {"short": [few, few, none], "empty": [none]}
    path = save_wall_clock_curves(str(tmp_path / "c.png"), curves, "short", window=10)
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
