"""Learning curves over wall-clock time, the peers benchmarks' figures (`cartpole_sb3.py`,
`mujoco_sb3.py`), drawn as the demos' own plots are (`progress.save_figure`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from replaygpu.agents.progress import save_figure


def save_wall_clock_curves(
    path: str,
    curves: Mapping[str, Sequence[tuple[np.ndarray, np.ndarray]]],
    title: str,
    window: int = 10,
) -> str:
    """Plot learning curves over wall-clock time, one colour per label: for each seed's
    ``(seconds, returns)`` of its training episodes, the moving average of ``window`` episodes
    (of a fifth of them where a seed has fewer than ``5 * window``: MuJoCo's 1000-step episodes);
    the median over seeds as a line, their range shaded; a run without episodes is left out.
    A PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in curves.items():
        smooth = []
        for seconds, returns in (run for run in runs if len(run[1])):  # a run may end none
            w = max(1, min(window, len(returns) // 5))
            smooth.append((seconds[w - 1 :], np.convolve(returns, np.ones(w) / w, "valid")))
        if not smooth:
            continue
        end = min(t[-1] for t, _ in smooth)  # where every seed still has episodes
        grid = np.linspace(max(t[0] for t, _ in smooth), end, 200)
        ys = np.array([np.interp(grid, t, y) for t, y in smooth])
        (line,) = ax.plot(grid, np.median(ys, axis=0), label=f"{label} ({len(runs)} seeds)")
        ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2)
    xlabel = "wall-clock seconds from the process's start"
    ylabel = f"training episode return (moving mean, up to {window})"
    return save_figure(fig, ax, path, title, xlabel, ylabel)
