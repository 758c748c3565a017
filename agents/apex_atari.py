"""Ape-X on pixels: a frame-table learner served over gRPC, Atari actor processes feeding it.

Reads top to bottom: the config, then ``train``: build the learner (a `make_frame_table`
holding each 84x84 frame once, prioritized replay whose `rg.FrameStack` view rebuilds the
``[B, 4, 84, 84]`` stacks and 3-step returns in the graph, the Nature CNN double-DQN update of
`atari.AtariDQN`, a samples-per-insert rate limiter), serve it with the frame actors'
actor settings, start the actor processes (`fleet`: the one actor loop, `actor.run_actor`,
with a `frame_actor.FrameExperience`, which acts with a numpy copy of the Nature CNN and pulls
its weights every K env steps; actor i explores with eps_i = 0.4^(1 + 7 i/(N-1))), then commit
their appends, train, publish weights, sync the target network and checkpoint until the actors
delivered ``steps`` env steps and the learner used up its replay budget; then evaluate the
greedy policy. More actors can join a running learner with ``replaygpu actor ADDRESS``.

Differences from the Ape-X paper, and why:

- Prioritized replay as in the paper (alpha 0.6, beta 0.4, priorities |TD error| of the 3-step
  double-DQN targets), but the priorities of new rows are the max priority seen so far, not
  ones the actors compute from their own Q-values: actors would need the target network too.
- Rows of several actors share one frame table, which needs each episode's rows contiguous:
  actors send whole table episodes (a life, when a lost life is terminal), each in one request
  that the server commits contiguously; an episode longer than ``segment_steps`` is cut as a
  time-limit truncation and continued as a new table episode whose first k-1 stacks are padded
  with its first frame instead of the true history (see `frame_actor`).

Preprocessing, reward clipping and lives are those of `atari` (``demo breakout``). The defaults
fit a 2-core CPU in minutes (2 actors, 20k env steps, 2 sampled rows per inserted row, a replay
of 5e4 rows = 0.35 GB); `ApexAtariConfig` says what to raise on a GPU.
"""

from __future__ import annotations

# in apex_atari_config, which the learner service shares; re-exported because this is the
# module that `registry.ALGORITHMS` names for "apex-atari": the demo and ``replaygpu eval`` look
# them up here
from replaygpu.agents.apex_atari_config import ApexAtariConfig as ApexAtariConfig
from replaygpu.agents.apex_atari_config import check_env as check_env
from replaygpu.agents.apex_atari_config import evaluate_agent as evaluate_agent
from replaygpu.agents.apex_atari_config import greedy_policy as greedy_policy
from replaygpu.agents.apex_atari_config import make_agent as make_agent
from replaygpu.agents.learner import LearnerService, train_with_actors
from replaygpu.agents.progress import NullRecorder, Recorder, TrainResult
from replaygpu.agents.runs import RunControl


def train(
    config: ApexAtariConfig, recorder: Recorder | None = None, run: RunControl | None = None
) -> TrainResult:
    """Run the frame-table learner (`LearnerService`, what ``replaygpu learner --agent dqn
    --env ALE/...`` runs) and ``num_actors`` actor processes, then evaluate.

    With ``run``: resume from its newest checkpoint (actors collect what is left of
    ``steps``), save periodically, stop early with a checkpoint on SIGTERM or Ctrl-C.

    Raises:
        ConfigError: ale-py missing or not an ALE game id.
        RuntimeError: when an actor process fails.
    """
    service = LearnerService(config, run)
    recorder = recorder or NullRecorder()
    return train_with_actors(service, config.actor_config, recorder, "apex-atari-actor")
