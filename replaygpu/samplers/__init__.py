"""Samplers: an index distribution (which rows) times a view (what a row becomes), in the graph.

`Sampler` puts one of each together: ``Sampler(table, Prioritized(), NStep(3))``.
"""

from replaygpu.frames import frame_rows
from replaygpu.samplers.distribution import Distribution, Index
from replaygpu.samplers.frame_stack import FrameStack, make_frame_spec, make_frame_table
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
    "Index",
    "LinearSchedule",
    "NStep",
    "Prioritized",
    "Sampler",
    "Sequence",
    "SumTree",
    "Transition",
    "Uniform",
    "View",
    "frame_rows",
    "make_frame_spec",
    "make_frame_table",
]
