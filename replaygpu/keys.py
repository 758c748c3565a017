"""Batch keys that samplers add and ``update_fn`` outputs the learner reads.

Use them instead of string literals in an ``update_fn``::

    weights = batch.get(IMPORTANCE_WEIGHTS)        # present with rg.Prioritized()
    return {"loss": loss, PRIORITIES: abs_td_error}

Imports nothing, so the actor side can use them without TensorFlow.
"""

from __future__ import annotations

#: ``update_fn`` output ([B] float): new priorities, to ``sampler.update_priorities``.
PRIORITIES = "priorities"

#: Batch key ([B] float32) added by `Prioritized`: ``(p_i / p_min) ** -beta``.
IMPORTANCE_WEIGHTS = "importance_weights"

#: Batch key ([B, T] float32) added by `Sequence`: 1 where a window step is real.
MASK = "mask"

#: Batch key ([B] float32) added by `NStep`: the bootstrap multiplier (`samplers.nstep`).
DISCOUNT = "discount"

#: Batch key ([B] int64) added by `NStep`: the number of rewards summed.
NSTEP = "nstep"

#: Batch key of a top-level tuple spec when a sampler adds keys (`nest.pack_batch`).
DATA = "data"
