"""Prometheus metrics of a replay service: ``/metrics`` over HTTP. One registry per `ReplayServer`,
so several servers in one process do not collide. Values are read at each scrape
(`ReplayServer.stats`, `ReplayServer.append_answers`): the request paths keep plain int counters and
pay nothing for the endpoint. Imports no TensorFlow itself."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from replaygpu._version import __version__
from replaygpu.errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from replaygpu.service.server.server import ReplayServer

logger = logging.getLogger(__name__)

COUNTER, GAUGE = "counter", "gauge"

#: ``(key in ReplayServer.stats() or learner_stats(), metric name, kind, help)``; counters are
#: exposed as ``name_total``. A key the learner gives overrides the server's.
METRICS: tuple[tuple[str, str, str, str], ...] = (
    (
        "ingested_transitions",
        "replaygpu_ingested_transitions",
        COUNTER,
        "Transitions of Append requests committed to the table by this process (duplicates "
        "and journal replays not counted).",
    ),
    (
        "ingested_bytes",
        "replaygpu_ingested_bytes",
        COUNTER,
        "Bytes of transition data (the arrays, without headers) of Append requests committed "
        "by this process.",
    ),
    ("staged_batches", "replaygpu_staged_batches", GAUGE, "Batches staged, not committed yet."),
    ("staged_bytes", "replaygpu_staged_bytes", GAUGE, "Bytes of the staged batches."),
    (
        "inflight_bytes",
        "replaygpu_inflight_bytes",
        GAUGE,
        "Memory of the Append requests read (or being read) and not answered yet, staged "
        "ones included, each counted twice its size (received, then copied); at most "
        "ServerConfig.inflight_max_bytes for steady request sizes.",
    ),
    (
        "inflight_waiting_streams",
        "replaygpu_inflight_waiting_streams",
        GAUGE,
        "Append streams waiting for room in the request budget before reading their next request.",
    ),
    ("table_size", "replaygpu_table_size", GAUGE, "Filled rows of the table."),
    ("table_capacity", "replaygpu_table_capacity", GAUGE, "Rows the table holds at most."),
    (
        "table_inserted",
        "replaygpu_table_inserted",
        COUNTER,
        "Transitions inserted into the table since it was made, restored checkpoints included.",
    ),
    (
        "sampled",
        "replaygpu_sampled_transitions",
        COUNTER,
        "Transitions the learner sampled, as its rate limiter counts them (0 for a bare table).",
    ),
    ("weights_version", "replaygpu_weights_version", GAUGE, "Version of the published weights."),
    (
        "open_streams",
        "replaygpu_open_streams",
        GAUGE,
        "Append streams open now: the connected actors.",
    ),
    (
        "refused_streams",
        "replaygpu_refused_streams",
        COUNTER,
        "Append streams refused at once because max_actors streams were open.",
    ),
    ("actors", "replaygpu_known_actors", GAUGE, "Actors whose last committed seq is kept."),
    ("checkpoints", "replaygpu_checkpoints", COUNTER, "Checkpoints taken by this process."),
    (
        "checkpoint_seconds",
        "replaygpu_last_checkpoint_duration_seconds",
        GAUGE,
        "How long the last checkpoint took (0 before the first).",
    ),
    (
        "checkpoint_failures",
        "replaygpu_checkpoint_failures",
        COUNTER,
        "Periodic checkpoints that failed (a full disk, a permission); each is retried later.",
    ),
    (
        "storage_full",
        "replaygpu_storage_full",
        GAUGE,
        "1 while the journal's file system is full and appends are refused (retryably).",
    ),
    ("sgd_steps", "replaygpu_sgd_steps", COUNTER, "SGD steps of the learner, restored ones too."),
    (
        "sgd_steps_per_s",
        "replaygpu_sgd_steps_per_second",
        GAUGE,
        "SGD steps per second of the learner, lately.",
    ),
    ("loss", "replaygpu_learner_loss", GAUGE, "The learner's latest loss (mean of its last call)."),
    (
        "mean_return",
        "replaygpu_recent_episode_return",
        GAUGE,
        "Mean return of the last episodes actors reported (replaygpu_recent_episodes of them).",
    ),
    (
        "mean_length",
        "replaygpu_recent_episode_length",
        GAUGE,
        "Mean length of the last episodes actors reported.",
    ),
    (
        "recent_episodes",
        "replaygpu_recent_episodes",
        GAUGE,
        "Episodes the recent mean return and length are taken over.",
    ),
    ("episodes", "replaygpu_episodes", COUNTER, "Episodes actors reported to this process."),
    ("eval_return", "replaygpu_eval_return", GAUGE, "Mean return of the last greedy evaluation."),
    ("eval_step", "replaygpu_eval_sgd_step", GAUGE, "SGD step of the last greedy evaluation."),
)


class ReplayCollector(Collector):
    """Reads a `ReplayServer`'s counters and ``learner_stats`` (the learner's values by
    `METRICS` key, others ignored; None for a bare table, ``replaygpu serve``) at each scrape."""

    def __init__(
        self,
        server: ReplayServer,
        learner_stats: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.server = server
        self.learner_stats = learner_stats
        self.scraped = threading.Condition()
        self.last_scrape = -math.inf  # time.monotonic() of the last collect's values

    def collect(self) -> Iterator[Metric]:
        began = time.monotonic()
        yield from self._families()
        with self.scraped:
            self.last_scrape = began
            self.scraped.notify_all()

    def _families(self) -> Iterator[Metric]:
        values: dict[str, float] = dict(self.server.stats())
        if self.learner_stats is not None:
            try:
                values.update(self.learner_stats())
            except Exception:  # a scrape still reports the server's values
                logger.exception("metrics: learner_stats() failed; its metrics are left out")
        for key, name, kind, text in METRICS:
            if key in values and not math.isnan(values[key]):  # NaN: not known yet
                family = CounterMetricFamily if kind == COUNTER else GaugeMetricFamily
                yield family(name, text, value=float(values[key]))
        inserted = values["table_inserted"]
        yield GaugeMetricFamily(
            "replaygpu_samples_per_insert",
            "Transitions sampled per transition inserted (0 before the first insert).",
            value=values["sampled"] / inserted if inserted else 0.0,
        )
        answers = CounterMetricFamily(
            "replaygpu_append_requests",
            "Append answers by gRPC status code: OK per acknowledged request, an error code "
            "per stream ended with it (a refused request ends its stream).",
            labels=["code"],
        )
        for code, count in sorted(self.server.append_answers().items()):
            answers.add_metric([code], count)
        yield answers
        yield InfoMetricFamily(
            "replaygpu_server",
            "The replay service: replaygpu version and table name.",
            value={"version": __version__, "table": self.server.table.name},
        )


class MetricsServer(contextlib.AbstractContextManager["MetricsServer"]):
    """A running ``/metrics`` endpoint, made by `start_metrics_server`; ``port`` is the real
    one when 0 was asked for."""

    def __init__(
        self,
        httpd: WSGIServer,
        thread: threading.Thread,
        collector: ReplayCollector,
    ) -> None:
        self._httpd = httpd
        self._thread = thread
        self._collector = collector
        self.host = str(httpd.server_address[0])
        self.port = int(httpd.server_address[1])
        self._closed = False

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def wait_scraped(self, since: float, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a scrape of values from ``since`` (`time.monotonic`)
        on, so an ending run's final evaluation is scraped. Returns whether one was."""
        collector = self._collector
        deadline = time.monotonic() + timeout_s
        with collector.scraped:
            while collector.last_scrape < since:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                collector.scraped.wait(left)
        return True

    def close(self) -> None:
        """Stop serving and join the HTTP thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics_server(
    port: int,
    server: ReplayServer,
    learner_stats: Callable[[], Mapping[str, float]] | None = None,
    address: str = "0.0.0.0",
) -> MetricsServer:
    """Serve ``http://address:port/metrics`` (port 0: a free one; ``[::]`` and ``::`` both bind
    IPv6; ``learner_stats`` as in `ReplayCollector`); call ``close()`` after.

    Raises:
        ConfigError: the address cannot be bound (e.g. the port is in use).
    """
    registry = CollectorRegistry(auto_describe=False)
    collector = ReplayCollector(server, learner_stats)
    registry.register(collector)
    host = address.strip("[]")
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:
        raise ConfigError(
            f"metrics: cannot bind {host}:{port} ({err}); pick another `metrics_port`, or 0 for "
            "a free one"
        ) from err
    metrics = MetricsServer(httpd, thread, collector)
    logger.info("metrics at %s", metrics.url)
    return metrics
