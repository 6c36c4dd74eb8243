"""The arena's own Prometheus metrics of models and engines. Plain module (no Django).

Recorded where the data already is, so that the engine itself is not touched: a generation's
tokens and time to first token come from its request's ``stats`` once it is done
(``inference.services.ModelReply``, whether a battle's or an evaluation's); the engines' slots and
queues are read from the running engines at each scrape (``EngineCollector``), never kept in a
metric that could go stale. Labels are model names (public on the leaderboard): never a battle, a
reply or a voter. How battle replies end is ``votes.metrics``; docs/operations.md lists every
metric and how each process kind exposes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Tiny test models answer in milliseconds, real ones on a busy CPU host in tens of seconds.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
SPEED_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)

TOKENS = Counter(
    "arena_generated_tokens",
    "Tokens generated, battles and evaluation runs; rate() of it is the tokens per second.",
    ["model"],
)
TIME_TO_FIRST_TOKEN = Histogram(
    "arena_time_to_first_token_seconds",
    "From a request's submission to its engine until its first token (waiting for a slot and prefill).",
    ["model"],
    buckets=TTFT_BUCKETS,
)
REPLY_SPEED = Histogram(
    "arena_reply_tokens_per_second",
    "Each generation's own speed: its tokens over its time in the engine.",
    ["model"],
    buckets=SPEED_BUCKETS,
)


def record_generation(model: str, stats: Any) -> None:
    """A generation's tokens, time to first token and speed (``GenerationStats``)."""
    if stats.tokens:
        TOKENS.labels(model=model).inc(stats.tokens)
    if stats.ttft_s is not None:
        TIME_TO_FIRST_TOKEN.labels(model=model).observe(stats.ttft_s)
    if stats.tokens and stats.duration_s > 0:
        REPLY_SPEED.labels(model=model).observe(stats.tokens / stats.duration_s)


class EngineCollector(Collector):
    """The engines of this process, read at each scrape: slots, slots in use, requests queued
    for a slot (the prefill backlog). Nothing while no engine runs here (the web tier of a
    deployment with inference hosts)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from inference.hosts import engines

        slots = GaugeMetricFamily("arena_engine_slots", "Decode slots of each running engine.", labels=["model"])
        in_use = GaugeMetricFamily(
            "arena_engine_slots_in_use", "Slots holding a running request, per engine.", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "arena_engine_queued_requests",
            "Requests submitted to an engine and waiting for a free slot (the prefill backlog).",
            labels=["model"],
        )
        for name, engine in sorted(engines.running_engines().items()):
            slots.add_metric([name], engine.slots)
            in_use.add_metric([name], engine.active_slots)
            queued.add_metric([name], engine.queued)
        yield slots
        yield in_use
        yield queued

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # Nothing to check at registration; collect() is cheap.


ENGINES = EngineCollector()
REGISTRY.register(ENGINES)


def registry() -> Any:
    """The registry a scrape of this process reads: the process's own (``REGISTRY``), or, when
    ``PROMETHEUS_MULTIPROC_DIR`` is set (a Celery worker with a prefork pool: each pool process
    writes its values there), every process's values added up, with this process's engines."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    from prometheus_client import CollectorRegistry, multiprocess

    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)
    merged.register(EngineCollector())
    return merged
