"""Frame-table rows (layout: `replaygpu.samplers.frame_stack`) from an actor's steps, without
TensorFlow, for actors writing over gRPC."""

from __future__ import annotations

import numpy as np

from replaygpu.errors import BatchError


def frame_rows(
    frames: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    first: bool,
) -> dict[str, np.ndarray]:
    """``n`` transition rows for ``n`` consecutive steps of one episode, plus the ``final`` row
    when the last step ended it, ready for ``table.append``. `BatchError` on inconsistent lengths
    or an episode end before the last step.

    Args:
        frames: ``[n + 1, H, W]``: each step's newest observation frame, then the last
            step's next-observation frame.
        actions: ``[n]``, each step's action.
        rewards: ``[n]``.
        terminated: ``[n]``; only the last step may end the episode.
        truncated: ``[n]``, as ``terminated``.
        first: whether ``frames[0]`` is the reset frame. If the episode goes on, ``frames[n]`` is
            not stored: pass it as the next chunk's ``frames[0]`` with ``first=False``.
    """
    frames = np.asarray(frames)
    n = len(actions)
    done = np.asarray(terminated, bool) | np.asarray(truncated, bool)
    if n < 1 or frames.shape[0] != n + 1 or not (len(rewards) == len(done) == n):
        raise BatchError(
            f"frame_rows: got {frames.shape[0]} frames, {n} actions, {len(rewards)} rewards, "
            f"{len(done)} done flags; expected n + 1 frames and n of each other (n >= 1)"
        )
    if done[:-1].any():
        raise BatchError(
            f"frame_rows: step {int(np.argmax(done))} of {n} ends the episode; only the last "
            "step of a chunk may, so split the steps at episode ends"
        )
    ends = bool(done[-1])
    m = n + int(ends)
    actions = np.asarray(actions)
    rows = {
        "frame": frames[:m],
        "action": np.concatenate([actions, np.zeros_like(actions[:1])])[:m],
        "reward": np.concatenate([np.asarray(rewards, np.float32), [0.0]])[:m].astype(np.float32),
        "terminated": np.concatenate([np.asarray(terminated, bool), [False]])[:m],
        "truncated": np.concatenate([np.asarray(truncated, bool), [False]])[:m],
        "first": np.zeros(m, bool),
        "final": np.zeros(m, bool),
    }
    rows["first"][0] = bool(first)
    rows["final"][n:] = True
    return rows
