"""The arena's Prometheus metrics of battle replies: how each ended, and why one failed.

Counted where a reply ends: ``votes.generation`` (a reply its worker finished) and
``votes.services`` (a reply failed by the stall or queue check). Labels are model names (public
on the leaderboard) and fixed causes: never a battle, a reply or a voter. The models' own
figures (tokens, time to first token, speed, engines' slots) are ``inference.metrics``;
docs/operations.md lists every metric and how each process kind exposes them.
"""

from prometheus_client import Counter

# Why a reply failed: the values of the ``cause`` label of arena_replies_failed_total.
TOO_LONG = "too_long"  # The conversation outgrew a model's context (both sides are failed).
TIMED_OUT = "timed_out"  # Ran past ARENA_GENERATION_TIMEOUT_SECONDS.
GENERATION_ERROR = "generation_error"  # The model or its engine failed (loading, decoding).
WORKER_ERROR = "worker_error"  # The worker failed outside the model (a database write, say).
WORKER_LOST = "worker_lost"  # The heartbeat stopped: the worker died or was cut off.
NOT_PICKED_UP = "not_picked_up"  # No worker took the job within ARENA_REPLY_QUEUE_SECONDS.
NOT_QUEUED = "not_queued"  # The broker refused the job.
CAUSES = (TOO_LONG, TIMED_OUT, GENERATION_ERROR, WORKER_ERROR, WORKER_LOST, NOT_PICKED_UP, NOT_QUEUED)

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

# Counters appear (at 0) before the first failure, so that rate() and alerts see every cause.
for _cause in CAUSES:
    REPLIES_FAILED.labels(cause=_cause)


def record_reply(model: str, status: str) -> None:
    REPLIES.labels(model=model, status=status).inc()


def record_failure(cause: str) -> None:
    REPLIES_FAILED.labels(cause=cause if cause in CAUSES else GENERATION_ERROR).inc()
