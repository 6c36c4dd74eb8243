"""The arena's own Prometheus metrics of replies and engines. Plain module (no Django).

Recorded where the data already is, so that the engine itself is not touched: a reply's tokens
and time to first token come from its engine request's ``stats`` once the generation service
(``inference.services``) has it; failures are counted where a reply is failed
(``inference.services`` and ``votes.services``), by cause; the engines' slots and queues are read
from the running engines at each scrape (``EngineCollector``), never kept in a metric that could
go stale. Labels are model names (public on the leaderboard) and fixed causes: never a battle, a
reply or a voter. docs/operations.md lists every metric and how each process kind exposes them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Why a reply failed: the values of the ``cause`` label of arena_replies_failed_total.
TOO_LONG = "too_long"  # The conversation outgrew a model's context (both sides are failed).
TIMED_OUT = "timed_out"  # Ran past ARENA_GENERATION_TIMEOUT_SECONDS.
GENERATION_ERROR = "generation_error"  # The model or its engine failed (loading, decoding).
WORKER_ERROR = "worker_error"  # The worker failed outside the model (a database write, say).
WORKER_LOST = "worker_lost"  # The heartbeat stopped: the worker died or was cut off.
NOT_PICKED_UP = "not_picked_up"  # No worker took the job within ARENA_REPLY_QUEUE_SECONDS.
NOT_QUEUED = "not_queued"  # The broker refused the job.
CAUSES = (TOO_LONG, TIMED_OUT, GENERATION_ERROR, WORKER_ERROR, WORKER_LOST, NOT_PICKED_UP, NOT_QUEUED)

# Tiny test models answer in milliseconds, real ones on a busy CPU host in tens of seconds.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
SPEED_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0)

REPLIES = Counter(
    "arena_replies",
    "Battle replies that ended, by model and status (done, stopped, failed).",
    ["model", "status"],
)
REPLIES_FAILED = Counter(
    "arena_replies_failed",
    "Battle replies failed, by cause (no model: a failure must not point at a battle's side).",
    ["cause"],
)
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

# Counters appear (at 0) before the first failure, so that rate() and alerts see every cause.
for _cause in CAUSES:
    REPLIES_FAILED.labels(cause=_cause)


def record_generation(model: str, stats: Any) -> None:
    """A generation's tokens, time to first token and speed (``GenerationStats``)."""
    if stats.tokens:
        TOKENS.labels(model=model).inc(stats.tokens)
    if stats.ttft_s is not None:
        TIME_TO_FIRST_TOKEN.labels(model=model).observe(stats.ttft_s)
    if stats.tokens and stats.duration_s > 0:
        REPLY_SPEED.labels(model=model).observe(stats.tokens / stats.duration_s)


def record_reply(model: str, status: str) -> None:
    REPLIES.labels(model=model, status=status).inc()


def record_failure(cause: str) -> None:
    REPLIES_FAILED.labels(cause=cause if cause in CAUSES else GENERATION_ERROR).inc()


class EngineCollector(Collector):
    """The engines of this process, read at each scrape: slots, slots in use, requests queued
    for a slot (the prefill backlog). Nothing while no engine runs here (the web tier of a
    deployment with inference hosts)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from inference import hosting

        slots = GaugeMetricFamily("arena_engine_slots", "Decode slots of each running engine.", labels=["model"])
        in_use = GaugeMetricFamily(
            "arena_engine_slots_in_use", "Slots holding a running request, per engine.", labels=["model"]
        )
        queued = GaugeMetricFamily(
            "arena_engine_queued_requests",
            "Requests submitted to an engine and waiting for a free slot (the prefill backlog).",
            labels=["model"],
        )
        for name, engine in sorted(hosting.running_engines().items()):
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
