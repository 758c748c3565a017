"""replaygpu: device-resident replay buffers and fused multi-step learners for TensorFlow 2.

The core is re-exported here; everything else comes from its module (`PUBLIC_MODULES` lists
the public ones), for example:

- `replaygpu.errors`: the library's errors (`BatchError`, `CheckpointMismatchError`, ...), and
  `replaygpu.service.wire.status` the service's (`ServiceError`, `StagingFullError`, ...);
- `replaygpu.specs` (`specs_from_env`, `host_spec`, ...), `replaygpu.fields`, `replaygpu.keys`
  (the batch keys), `replaygpu.nest`, `replaygpu.frames`, `replaygpu.memory`;
- `replaygpu.samplers` (`LinearSchedule`, `make_frame_table`, ...), `replaygpu.checkpoint`,
  `replaygpu.sharded` (`mirrored_strategy`);
- `replaygpu.service.config` (`ClientConfig`, `ServerConfig`), `replaygpu.service.server.*`
  (`loop`, `ledger`, `server`), `replaygpu.service.ops.*` (`auth`, `metrics`);
- `replaygpu.numpy_model` (`NumpyModel`: a Keras policy's forward pass in numpy, for acting
  without TensorFlow) and `replaygpu.numpy_layers`, the layers it runs.

Names are imported on first use (PEP 562), so ``import replaygpu`` and the actor side import no
TensorFlow. `_EXPORTS` and the ``TYPE_CHECKING`` imports agree (tests/test_package.py checks).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from replaygpu._version import __version__

if TYPE_CHECKING:
    from replaygpu.checkpoint import Checkpointer
    from replaygpu.errors import ConfigError
    from replaygpu.learner.learner import Learner
    from replaygpu.learner.rate_limiter import SampleToInsertRatio
    from replaygpu.samplers import (
        FrameStack,
        NStep,
        Prioritized,
        Sampler,
        Sequence,
        Transition,
        Uniform,
    )
    from replaygpu.service.actor.client import ReplayClient
    from replaygpu.service.server.server import serve
    from replaygpu.sharded import ShardedReplayTable
    from replaygpu.table import ReplayTable

_EXPORTS = {
    "ReplayTable": "replaygpu.table",
    "ShardedReplayTable": "replaygpu.sharded",
    "Sampler": "replaygpu.samplers",
    "Uniform": "replaygpu.samplers",
    "Prioritized": "replaygpu.samplers",
    "Transition": "replaygpu.samplers",
    "NStep": "replaygpu.samplers",
    "FrameStack": "replaygpu.samplers",
    "Sequence": "replaygpu.samplers",
    "Learner": "replaygpu.learner.learner",
    "SampleToInsertRatio": "replaygpu.learner.rate_limiter",
    "Checkpointer": "replaygpu.checkpoint",
    "serve": "replaygpu.service.server.server",
    "ReplayClient": "replaygpu.service.actor.client",
    "ConfigError": "replaygpu.errors",
}

#: the public modules: what programs (the agents included) import, and what the API reference
#: documents (tests/test_docs.py holds the two together); a module not listed is internal
PUBLIC_MODULES = (
    "replaygpu",
    "replaygpu.checkpoint",
    "replaygpu.errors",
    "replaygpu.fields",
    "replaygpu.frames",
    "replaygpu.keys",
    "replaygpu.memory",
    "replaygpu.nest",
    "replaygpu.numpy_layers",
    "replaygpu.numpy_model",
    "replaygpu.samplers",
    "replaygpu.service.config",
    "replaygpu.service.server.ledger",
    "replaygpu.service.server.loop",
    "replaygpu.service.ops.auth",
    "replaygpu.service.wire.status",
    "replaygpu.sharded",
    "replaygpu.specs",
    "replaygpu.table",
    "replaygpu.targets",
)

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'replaygpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
