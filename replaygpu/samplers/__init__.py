"""Samplers: an index distribution (which rows) times a view (what a row becomes), in the graph.

- distributions: `Uniform`, `Prioritized` (`uniform.py`, `prioritized.py`, `sum_tree.py`);
- views: `Transition`, `NStep`, `FrameStack`, `Sequence` (`view.py`, `nstep.py`,
  `frame_stack.py`, `sequence.py`);
- `Sampler` puts one of each together over a plain or a sharded table (`sampler.py`);
- the names users know are `Sampler` with its parts fixed (`names.py`).
"""

from replaygpu.frames import frame_rows
from replaygpu.samplers.distribution import Distribution, Index
from replaygpu.samplers.frame_stack import FrameStack, make_frame_spec, make_frame_table
from replaygpu.samplers.names import (
    FrameStackSampler,
    NStepSampler,
    PrioritizedSampler,
    SequenceSampler,
    UniformSampler,
)
from replaygpu.samplers.nstep import NStep
from replaygpu.samplers.prioritized import LinearSchedule, Prioritized
from replaygpu.samplers.sampler import Sampler
from replaygpu.samplers.sequence import Sequence
from replaygpu.samplers.sum_tree import SumTree
from replaygpu.samplers.uniform import Uniform
from replaygpu.samplers.view import Transition, View

__all__ = [
    "Distribution",
    "FrameStack",
    "FrameStackSampler",
    "Index",
    "LinearSchedule",
    "NStep",
    "NStepSampler",
    "Prioritized",
    "PrioritizedSampler",
    "Sampler",
    "Sequence",
    "SequenceSampler",
    "SumTree",
    "Transition",
    "Uniform",
    "UniformSampler",
    "View",
    "frame_rows",
    "make_frame_spec",
    "make_frame_table",
]
