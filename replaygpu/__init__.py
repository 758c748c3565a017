"""replaygpu: device-resident replay buffers and fused multi-step learners for TensorFlow 2.

The public API, re-exported here; agents and users import only these names.

Names are imported lazily on first use (PEP 562), so ``import replaygpu.service.client`` (the
actor side) does not import TensorFlow; ``replaygpu.ReplayTable`` and friends import it when
first touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> module that defines it. Add a line here and to ``__all__`` to export a name.
_EXPORTS = {
    "Checkpointer": "replaygpu.checkpoint",
    "resolve_device": "replaygpu.device",
    "BatchError": "replaygpu.errors",
    "CheckpointMismatchError": "replaygpu.errors",
    "ConfigError": "replaygpu.errors",
    "EmptyTableError": "replaygpu.errors",
    "ReplayError": "replaygpu.errors",
    "Learner": "replaygpu.learner",
    "SampleToInsertRatio": "replaygpu.learner",
    "Sampler": "replaygpu.samplers",
    "UniformSampler": "replaygpu.samplers",
    "FrameStackSampler": "replaygpu.samplers",
    "LinearSchedule": "replaygpu.samplers",
    "NStepSampler": "replaygpu.samplers",
    "PrioritizedSampler": "replaygpu.samplers",
    "SequenceSampler": "replaygpu.samplers",
    "SumTree": "replaygpu.samplers",
    "frame_rows": "replaygpu.samplers",
    "make_frame_spec": "replaygpu.samplers",
    "make_frame_table": "replaygpu.samplers",
    "TRANSITION_FIELDS": "replaygpu.specs",
    "Spec": "replaygpu.specs",
    "batch_signature": "replaygpu.specs",
    "spec_from_json": "replaygpu.specs",
    "spec_to_json": "replaygpu.specs",
    "specs_from_env": "replaygpu.specs",
    "validate_batch": "replaygpu.specs",
    "ReplayTable": "replaygpu.storage",
    # service (the client side imports no TensorFlow)
    "ReplayClient": "replaygpu.service.client",
    "ClientConfig": "replaygpu.service.config",
    "TLSConfig": "replaygpu.service.auth",
    "ServerConfig": "replaygpu.service.config",
    "ReplayServer": "replaygpu.service.server",
    "SequenceLedger": "replaygpu.service.ledger",
    "serve": "replaygpu.service.server",
    "ServiceError": "replaygpu.service.status",
    "ServiceUnavailableError": "replaygpu.service.status",
    "TableNotFoundError": "replaygpu.service.status",
}

__all__ = [
    "TRANSITION_FIELDS",
    "BatchError",
    "CheckpointMismatchError",
    "Checkpointer",
    "ClientConfig",
    "ConfigError",
    "EmptyTableError",
    "FrameStackSampler",
    "Learner",
    "LinearSchedule",
    "NStepSampler",
    "PrioritizedSampler",
    "ReplayClient",
    "ReplayError",
    "ReplayServer",
    "ReplayTable",
    "SampleToInsertRatio",
    "Sampler",
    "SequenceLedger",
    "SequenceSampler",
    "ServerConfig",
    "ServiceError",
    "ServiceUnavailableError",
    "Spec",
    "SumTree",
    "TLSConfig",
    "TableNotFoundError",
    "UniformSampler",
    "__version__",
    "batch_signature",
    "frame_rows",
    "make_frame_spec",
    "make_frame_table",
    "resolve_device",
    "serve",
    "spec_from_json",
    "spec_to_json",
    "specs_from_env",
    "validate_batch",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'replaygpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers and IDEs see the real imports
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
    from replaygpu.samplers import (
        FrameStackSampler,
        LinearSchedule,
        NStepSampler,
        PrioritizedSampler,
        Sampler,
        SequenceSampler,
        SumTree,
        UniformSampler,
        frame_rows,
        make_frame_spec,
        make_frame_table,
    )
    from replaygpu.service.auth import TLSConfig
    from replaygpu.service.client import ReplayClient
    from replaygpu.service.config import ClientConfig, ServerConfig
    from replaygpu.service.ledger import SequenceLedger
    from replaygpu.service.server import ReplayServer, serve
    from replaygpu.service.status import (
        ServiceError,
        ServiceUnavailableError,
        TableNotFoundError,
    )
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
