"""Acme's R2D2 on Reverb, at the shapes of `benchmarks/r2d2.py`: sequence sampling and the
learner's SGD steps/s. Runs in a venv of its own, never in replaygpu's (TensorFlow 2.15).

What is measured, all of it Acme's and Reverb's own code:

  fill      `acme.adders.reverb.SequenceAdder` (period --period, sequences of --length steps)
            writes one long episode of random observations with the LSTM state as the
            ``core_state`` extra (as `acme.agents.tf.actors.RecurrentActor` stores it) into a
            Reverb table with Acme R2D2's selectors: ``Prioritized(0.6)``, ``Fifo``, max size
            --sequences, until it holds --sequences items (priorities then set to random
            exponential(1) values, so the sum tree is not flat).
  sample    ``acme.datasets.make_reverb_dataset`` (what the R2D2 agent builds: 12 interleaved
            ``reverb.TrajectoryDataset`` workers, batched, prefetched): batches of --batch
            sequences drawn in proportion to priority; sequences/s and batches/s over
            --sample-batches batches per repeat.
  learner   ``acme.agents.tf.r2d2.R2D2Learner.step()`` on a second table of sequences of
            --burn-in + --trace + 1 steps (R2D2's ``sequence_length``): burn-in, n-step double Q
            with h(x) rescaling (``trfl``'s transformed n-step loss), importance weights,
            ``max_priority_weight`` 0.9 priorities written back through ``reverb.TFClient``,
            target sync every 100 steps. The network is ``acme.tf.networks.DeepRNN([MLP
            [--hidden], LSTM(--hidden), Linear(actions)])``: an unroll-aware core (the LSTM is
            unrolled in a ``tf.while_loop``, the MLP and head batch-applied), the fastest way
            Acme offers to run this shape.

Every figure is the median over --repeats timed runs, after warm-up. Prints one JSON line.

The venv (kept outside the repository; Python 3.10: Reverb 0.14 is built for TF 2.15):

    /root/.pyenv/versions/3.10.13/bin/python -m venv /work/peers-acme/venv
    V=/work/peers-acme/venv/bin/pip
    $V install "tensorflow-cpu==2.15.*" "dm-reverb==0.14.0" "tensorflow-probability==0.23.*" \
        dm-sonnet trfl dm-tree dm-env "numpy<2"
    $V install --no-deps "dm-acme==0.4.0"   # its [tf] extra pins tensorflow 2.8 / reverb 0.7
    $V install "jax[cpu]==0.4.23" "jaxlib==0.4.23" pillow "gym==0.23.1"  # imported by acme
    /work/peers-acme/venv/bin/python benchmarks/peers/r2d2_acme.py

``dm-launchpad`` (0.5.2, and the last nightly 0.5.2.dev20230323) does not load beside TF 2.15:
its courier extension was built against another TensorFlow ("undefined symbol:
scc_info_TensorProto_tensorflow_2fcore_2fframework_2ftensor_2eproto" for 0.5.2, "undefined
symbol: _ZN4absl12lts_2022062320raw_logging_internal21internal_log_functionB5cxx11E" for the
nightly). Acme imports it only in ``acme.utils.signals`` (a stop handler for distributed
programs); nothing measured here launches a program, so `stub_launchpad` stands in for those
two functions. And Acme 0.4.0's adders pass ``get_signature_timeout_ms`` to
``reverb.Client.trajectory_writer``, an argument Reverb 0.14 no longer takes (TypeError);
`Client` drops it (Reverb 0.14's writer fetches the signature itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OBS_DIM, NUM_ACTIONS = 2, 2  # masked CartPole: position and angle; left, right


def stub_launchpad() -> None:
    """Stand in for ``launchpad``'s stop-handler registry, the one part Acme imports here."""
    module = types.ModuleType("launchpad")
    module.register_stop_handler = lambda handler: None
    module.unregister_stop_handler = lambda handler: None
    sys.modules["launchpad"] = module


stub_launchpad()

import dm_env  # noqa: E402
import numpy as np  # noqa: E402
import reverb  # noqa: E402
import sonnet as snt  # noqa: E402
import tensorflow as tf  # noqa: E402
from acme import datasets, specs  # noqa: E402
from acme.adders import reverb as adders  # noqa: E402
from acme.agents.tf.r2d2 import learning  # noqa: E402
from acme.tf import networks  # noqa: E402
from acme.tf import utils as tf2_utils  # noqa: E402
from acme.utils import loggers  # noqa: E402


class Client(reverb.Client):
    """`reverb.Client` taking the argument Acme 0.4.0's adders pass and Reverb 0.14 dropped."""

    def trajectory_writer(self, num_keep_alive_refs, *, get_signature_timeout_ms=None, **kw):
        del get_signature_timeout_ms
        return super().trajectory_writer(num_keep_alive_refs, **kw)


def env_spec() -> specs.EnvironmentSpec:
    return specs.EnvironmentSpec(
        observations=specs.Array((OBS_DIM,), np.float32),
        actions=specs.DiscreteArray(NUM_ACTIONS),
        rewards=specs.Array((), np.float32),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )


def make_network(hidden: int) -> networks.DeepRNN:
    return networks.DeepRNN(
        [snt.nets.MLP([hidden], activate_final=True), snt.LSTM(hidden), snt.Linear(NUM_ACTIONS)]
    )


def filled_server(
    spec: specs.EnvironmentSpec, hidden: int, length: int, period: int, sequences: int, seed: int
) -> tuple[reverb.Server, float]:
    """A Reverb server whose Acme-R2D2 table holds ``sequences`` items of ``length`` steps,
    written by a `SequenceAdder`; returns it and the adder's env steps/s."""
    state_spec = tf2_utils.squeeze_batch_dim(make_network(hidden).initial_state(1))
    table = reverb.Table(
        name=adders.DEFAULT_PRIORITY_TABLE,
        sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(),
        max_size=sequences,
        rate_limiter=reverb.rate_limiters.MinSize(1),
        signature=adders.SequenceAdder.signature(
            spec, {"core_state": state_spec}, sequence_length=length
        ),
    )
    server = reverb.Server([table], port=None)
    client = Client(f"localhost:{server.port}")
    adder = adders.SequenceAdder(client, sequence_length=length, period=period)
    rng = np.random.default_rng(seed)
    steps = (sequences - 1) * period + length  # one episode that holds them all
    obs = rng.normal(size=(steps + 1, OBS_DIM)).astype(np.float32)
    actions = rng.integers(0, NUM_ACTIONS, steps)
    h = rng.normal(size=(steps, hidden)).astype(np.float32)
    c = rng.normal(size=(steps, hidden)).astype(np.float32)
    start = time.perf_counter()
    adder.add_first(dm_env.restart(obs[0]))
    for t in range(steps):
        state = snt.LSTMState(hidden=h[t], cell=c[t])
        step = dm_env.transition(np.float32(1.0), obs[t + 1], np.float32(1.0))
        adder.add(np.int32(actions[t]), step, extras={"core_state": state})
    adder.reset()
    seconds = time.perf_counter() - start
    for _ in range(600):  # the writer flushes in the background
        if client.server_info()[adders.DEFAULT_PRIORITY_TABLE].current_size >= sequences:
            break
        time.sleep(0.1)
    return server, steps / seconds


def spread_priorities(server: reverb.Server, batch: int, seed: int) -> None:
    """Give the items exponential(1) priorities (the adder writes them all as 1.0): draw keys
    and update them until most have been touched."""
    client = reverb.Client(f"localhost:{server.port}")
    info = client.server_info()[adders.DEFAULT_PRIORITY_TABLE]
    rng = np.random.default_rng(seed)
    keys: set[int] = set()
    for sample in client.sample(adders.DEFAULT_PRIORITY_TABLE, num_samples=2 * info.current_size):
        keys.add(int(sample[0].info.key))
    keys_list = sorted(keys)
    for i in range(0, len(keys_list), 10_000):
        chunk = keys_list[i : i + 10_000]
        client.mutate_priorities(
            adders.DEFAULT_PRIORITY_TABLE,
            updates=dict(zip(chunk, rng.exponential(size=len(chunk)).tolist(), strict=True)),
        )


def median_rate(step, calls: int, repeats: int, warmup: int) -> float:
    """Median calls/s of ``step()`` over ``repeats`` runs of ``calls`` calls."""
    for _ in range(warmup):
        step()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        rates.append(calls / (time.perf_counter() - start))
    return statistics.median(rates)


def bench_sample(args: argparse.Namespace, spec: specs.EnvironmentSpec) -> dict[str, float]:
    server, adder_rate = filled_server(
        spec, args.hidden, args.length, args.period, args.sequences, args.seed
    )
    spread_priorities(server, args.batch, args.seed)
    dataset = datasets.make_reverb_dataset(
        server_address=f"localhost:{server.port}",
        batch_size=args.batch,
        prefetch_size=tf.data.experimental.AUTOTUNE,
    )
    iterator = iter(dataset)
    batches = median_rate(lambda: next(iterator), args.sample_batches, args.repeats, warmup=20)
    size = reverb.Client(f"localhost:{server.port}").server_info()
    items = size[adders.DEFAULT_PRIORITY_TABLE].current_size
    server.stop()
    return {
        "sample_items": float(items),
        "adder_env_steps_per_s": adder_rate,
        "sample_batches_per_s": batches,
        "sample_sequences_per_s": batches * args.batch,
    }


def bench_learner(args: argparse.Namespace, spec: specs.EnvironmentSpec) -> dict[str, float]:
    length = args.burn_in + args.trace + 1  # R2D2 agent's sequence_length
    sequences = args.learner_sequences
    server, _ = filled_server(spec, args.hidden, length, args.period, sequences, args.seed)
    address = f"localhost:{server.port}"
    dataset = datasets.make_reverb_dataset(
        server_address=address, batch_size=args.batch, prefetch_size=tf.data.experimental.AUTOTUNE
    )
    network, target = make_network(args.hidden), make_network(args.hidden)
    tf2_utils.create_variables(network, [spec.observations])
    tf2_utils.create_variables(target, [spec.observations])
    learner = learning.R2D2Learner(
        environment_spec=spec,
        network=network,
        target_network=target,
        burn_in_length=args.burn_in,
        sequence_length=length,
        dataset=dataset,
        reverb_client=reverb.TFClient(address),
        logger=loggers.NoOpLogger(),
        discount=0.99,
        target_update_period=100,
        importance_sampling_exponent=0.6,
        max_replay_size=sequences,
        learning_rate=1e-3,
        store_lstm_state=True,
        max_priority_weight=0.9,
        n_step=args.n_step,
    )
    start = time.perf_counter()
    learner.step()  # traces
    first = time.perf_counter() - start
    rate = median_rate(learner.step, args.learner_steps, args.repeats, warmup=10)
    server.stop()
    return {"learner_sgd_steps_per_s": rate, "learner_first_step_s": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sequences", type=int, default=100_000, help="items to sample over")
    parser.add_argument("--length", type=int, default=80, help="T of the sampled sequences")
    parser.add_argument(
        "--period",
        type=int,
        default=1,
        help="adder period (1: a new "
        "sequence every step, as every row of replaygpu's table starts one)",
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64, help="MLP and LSTM width")
    parser.add_argument("--burn-in", type=int, default=40)
    parser.add_argument("--trace", type=int, default=80)
    parser.add_argument("--n-step", type=int, default=5)
    parser.add_argument("--learner-sequences", type=int, default=10_000)
    parser.add_argument("--sample-batches", type=int, default=200)
    parser.add_argument("--learner-steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("sample", "learner"), default=None)
    args = parser.parse_args()
    spec = env_spec()
    out: dict[str, object] = {
        "library": "acme 0.4.0 + reverb 0.14.0",
        "tensorflow": tf.__version__,
        **{k: getattr(args, k) for k in ("sequences", "length", "period", "batch", "hidden")},
        **{k: getattr(args, k) for k in ("burn_in", "trace", "n_step", "repeats")},
    }
    if args.only in (None, "sample"):
        out.update(bench_sample(args, spec))
    if args.only in (None, "learner"):
        out.update(bench_learner(args, spec))
    out["load_average"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
