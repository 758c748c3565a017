"""replaygpu: device-resident replay buffers and fused multi-step learners for TensorFlow 2.

The public API, re-exported here; agents and users import only these names. Internals stay
importable from their modules (``replaygpu.samplers.sum_tree.SumTree``, ...).

Names are imported lazily on first use (PEP 562), so ``import replaygpu.service.actor.client`` (the
actor side) does not import TensorFlow; ``replaygpu.ReplayTable`` and friends import it when
first touched. The import block under ``if TYPE_CHECKING:`` below is the one list of exported
names: static analysers read it as it stands, and ``_EXPORTS`` is read off it at import time.
To export a name, add it there.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaygpu._version import __version__

if TYPE_CHECKING:
    from replaygpu.checkpoint import Checkpointer, CheckpointSchedule, check_writable
    from replaygpu.errors import (
        BatchError,
        CheckpointCorruptError,
        CheckpointMismatchError,
        CheckpointSaveError,
        ConfigError,
        EmptyTableError,
        OutOfDeviceMemoryError,
        ReplayError,
        StorageFullError,
    )
    from replaygpu.fields import TRANSITION_FIELDS, FieldSpec, HostSpec
    from replaygpu.frames import frame_rows
    from replaygpu.keys import DATA, DISCOUNT, IMPORTANCE_WEIGHTS, MASK, NSTEP, PRIORITIES
    from replaygpu.learner.learner import Learner
    from replaygpu.learner.rate_limiter import SampleToInsertRatio
    from replaygpu.learner.ratio import SampleToInsertRule
    from replaygpu.memory import plan_capacity
    from replaygpu.nest import flatten as flatten_nest
    from replaygpu.nest import flatten_batch, pack_batch
    from replaygpu.nest import pack as pack_nest
    from replaygpu.samplers import (
        Distribution,
        FrameStack,
        FrameStackSampler,
        LinearSchedule,
        NStep,
        NStepSampler,
        Prioritized,
        PrioritizedSampler,
        Sampler,
        Sequence,
        SequenceSampler,
        Transition,
        Uniform,
        UniformSampler,
        View,
        make_frame_spec,
        make_frame_table,
    )
    from replaygpu.service.actor.client import ReplayClient
    from replaygpu.service.config import ActorSettings, ClientConfig, ServerConfig
    from replaygpu.service.learner.ledger import SequenceLedger
    from replaygpu.service.learner.loop import run as run_learner
    from replaygpu.service.learner.loop import step as learner_step
    from replaygpu.service.learner.server import serve
    from replaygpu.service.ops.auth import TLSConfig
    from replaygpu.service.ops.metrics import MetricsServer, start_metrics_server
    from replaygpu.service.wire.status import (
        AuthenticationError,
        DiskFullError,
        InvalidBatchError,
        ResourceExhaustedError,
        ServiceError,
        ServiceUnavailableError,
        StagingFullError,
        TableNotFoundError,
        TLSError,
    )
    from replaygpu.sharded import ShardedReplayTable, mirrored_strategy
    from replaygpu.specs import (
        NestedSpec,
        Spec,
        host_spec,
        normalize_spec,
        spec_from_json,
        spec_to_json,
        specs_from_env,
    )
    from replaygpu.storage import ReplayTable
    from replaygpu.table import Table


def _read_exports() -> dict[str, tuple[str, str]]:
    """``{public name: (module, name in the module)}`` from the ``TYPE_CHECKING`` block above."""
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
    )
    return {
        alias.asname or alias.name: (node.module, alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_EXPORTS = _read_exports()

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    found = _EXPORTS.get(name)
    if found is None:
        raise AttributeError(f"module 'replaygpu' has no attribute {name!r}")
    module, attribute = found
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
