"""Batch keys that samplers add and ``update_fn`` outputs the learner reads.

Use these constants (``from replaygpu.keys import PRIORITIES, ...``) instead of string
literals in an ``update_fn``::

    weights = batch.get(IMPORTANCE_WEIGHTS)        # present with rg.Prioritized()
    return {"loss": loss, PRIORITIES: abs_td_error}

Imports nothing, so the actor side can use them without TensorFlow.
"""

from __future__ import annotations

#: ``update_fn`` output ([B] float): new priorities of the sampled rows, handed to
#: ``sampler.update_priorities`` in the same loop step.
PRIORITIES = "priorities"

#: Batch key ([B] float32) added by `Prioritized`: ``(p_i / p_min) ** -beta``.
IMPORTANCE_WEIGHTS = "importance_weights"

#: Batch key ([B, T] float32) added by `Sequence`: 1 where a window step is real.
MASK = "mask"

#: Batch key ([B] float32) added by `NStep`: ``gamma**k * (1 - terminated)``, the
#: multiplier of the bootstrap value.
DISCOUNT = "discount"

#: Batch key ([B] int64) added by `NStep`: the number of rewards summed.
NSTEP = "nstep"

#: Batch key of a table whose spec is a tuple or namedtuple at the top, when its sampler adds
#: keys: the batch is ``{"data": <the spec's structure>, "importance_weights": ..., ...}``.
DATA = "data"
