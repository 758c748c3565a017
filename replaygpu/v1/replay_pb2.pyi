from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class NamedTensor(_message.Message):
    __slots__ = ("name", "tensor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensor: Tensor
    def __init__(self, name: _Optional[str] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("fields",)
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    def __init__(self, fields: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("table", "actor_id", "seq", "batch", "episodes")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    table: str
    actor_id: str
    seq: int
    batch: Batch
    episodes: _containers.RepeatedCompositeFieldContainer[Episode]
    def __init__(self, table: _Optional[str] = ..., actor_id: _Optional[str] = ..., seq: _Optional[int] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., episodes: _Optional[_Iterable[_Union[Episode, _Mapping]]] = ...) -> None: ...

class Episode(_message.Message):
    __slots__ = ("episode_return", "length")
    EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    episode_return: float
    length: int
    def __init__(self, episode_return: _Optional[float] = ..., length: _Optional[int] = ...) -> None: ...

class AppendAck(_message.Message):
    __slots__ = ("seq", "committed_seq", "table_size", "transitions", "duplicate", "table_inserted", "sampled", "run_finished")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_SEQ_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    TABLE_INSERTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    committed_seq: int
    table_size: int
    transitions: int
    duplicate: bool
    table_inserted: int
    sampled: int
    run_finished: bool
    def __init__(self, seq: _Optional[int] = ..., committed_seq: _Optional[int] = ..., table_size: _Optional[int] = ..., transitions: _Optional[int] = ..., duplicate: _Optional[bool] = ..., table_inserted: _Optional[int] = ..., sampled: _Optional[int] = ..., run_finished: _Optional[bool] = ...) -> None: ...

class GetWeightsRequest(_message.Message):
    __slots__ = ("newer_than",)
    NEWER_THAN_FIELD_NUMBER: _ClassVar[int]
    newer_than: int
    def __init__(self, newer_than: _Optional[int] = ...) -> None: ...

class Weights(_message.Message):
    __slots__ = ("version", "tensors", "named")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    NAMED_FIELD_NUMBER: _ClassVar[int]
    version: int
    tensors: _containers.RepeatedCompositeFieldContainer[NamedTensor]
    named: bool
    def __init__(self, version: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[NamedTensor, _Mapping]]] = ..., named: _Optional[bool] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ("actor_id",)
    ACTOR_ID_FIELD_NUMBER: _ClassVar[int]
    actor_id: str
    def __init__(self, actor_id: _Optional[str] = ...) -> None: ...

class FieldSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class RateLimiterInfo(_message.Message):
    __slots__ = ("kind", "samples_per_insert", "min_size_to_sample", "error_buffer", "sampled")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_INSERT_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_TO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    ERROR_BUFFER_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    kind: str
    samples_per_insert: float
    min_size_to_sample: int
    error_buffer: float
    sampled: int
    def __init__(self, kind: _Optional[str] = ..., samples_per_insert: _Optional[float] = ..., min_size_to_sample: _Optional[int] = ..., error_buffer: _Optional[float] = ..., sampled: _Optional[int] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "spec", "capacity", "size", "inserted", "sampled", "device", "rate_limiter")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    INSERTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITER_FIELD_NUMBER: _ClassVar[int]
    name: str
    spec: _containers.RepeatedCompositeFieldContainer[FieldSpec]
    capacity: int
    size: int
    inserted: int
    sampled: int
    device: str
    rate_limiter: RateLimiterInfo
    def __init__(self, name: _Optional[str] = ..., spec: _Optional[_Iterable[_Union[FieldSpec, _Mapping]]] = ..., capacity: _Optional[int] = ..., size: _Optional[int] = ..., inserted: _Optional[int] = ..., sampled: _Optional[int] = ..., device: _Optional[str] = ..., rate_limiter: _Optional[_Union[RateLimiterInfo, _Mapping]] = ...) -> None: ...

class AgentSettings(_message.Message):
    __slots__ = ("agent", "version", "json")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    agent: str
    version: int
    json: str
    def __init__(self, agent: _Optional[str] = ..., version: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("tables", "weights_version", "learner_steps", "staged_batches", "staged_bytes", "max_message_bytes", "server_version", "actors", "actor_last_seq", "actor_settings", "run_finished", "learner_stats")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    LEARNER_STEPS_FIELD_NUMBER: _ClassVar[int]
    STAGED_BATCHES_FIELD_NUMBER: _ClassVar[int]
    STAGED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    ACTORS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    ACTOR_SETTINGS_FIELD_NUMBER: _ClassVar[int]
    RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    LEARNER_STATS_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableInfo]
    weights_version: int
    learner_steps: int
    staged_batches: int
    staged_bytes: int
    max_message_bytes: int
    server_version: str
    actors: int
    actor_last_seq: int
    actor_settings: AgentSettings
    run_finished: bool
    learner_stats: LearnerStats
    def __init__(self, tables: _Optional[_Iterable[_Union[TableInfo, _Mapping]]] = ..., weights_version: _Optional[int] = ..., learner_steps: _Optional[int] = ..., staged_batches: _Optional[int] = ..., staged_bytes: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., server_version: _Optional[str] = ..., actors: _Optional[int] = ..., actor_last_seq: _Optional[int] = ..., actor_settings: _Optional[_Union[AgentSettings, _Mapping]] = ..., run_finished: _Optional[bool] = ..., learner_stats: _Optional[_Union[LearnerStats, _Mapping]] = ...) -> None: ...

class LearnerStats(_message.Message):
    __slots__ = ("target_steps", "loss", "mean_return", "mean_length", "recent_episodes", "episodes", "eval_return", "eval_step")
    TARGET_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    MEAN_RETURN_FIELD_NUMBER: _ClassVar[int]
    MEAN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    RECENT_EPISODES_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    EVAL_RETURN_FIELD_NUMBER: _ClassVar[int]
    EVAL_STEP_FIELD_NUMBER: _ClassVar[int]
    target_steps: int
    loss: float
    mean_return: float
    mean_length: float
    recent_episodes: int
    episodes: int
    eval_return: float
    eval_step: int
    def __init__(self, target_steps: _Optional[int] = ..., loss: _Optional[float] = ..., mean_return: _Optional[float] = ..., mean_length: _Optional[float] = ..., recent_episodes: _Optional[int] = ..., episodes: _Optional[int] = ..., eval_return: _Optional[float] = ..., eval_step: _Optional[int] = ...) -> None: ...
