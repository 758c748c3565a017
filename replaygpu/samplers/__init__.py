"""Samplers: pure graph functions that draw minibatches from a `ReplayTable`."""

from replaygpu.frames import frame_rows
from replaygpu.samplers.base import Sampler
from replaygpu.samplers.frame_stack import (
    FrameStackSampler,
    make_frame_spec,
    make_frame_table,
)
from replaygpu.samplers.nstep import NStepSampler
from replaygpu.samplers.prioritized import LinearSchedule, PrioritizedSampler
from replaygpu.samplers.sequence import SequenceSampler
from replaygpu.samplers.sum_tree import SumTree
from replaygpu.samplers.uniform import UniformSampler

__all__ = [
    "FrameStackSampler",
    "LinearSchedule",
    "NStepSampler",
    "PrioritizedSampler",
    "Sampler",
    "SequenceSampler",
    "SumTree",
    "UniformSampler",
    "frame_rows",
    "make_frame_spec",
    "make_frame_table",
]
