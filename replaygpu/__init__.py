"""replaygpu: device-resident replay buffers and fused multi-step learners for TensorFlow 2.

The public API, re-exported here; agents and users import only these names.
"""

from replaygpu.checkpoint import Checkpointer
from replaygpu.device import resolve_device
from replaygpu.errors import (
    BatchError,
    CheckpointMismatchError,
    ConfigError,
    EmptyTableError,
    ReplayError,
)
from replaygpu.learner import Learner, SampleToInsertRatio
from replaygpu.samplers import Sampler, UniformSampler
from replaygpu.specs import (
    TRANSITION_FIELDS,
    Spec,
    batch_signature,
    spec_from_json,
    spec_to_json,
    specs_from_env,
    validate_batch,
)
from replaygpu.storage import ReplayTable

__version__ = "0.1.0"

__all__ = [
    "TRANSITION_FIELDS",
    "BatchError",
    "CheckpointMismatchError",
    "Checkpointer",
    "ConfigError",
    "EmptyTableError",
    "Learner",
    "ReplayError",
    "ReplayTable",
    "SampleToInsertRatio",
    "Sampler",
    "Spec",
    "UniformSampler",
    "__version__",
    "batch_signature",
    "resolve_device",
    "spec_from_json",
    "spec_to_json",
    "specs_from_env",
    "validate_batch",
]
