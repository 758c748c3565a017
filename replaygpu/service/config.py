"""Configuration of the service: `ClientConfig` (actor side), `ServerConfig` (learner side) and
`ActorSettings` (what a learner asks its actors to run, carried by ``Info``).

Frozen dataclasses validated on construction; this module imports no TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from replaygpu.errors import ConfigError

MiB = 2**20

#: longest actor_id accepted, in bytes (it is kept per actor in the ledger and every checkpoint)
MAX_ACTOR_ID_BYTES = 128


def actor_id_problem(actor_id: str) -> str | None:
    """What is wrong with ``actor_id`` (None when it is fine): 1..128 printable ASCII bytes."""
    if not actor_id:
        return "it is empty"
    if len(actor_id) > MAX_ACTOR_ID_BYTES:
        return f"it is {len(actor_id)} characters long, over {MAX_ACTOR_ID_BYTES}"
    if not (actor_id.isascii() and actor_id.isprintable()):
        return "it has characters other than printable ASCII"
    return None


@dataclass(frozen=True)
class ClientConfig:
    """Buffering, limits and retries of a `ReplayClient`.

    Attributes:
        max_batch_transitions: seal a request at this many transitions (N).
        max_batch_bytes: ... or at this many bytes (B); keep it under the server's
            max_message_bytes.
        max_delay_s: ... or when the oldest buffered transition waited this long (T).
        max_buffer_bytes: bytes buffered or sent-but-unacknowledged, at most; `add` and
            `add_batch` block while it is full. A few requests in flight keep the stream
            busy; more only grows the actor's memory (and, measured with 7 MB frame requests,
            made ingest slower: 256 MiB -> 64 MiB gave 1.1 -> 1.3 GB/s with 2 actors).
        max_message_bytes: largest message sent or received (weights included).
        retry_initial_s: first backoff after UNAVAILABLE / DEADLINE_EXCEEDED / a full staging
            queue on the server; doubles up to ``retry_max_s``.
        retry_max_s: longest backoff (with the channel's own reconnect backoff capped at 1 s,
            a client is back within about 2.5 s of its server, however long it was away).
        retry_deadline_s: give up after this long without an ack (None: never). Then the next
            call raises, saying how many transitions were not acknowledged. The default (10
            minutes) outlasts a learner restart from its checkpoint.
        rpc_timeout_s: deadline of unary calls (Info, GetWeights).
        keep_freed_memory: tune glibc so freed request buffers are reused rather than
            unmapped (no page faults per request; process-wide, keeps up to
            ``max_buffer_bytes`` of freed heap; see
            `replaygpu.service.ops.allocator.keep_freed_memory`).
    """

    max_batch_transitions: int = 8192
    max_batch_bytes: int = 16 * MiB
    max_delay_s: float = 0.1
    max_buffer_bytes: int = 64 * MiB
    max_message_bytes: int = 64 * MiB
    retry_initial_s: float = 0.05
    retry_max_s: float = 1.0
    retry_deadline_s: float | None = 600.0
    rpc_timeout_s: float = 30.0
    keep_freed_memory: bool = True

    def __post_init__(self) -> None:
        for name in ("max_batch_transitions", "max_batch_bytes", "max_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ClientConfig.{name}: got {getattr(self, name)}, expected >= 1")
        if self.max_batch_bytes > self.max_message_bytes:
            raise ConfigError(
                f"ClientConfig.max_batch_bytes={self.max_batch_bytes} is over "
                f"max_message_bytes={self.max_message_bytes}; lower it"
            )
        for name in ("max_delay_s", "retry_initial_s", "retry_max_s", "retry_deadline_s"):
            if name == "retry_deadline_s" and self.retry_deadline_s is None:
                continue
            if not getattr(self, name) > 0:
                raise ConfigError(f"ClientConfig.{name}: got {getattr(self, name)}, expected > 0")


@dataclass(frozen=True)
class ServerConfig:
    """Limits and threading of a `ReplayServer`.

    Attributes:
        max_message_bytes: largest AppendRequest accepted (RESOURCE_EXHAUSTED above it) and
            largest message sent (weights).
        staging_max_batches: staged batches waiting for the committer, at most.
        staging_max_bytes: staged bytes, at most (one batch is always admitted).
        staging_timeout_s: how long an append waits for room in a full staging queue before
            RESOURCE_EXHAUSTED.
        inflight_max_bytes: memory of the Append requests read and not yet committed or
            refused, over all streams, at most (staged ones included; a request takes twice its
            size: received, then copied): a stream waits for room before it reads its next
            message, so HTTP/2 flow control holds its sender back, and the server's request
            memory stays bounded whatever the number of streams (see
            `replaygpu.service.learner.admission` for the exact bound). A request larger than
            this is still served, alone. The default holds 4 requests of the default largest
            size (16 of a default client's), which keeps the admit threads and the committer
            busy.
        max_actors: concurrent Append streams (one per connected actor) at most; one more is
            answered RESOURCE_EXHAUSTED at once, naming this limit. Streams are coroutines
            on the server's event loop, not threads, so this bounds memory, not threads.
        journal_dir: durable acknowledgements (off when None): every committed batch is
            appended to a journal in this folder and fsynced, once per commit round, before
            it is acknowledged, and the journal is replayed over the restored checkpoint when
            the server starts; so an ack means "on disk", and a kill -9 loses nothing that was
            acknowledged and duplicates nothing. Segments older than the previous checkpoint
            saved with `ReplayServer.save` are deleted (so that one plus the journal still
            restores everything should the newest be corrupt); checkpoint regularly. A full
            disk refuses appends retryably (RESOURCE_EXHAUSTED) until space is freed.
        admit_threads: threads that parse and copy large requests (1 MiB and over) off the
            event loop, so health checks and Info never wait behind them.
        shutdown_grace_s: on `stop`, how long in-flight RPCs get to finish.
        keep_freed_memory: tune glibc so freed batch buffers are reused rather than unmapped
            (3x faster commits of large batches; process-wide; see
            `replaygpu.service.ops.allocator.keep_freed_memory`).
        freeze_gc: at start, collect once and move every Python object alive to the garbage
            collector's permanent generation (`gc.freeze`), so full collections during ingest
            do not walk TensorFlow's long-lived objects and stall health checks (process-wide;
            see `replaygpu.service.ops.allocator.freeze_long_lived_objects`).
    """

    max_message_bytes: int = 64 * MiB
    staging_max_batches: int = 64
    staging_max_bytes: int = 512 * MiB
    staging_timeout_s: float = 30.0
    inflight_max_bytes: int = 512 * MiB
    max_actors: int = 1024
    journal_dir: str | None = None
    admit_threads: int = 2
    shutdown_grace_s: float = 5.0
    keep_freed_memory: bool = True
    freeze_gc: bool = True

    def __post_init__(self) -> None:
        for name in (
            "max_message_bytes",
            "staging_max_batches",
            "staging_max_bytes",
            "inflight_max_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"ServerConfig.{name}: got {getattr(self, name)}, expected >= 1")
        for name in ("max_actors", "admit_threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"ServerConfig.{name}: got {getattr(self, name)}, expected >= 1")
        if self.staging_timeout_s <= 0 or self.shutdown_grace_s < 0:
            raise ConfigError(
                f"ServerConfig: staging_timeout_s={self.staging_timeout_s} must be > 0 and "
                f"shutdown_grace_s={self.shutdown_grace_s} >= 0"
            )


@dataclass(frozen=True)
class ActorSettings:
    """What a learner asks its actors to run, sent to them in ``Info`` (``actor_settings``).

    ``replaygpu learner`` sets it so that ``replaygpu actor ADDRESS`` needs nothing but the
    address: the env, the policy network and its exploration come from here, the weights from
    ``GetWeights``. The field names are those of the actor's own config, which takes them over.

    Attributes:
        env_id: gymnasium env id.
        agent: ``"dqn"`` (epsilon-greedy over a Q-network) or ``"sac"`` (squashed Gaussian).
        hidden_sizes: hidden widths of the policy MLP.
        epsilon_base, epsilon_alpha: dqn exploration; actor i of N uses
            ``epsilon_base ** (1 + epsilon_alpha * i / (N - 1))`` (Ape-X).
        weight_pull_interval: env steps between weight pulls.
        num_envs: envs each actor steps together.
        stream_field: an int64 table field holding each row's env id, or "" if none.
        seed: the run's base seed.
        num_actors: the actors of the whole fleet, each with its own index in ``[0, N)``.
        frame_stack: k > 0 for a frame-table learner (`make_frame_table`): actors play an ALE
            game, act with the Nature CNN on ``[k, 84, 84]`` frame stacks and send whole
            episode segments (`frame_rows`); 0: vector transitions.
        segment_steps: frames: the longest table episode an actor sends in one request;
            longer ones are cut as truncations.
        repeat_action_probability: frames: ALE's sticky-action probability.
        terminal_on_life_loss: frames: a lost life ends the table episode as terminal (the
            game plays on).
        clip_rewards: frames: rows carry ``sign(reward)``.
        sequence_period: > 0 for a recurrent (R2D2) learner: actors act with its LSTM
            Q-network, carry the state, and send a sequence of up to ``sequence_length`` steps
            with the state before its first step every ``sequence_period`` steps of an
            episode (overlapping when the period is below the length); 0: not recurrent.
        sequence_length: recurrent: steps per sequence, the burn-in included.
        send_interval: steps per send: vector steps per ``add_batch``; frames: env steps per
            env of whole finished segments.
        insert_slack: the actors follow the samples-per-insert limit on the insert side:
            they wait while the table is more than this many rows ahead of what the learner
            has sampled; -1: never wait.
    """

    env_id: str
    agent: Literal["dqn", "sac"] = "dqn"
    hidden_sizes: tuple[int, ...] = ()
    epsilon_base: float = 0.4
    epsilon_alpha: float = 7.0
    weight_pull_interval: int = 400
    num_envs: int = 1
    stream_field: str = ""
    seed: int = 1
    num_actors: int = 1
    frame_stack: int = 0
    segment_steps: int = 1000
    repeat_action_probability: float = 0.25
    terminal_on_life_loss: bool = True
    clip_rewards: bool = True
    sequence_period: int = 0
    sequence_length: int = 0
    send_interval: int = 32
    insert_slack: int = 2048

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ConfigError("ActorSettings.env_id: got an empty string, expected an env id")
        if self.agent not in ("dqn", "sac"):
            raise ConfigError(f"ActorSettings.agent: got {self.agent!r}, expected 'dqn' or 'sac'")
        if min(self.weight_pull_interval, self.num_envs, self.num_actors) < 1:
            raise ConfigError(
                f"ActorSettings: weight_pull_interval={self.weight_pull_interval}, "
                f"num_envs={self.num_envs} and num_actors={self.num_actors}, expected all >= 1"
            )
        if self.frame_stack < 0 or self.segment_steps < 1:
            raise ConfigError(
                f"ActorSettings: frame_stack={self.frame_stack} and segment_steps="
                f"{self.segment_steps}, expected >= 0 (0: vector transitions) and >= 1"
            )
        if self.frame_stack and self.agent != "dqn":
            raise ConfigError(
                f"ActorSettings.agent: got {self.agent!r} with frame_stack={self.frame_stack}, "
                "expected 'dqn' (frame actors act with a Nature CNN Q-network)"
            )
        if self.sequence_period and not 0 < self.sequence_period <= self.sequence_length:
            raise ConfigError(
                f"ActorSettings: sequence_period={self.sequence_period} and sequence_length="
                f"{self.sequence_length}, expected 0 < sequence_period <= sequence_length (or "
                "sequence_period 0: not recurrent)"
            )
        if self.send_interval < 1 or self.insert_slack < -1:
            raise ConfigError(
                f"ActorSettings: send_interval={self.send_interval} and insert_slack="
                f"{self.insert_slack}, expected >= 1 and >= -1 (-1: never wait)"
            )
        if not 0.0 <= self.repeat_action_probability <= 1.0:
            raise ConfigError(
                "ActorSettings.repeat_action_probability: got "
                f"{self.repeat_action_probability}, expected in [0, 1]"
            )

    def to_proto(self, message: Any) -> None:
        """Fill an ``ActorSettings`` protobuf ``message`` in place (its fields are named as
        these)."""
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, (tuple, list)):  # a repeated field
                getattr(message, field.name)[:] = value
            else:
                setattr(message, field.name, value)

    @classmethod
    def from_proto(cls, message: Any) -> ActorSettings:
        """The settings an ``ActorSettings`` protobuf message carries.

        A learner from before a field sends it as 0: ``num_actors``, ``segment_steps`` and
        ``send_interval`` then take their defaults, and ``frame_stack`` and ``sequence_period``
        0 are a vector learner; it leaves ``insert_slack`` unset (0 is a value), which then
        takes its default too.

        Raises:
            ConfigError: the message is empty or holds values out of range.
        """
        values = {field.name: getattr(message, field.name) for field in fields(cls)}
        values["hidden_sizes"] = tuple(values["hidden_sizes"])
        for name in ("num_actors", "segment_steps", "send_interval"):
            values[name] = values[name] or getattr(cls, name)
        if not message.HasField("insert_slack"):
            values["insert_slack"] = cls.insert_slack
        return cls(**values)
