"""manage.py loadtest: N concurrent websocket voters against a real daphne + Redis + Celery stack."""

import argparse
import asyncio
import json
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from inference.models import LLM
from votes.testing.stack import Stack, StackError, database_url
from votes.testing.voters import Report, run_voters, summarize


class Command(BaseCommand):
    help = (
        "Start daphne and a Celery worker on loopback (this configuration's PostgreSQL and Redis), "
        "let N voters play whole battles at once over websockets, and report tokens delivered / "
        "produced, order violations, web-tier latency, votes per second and errors."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--battles", type=int, default=100, help="Concurrent voters, one battle each.")
        parser.add_argument("--worker-threads", type=int, default=32, help="The Celery worker's thread pool.")
        parser.add_argument("--engine-slots", type=int, help="ARENA_ENGINE_SLOTS for the worker (decode batch).")
        parser.add_argument(
            "--worker-cpus",
            help="Pin the inference worker to these cores (taskset list, e.g. 0), as if on a host of its own.",
        )
        parser.add_argument(
            "--worker-nice",
            type=int,
            default=19,
            help="ARENA_WORKER_NICE for the worker: it shares the cores with the web tier here, which "
            "a production inference host does not (0: same priority).",
        )
        parser.add_argument(
            "--worker-sched-idle",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="ARENA_WORKER_SCHED_IDLE for the worker: its threads run only when the web tier, Redis "
            "and PostgreSQL leave a core free.",
        )
        parser.add_argument(
            "--warm-up",
            choices=["battle", "host"],
            default="battle",
            help="battle: one unmeasured battle loads the models (shapes first met under load still "
            "compile during the run); host: start the worker as production's inference hosts start, "
            "every shape compiled first (minutes).",
        )
        parser.add_argument("--seed", type=int, default=0, help="Seeds the voters' choices.")
        parser.add_argument("--json", type=Path, help="Also write the report to this file.")
        parser.add_argument("--log-dir", type=Path, help="Where the children's logs go (default: a temp folder).")
        parser.add_argument(
            "--max-p99-ms", type=float, help="Fail if the web tier's p99 added latency is above this (ms)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        battles = options["battles"]
        if battles < 1:
            raise CommandError("--battles must be at least 1.")
        if connection.vendor != "postgresql" or not settings.REDIS_URL:
            raise CommandError("The load test needs PostgreSQL and Redis: set DATABASE_URL and REDIS_URL.")
        queues = sorted(set(LLM.objects.enabled().values_list("queue", flat=True)))
        if LLM.objects.anonymous().count() < 2:  # What an anonymous battle draws from.
            raise CommandError(
                "The load test needs at least two models that anonymous battles draw: enabled, sampling, and "
                "holding the arena's longest conversation (register_roster)."
            )
        env = {
            "ARENA_TRACE_FRAMES": "1",
            # Every voter comes from 127.0.0.1: the per-network budgets are off for the run (the
            # per-session ones stay, each voter having a session of its own).
            "ARENA_RATE_LIMITS": "battle=30/0/3600,message=20/0/60,vote=60/0/60",
            # ... and so are the per-network caps on new sessions, open sockets and replies in flight.
            "ARENA_NEW_SESSIONS_PER_NETWORK": "0",
            "ARENA_SOCKETS_PER_NETWORK": "0",
            "ARENA_REPLIES_PER_NETWORK": "0",
            "ARENA_WORKER_NICE": str(options["worker_nice"]),
            "ARENA_WORKER_SCHED_IDLE": "1" if options["worker_sched_idle"] else "0",
        }
        if options["engine_slots"]:
            env["ARENA_ENGINE_SLOTS"] = str(options["engine_slots"])
        log_dir = options["log_dir"] or Path(tempfile.mkdtemp(prefix="arena-loadtest-"))
        stack = Stack(
            database_url=database_url(connection.settings_dict),
            redis_url=settings.REDIS_URL,
            log_dir=log_dir,
            env=env,
        )
        self.stderr.write(f"Starting daphne and a worker for {', '.join(queues)} (logs in {log_dir})")
        try:
            stack.start_worker(
                "loadtest-worker",
                queues,
                concurrency=options["worker_threads"],
                cpus=options["worker_cpus"],
                warm_up=options["warm_up"] == "host",
            )
            _, url = stack.start_web()
            # One battle first, not measured: the models' first replies (loading them, without a
            # warmed-up host) would otherwise weigh on the measured run's latencies.
            self.stderr.write(f"Warm-up battle on {url}")
            (warm_up,), _ = asyncio.run(run_voters(url, 1, seed=-1))
            if not warm_up.finished:
                raise CommandError(f"The warm-up battle failed: {warm_up.errors}")
            self.stderr.write(f"{battles} voters")
            results, duration_s = asyncio.run(run_voters(url, battles, seed=options["seed"]))
        except StackError as error:
            raise CommandError(str(error)) from error
        finally:
            stack.stop()
        report = summarize(results, duration_s, count_tokens)
        self.stdout.write(format_report(report))
        if options["json"]:
            options["json"].write_text(json.dumps(report.as_dict(), indent=2))
        problems = failures(report, options["max_p99_ms"])
        if problems:
            raise CommandError("Load test failed: " + "; ".join(problems))


def failures(report: Report, max_p99_ms: float | None) -> list[str]:
    problems = []
    if report.errors:
        problems.append(f"{len(report.errors)} errors, first: {report.errors[0]}")
    if report.battles_finished != report.battles:
        problems.append(f"{report.battles - report.battles_finished} battles unfinished")
    if report.tokens_delivered != report.tokens_produced or report.replies_not_as_saved:
        problems.append(f"delivered/produced {report.delivered_ratio:.4f}, {report.replies_not_as_saved} replies")
    if report.order_violations:
        problems.append(f"{report.order_violations} order violations")
    if max_p99_ms is not None and not report.latency_p99_ms <= max_p99_ms:
        problems.append(f"p99 added latency {report.latency_p99_ms:.1f} ms > {max_p99_ms} ms")
    return problems


def format_report(report: Report) -> str:
    return "\n".join(
        [
            f"battles                      {report.battles_finished}/{report.battles} finished",
            f"replies                      {report.replies} ({report.replies_not_as_saved} not as saved)",
            f"tokens delivered / produced  {report.tokens_delivered} / {report.tokens_produced}"
            f" = {report.delivered_ratio:.4f}",
            f"order violations             {report.order_violations}",
            f"web-tier added latency       p50 {report.latency_p50_ms:.1f} ms, p99 {report.latency_p99_ms:.1f} ms,"
            f" max {report.latency_max_ms:.1f} ms over {report.frames_timed} frames",
            f"  of which Redis channel layer p50 {report.layer_p50_ms:.1f} ms, p99 {report.layer_p99_ms:.1f} ms;"
            f" daphne to voter p50 {report.socket_p50_ms:.1f} ms, p99 {report.socket_p99_ms:.1f} ms",
            f"worker hand-off (not web tier) p50 {report.handoff_p50_ms:.1f} ms, p99 {report.handoff_p99_ms:.1f} ms;"
            f" publish to voter p50 {report.end_to_end_p50_ms:.1f} ms, p99 {report.end_to_end_p99_ms:.1f} ms",
            f"votes                        {report.votes} in {report.duration_s:.1f} s"
            f" = {report.votes_per_s:.2f} votes/s",
            f"errors                       {len(report.errors)}",
            *(f"  {error}" for error in report.errors[:10]),
        ]
    )


@cache
def _tokenizer(model_name: str) -> Any:
    import keras_hub

    from inference.services import resolve_preset

    return keras_hub.tokenizers.Tokenizer.from_preset(resolve_preset(LLM.objects.get(name=model_name).preset))


def count_tokens(model_name: str, text: str) -> int:
    """Tokens of text, with the model's own tokenizer."""
    return len(_tokenizer(model_name).tokenize(text)) if text else 0
