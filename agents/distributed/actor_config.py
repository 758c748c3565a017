"""`ActorConfig` with every rule of an actor's config, without TensorFlow: the actor loop
(`actor.run_actor`), its experience kinds and the drivers read it, importing none of each other.

A learner decides the `SETTINGS_FIELDS` and announces them in ``Info`` as JSON
(`ActorConfig.to_settings`); the library passes the document on unread, and
`ActorConfig.from_settings` takes it over, so ``replaygpu actor ADDRESS`` needs no other flags.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal

import replaygpu as rg
from replaygpu.service.config import AgentSettings
from replaygpu.service.ops.auth import TLSConfig
from replaygpu.service.ops.commands import client_tls

from ..config_fields import option
from ..configs import require, require_positive, require_positive_ints, require_unit_interval

#: the fields a learner decides for its actors and announces in its settings document
SETTINGS_FIELDS = (
    "env_id",
    "agent",
    "num_actors",
    "num_envs",
    "seed",
    "weight_pull_interval",
    "send_interval",
    "epsilon_base",
    "epsilon_alpha",
    "insert_slack",
    "frame_stack",
    "segment_steps",
    "repeat_action_probability",
    "terminal_on_life_loss",
    "clip_rewards",
    "sequence_period",
    "sequence_length",
)
#: raise it when a field is added or changes meaning, so an older actor refuses the document
#: rather than misread it
SETTINGS_VERSION = 1
#: the agents whose learners announce settings that an `ActorConfig` runs
SETTINGS_AGENTS = ("dqn", "sac", "r2d2")


@dataclass(frozen=True)
class ActorConfig:
    """How one actor collects: vector transitions (``frame_stack`` 0) or ALE frames (k > 0)."""

    env_id: str = option("CartPole-v1", "gymnasium env id")
    agent: Literal["dqn", "sac"] = option(
        "dqn",
        "policy: dqn (epsilon-greedy Q-network, Discrete actions) or sac (squashed Gaussian, "
        "Box actions)",
    )
    actor_index: int = option(0, "this actor's index i in [0, N)")
    num_actors: int = option(1, "N, actors in the whole run")
    actor_id_prefix: str = option(
        "",
        "actor ids are PREFIX-INDEX, unique per actor (the learner's exactly-once ledger keys on "
        "them); empty: HOSTNAME-PID, so actors on other hosts, in other containers or in other "
        "processes never share an id",
    )
    num_envs: int = option(8, "envs stepped together per actor")
    seed: int = option(1, "base seed (offset by the actor index)")
    steps: int = option(0, "env steps to collect; 0: until stopped")
    weight_pull_interval: int = option(
        400, "env steps between get_weights(newer_than=version) calls"
    )
    send_interval: int = option(32, "vector steps per send (frames: of whole finished segments)")
    epsilon_base: float = option(0.4, "Ape-X epsilon base")
    epsilon_alpha: float = option(7.0, "Ape-X epsilon exponent spread")
    insert_slack: int = option(
        2048,
        "follow the server's samples-per-insert limit on the insert side: wait while the table "
        "is more than this many rows ahead of what the learner has sampled; -1: never wait",
    )
    frame_stack: int = option(
        0,
        "k > 0: play an ALE game for a frame-table learner, acting with the Nature CNN on "
        "[k, 84, 84] frame stacks; 0: vector transitions",
    )
    segment_steps: int = option(
        1000,
        "frames: longest table episode sent in one request; longer ones are cut as truncations "
        "(the first k-1 stacks after a cut are padded)",
    )
    repeat_action_probability: float = option(
        0.25, "frames: ALE sticky actions (Machado et al. 2018)"
    )
    terminal_on_life_loss: bool = option(
        True, "frames: a lost life is terminal (the game plays on)"
    )
    clip_rewards: bool = option(True, "frames: send sign(reward)")
    sequence_period: int = option(
        0,
        "p > 0: act with an R2D2 learner's LSTM Q-network and send a sequence of "
        "sequence_length steps, with the LSTM state before its first step, every p steps "
        "(agents/distributed/experience.py); 0: not recurrent",
    )
    sequence_length: int = option(0, "recurrent: steps per sequence, the burn-in included")
    retry_deadline_s: float = option(
        60.0,
        "give up when the server stops answering this long during the run (an outage logs one "
        "line when it begins and one when it ends)",
    )
    progress_interval_s: float = option(
        30.0,
        "seconds between progress lines (env steps/s, episodes, last return, transitions "
        "acknowledged); 0: none",
    )
    table: str = option("replay", "table name on the server")
    token: str | None = option(None, "bearer token, if the server needs one")
    tls_ca: str | None = option(None, "CA certificate that signed the server's (enables TLS)")
    tls_cert: str | None = option(None, "client certificate, for a server that requires one")
    tls_key: str | None = option(None, "private key of tls_cert")
    server_name: str | None = option(None, "name to check the server certificate against")

    def __post_init__(self) -> None:
        _check(self)

    @classmethod
    def check_given(cls, given: Mapping[str, object]) -> None:
        """Check the flags ``given`` before the learner is asked: every check that reads only
        fields in ``given`` or outside `SETTINGS_FIELDS` (those keep their defaults).

        Raises:
            ConfigError: a value out of range, as the config itself would refuse it.
        """
        fields = dataclasses.fields(cls)
        known = set(given) | {f.name for f in fields} - set(SETTINGS_FIELDS)
        values = {f.name: f.default for f in fields} | dict(given)
        _check(SimpleNamespace(**values), known)

    @classmethod
    def settings_of(cls, learner: Any, agent: str, /, **values: Any) -> AgentSettings:
        """The settings document a learner of ``agent`` announces: each of `SETTINGS_FIELDS`
        its config ``learner`` has by name, then ``values`` (fields it names otherwise)."""
        shared = {n: getattr(learner, n) for n in SETTINGS_FIELDS if hasattr(learner, n)}
        return cls(**(shared | values)).to_settings(agent)

    def to_settings(self, agent: str) -> AgentSettings:
        """The document a learner of ``agent`` announces: `SETTINGS_FIELDS` as JSON."""
        values = {name: getattr(self, name) for name in SETTINGS_FIELDS}
        return AgentSettings(agent, SETTINGS_VERSION, json.dumps(values, sort_keys=True))

    @classmethod
    def from_settings(cls, settings: AgentSettings, **overrides: object) -> ActorConfig:
        """The config of a `to_settings` document; ``overrides`` replace any field.

        Raises:
            ConfigError: an agent not in `SETTINGS_AGENTS`, a version over `SETTINGS_VERSION`,
                not a JSON object of `SETTINGS_FIELDS`, or a value out of range.
        """
        what = f"actor settings of agent {settings.agent!r} version {settings.version}"
        if settings.agent not in SETTINGS_AGENTS:
            raise rg.ConfigError(
                f"{what}: expected an agent of {', '.join(SETTINGS_AGENTS)}; this actor cannot "
                "run that learner's agent: run the actors of the learner's replaygpu release"
            )
        if settings.version > SETTINGS_VERSION:
            raise rg.ConfigError(
                f"{what}: expected version {SETTINGS_VERSION} at most; the learner runs a newer "
                "replaygpu: upgrade replaygpu where the actors run to the learner's release"
            )
        try:
            values = json.loads(settings.json)
        except ValueError as err:
            raise rg.ConfigError(f"{what}: not JSON ({err})") from None
        unknown = set(values) - set(SETTINGS_FIELDS) if isinstance(values, dict) else {"?"}
        if unknown:
            raise rg.ConfigError(
                f"{what}: got {settings.json[:200]!r}, expected a JSON object of "
                f"{', '.join(SETTINGS_FIELDS)}"
            )
        return cls(**{**values, **overrides})

    @property
    def tls(self) -> TLSConfig | None:
        """None (plaintext) unless a TLS field is set.

        Raises:
            ConfigError: a file is missing or unreadable, or certificate and key do not match.
        """
        return client_tls(self)

    @property
    def epsilon(self) -> float:
        """This actor's fixed exploration rate."""
        if self.num_actors == 1:
            return self.epsilon_base
        spread = self.epsilon_alpha * self.actor_index / (self.num_actors - 1)
        return self.epsilon_base ** (1.0 + spread)

    @property
    def env_seed(self) -> int:
        """The seed of this actor's envs and random stream."""
        return self.seed + 1000 * self.actor_index


def _check(config: Any, known: Collection[str] | None = None) -> None:
    """`ActorConfig`'s checks (``config``: one, or values by field name); with ``known``, only
    those reading no other field (checks reading no settings field skip `reads`).

    Raises:
        ConfigError: the first value out of range.
    """

    def reads(*names: str) -> bool:
        return known is None or all(name in known for name in names)

    if reads("env_id") and not config.env_id:
        raise rg.ConfigError("env_id: got an empty string, expected a gymnasium env id")
    if reads("agent") and config.agent not in ("dqn", "sac"):
        raise rg.ConfigError(f"agent: got {config.agent!r}, expected 'dqn' or 'sac'")
    sizes = ("num_actors", "num_envs", "weight_pull_interval", "send_interval", "segment_steps")
    require_positive_ints(config, *filter(reads, sizes))
    if reads("actor_index"):
        top = config.num_actors if reads("num_actors") else math.inf
        if not 0 <= config.actor_index < top:
            bound = "num_actors" + (f"={top}" if reads("num_actors") else "")
            raise rg.ConfigError(f"actor_index: got {config.actor_index}, expected in [0, {bound})")
    require_positive(config, "retry_deadline_s")
    require(config, ["progress_interval_s"], lambda v: v >= 0, ">= 0 (0: no progress lines)")
    require(config, ["insert_slack"], lambda v: v >= -1, ">= -1")
    require(config, ["steps"], lambda v: v >= 0, ">= 0 (0: until stopped)")
    if reads("frame_stack"):
        require(config, ["frame_stack"], lambda v: v >= 0, ">= 0 (0: vector transitions)")
    if reads("frame_stack", "agent") and config.frame_stack and config.agent != "dqn":
        raise rg.ConfigError(
            f"agent: got {config.agent!r} with frame_stack {config.frame_stack}, expected dqn "
            "(frame actors act with a Nature CNN Q-network)"
        )
    period, length = config.sequence_period, config.sequence_length
    if reads("sequence_period", "sequence_length") and period and not 0 < period <= length:
        raise rg.ConfigError(
            f"sequence_period: got {period} with sequence_length {length}, expected 0 < "
            "sequence_period <= sequence_length (0: not recurrent)"
        )
    vector_dqn = not config.frame_stack and config.agent == "dqn"
    if reads("sequence_period", "frame_stack", "agent") and period and not vector_dqn:
        raise rg.ConfigError(
            f"sequence_period: got {period} with frame_stack {config.frame_stack} and agent "
            f"{config.agent!r}, expected frame_stack 0 and dqn (recurrent actors act "
            "epsilon-greedily with an LSTM Q-network on vectors)"
        )
    require_unit_interval(config, *filter(reads, ("epsilon_base", "repeat_action_probability")))
    client_tls(config)  # checks the TLS files now: missing, unreadable, a key of another cert
