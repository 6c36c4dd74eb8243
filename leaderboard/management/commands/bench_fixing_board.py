"""manage.py bench_fixing_board: voters who judge as the task's checker does play task battles
through the real websocket, then the leaderboard refresh rates the fix episodes they made."""

import asyncio
import json
import random
import tempfile
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from inference.models import LLM
from leaderboard import services
from leaderboard.bench_database import scratch_database
from leaderboard.models import LeaderboardSnapshot
from votes import selectors as votes_selectors
from votes import services as votes_services
from votes.models import Battle, FixEpisode, Message, Task
from votes.testing.checker_voter import FEEDBACK_KINDS, CheckerVoter, ScriptedTurn
from votes.testing.stack import Stack, StackError, database_url

FIXING = "fixing"


class Command(BaseCommand):
    help = (
        "Start daphne and a Celery worker on loopback (this configuration's PostgreSQL and Redis), let "
        "simulated voters play anonymous battles on a task (its scripted prompts, every reply judged and "
        "rated by the task's checker, every wrong side corrected alone), refresh the leaderboard and "
        'print its live "Fixing mistakes" board. It plays in a scratch database (dropped afterwards) '
        "with the configured roster's anonymous models and the task."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", default="calendar", help="The task's short name (slug).")
        parser.add_argument("--battles", type=int, default=60, help="Battles in all.")
        parser.add_argument("--at-once", type=int, default=4, help="Voters playing at the same time.")
        parser.add_argument("--turns", type=int, help="Scripted turns each voter plays (default: all).")
        parser.add_argument(
            "--max-corrections", type=int, default=1, help="Corrections a wrong side gets at each scripted turn."
        )
        parser.add_argument(
            "--feedback",
            default=",".join(FEEDBACK_KINDS),
            help="The kinds of correction the voters send, drawn at random: checker, human, generic.",
        )
        parser.add_argument(
            "--expect",
            action="append",
            default=[],
            metavar="BETTER>WORSE",
            help="Fail unless BETTER's fix-ability interval lies wholly above WORSE's (repeatable).",
        )
        parser.add_argument("--seed", type=int, default=0, help="Seeds the voters' choices.")
        parser.add_argument("--worker-threads", type=int, default=16, help="The Celery worker's thread pool.")
        parser.add_argument(
            "--in-place",
            action="store_true",
            help="Play in the configured database (it must have no battle) instead of a scratch one "
            "(bench_<name>: its roster's anonymous models and the task copied in, dropped afterwards).",
        )
        parser.add_argument("--json", type=Path, help="Also write the board and the run's figures to this file.")
        parser.add_argument("--log-dir", type=Path, help="Where the children's logs go (default: a temp folder).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["battles"] < 1 or options["at_once"] < 1 or options["max_corrections"] < 0:
            raise CommandError("--battles and --at-once must be at least 1, --max-corrections at least 0.")
        if connection.vendor != "postgresql" or not settings.REDIS_URL:
            raise CommandError("The bench needs PostgreSQL and Redis: set DATABASE_URL and REDIS_URL.")
        if options["in_place"] and Battle.objects.exists():
            raise CommandError("--in-place needs a database without battles: the bench's would join them on the board.")
        task = Task.objects.filter(slug=options["task"], active=True).first()
        if task is None:
            raise CommandError(f"No active task {options['task']!r} (import_tasks loads the calendar task).")
        script = [ScriptedTurn.from_script(turn) for turn in task.snapshot()["script"]]
        if not script:
            raise CommandError(f"The task {task.slug!r} has no scripted turns.")
        feedback_kinds = [kind.strip() for kind in options["feedback"].split(",") if kind.strip()]
        if not feedback_kinds or set(feedback_kinds) - set(FEEDBACK_KINDS):
            raise CommandError(f"--feedback takes some of {', '.join(FEEDBACK_KINDS)}, comma-separated.")
        expectations = [parse_expectation(text) for text in options["expect"]]
        roster = [
            {field: value for field, value in row.items() if field != "id"} for row in LLM.objects.anonymous().values()
        ]
        drawn = sorted(row["name"] for row in roster)
        if len(drawn) < 2:
            raise CommandError(
                "Anonymous battles draw from fewer than two models (register_roster registers the roster)."
            )
        unknown = sorted({name for pair in expectations for name in pair} - set(drawn))
        if unknown:
            raise CommandError(f"{unknown[0]!r} is not a model anonymous battles draw ({', '.join(drawn)}).")
        tasks = votes_selectors.export_tasks([task])
        self.stderr.write(f"{len(drawn)} models drawn: {', '.join(drawn)}")
        with nullcontext() if options["in_place"] else scratch_database():
            if not options["in_place"]:  # The roster and the task, in the bench's own database.
                # Queues of this run's own: no other worker on this broker takes its jobs, and
                # its worker takes no job another run left behind.
                run = uuid.uuid4().hex[:8]
                LLM.objects.bulk_create(LLM(**{**row, "queue": f"fixbench-{run}.{row['name']}"}) for row in roster)
                votes_services.import_tasks(tasks)
            voters = self.play(task.slug, script, feedback_kinds, options)
            report = board_report(voters)
        self.stdout.write(format_board(report))
        if options["json"]:
            options["json"].write_text(json.dumps(report, indent=2))
        errors = report["errors"]
        problems = [f"{len(errors)} voters failed, first: {errors[0]}"] if errors else []
        by_model = {row["model"]: row for row in report["board"]}
        for better, worse in expectations:
            if not above(by_model.get(better), by_model.get(worse)):
                problems.append(f"{better}'s fix-ability interval is not wholly above {worse}'s")
        if problems:
            raise CommandError("Fixing board bench failed: " + "; ".join(problems))

    def play(
        self, task: str, script: list[ScriptedTurn], feedback_kinds: list[str], options: dict[str, Any]
    ) -> list[CheckerVoter]:
        """Start daphne and a worker on the current database, let the voters play, stop them."""
        queues = sorted(set(LLM.objects.enabled().values_list("queue", flat=True)))
        log_dir = options["log_dir"] or Path(tempfile.mkdtemp(prefix="arena-fixbench-"))
        stack = Stack(
            database_url=database_url(connection.settings_dict),
            redis_url=settings.REDIS_URL,
            log_dir=log_dir,
            env=BENCH_ENV,
        )
        self.stderr.write(f"Starting daphne and a worker for {', '.join(queues)} (logs in {log_dir})")
        try:
            stack.start_worker("fixbench-worker", queues, concurrency=options["worker_threads"])
            _, url = stack.start_web()
            return asyncio.run(
                play(
                    options["battles"],
                    options["at_once"],
                    options["seed"],
                    lambda index, rng: CheckerVoter(
                        url,
                        index,
                        rng,
                        task=task,
                        script=script,
                        turns=options["turns"],
                        max_corrections=options["max_corrections"],
                        feedback_kinds=feedback_kinds,
                    ),
                    progress=lambda done: self.stderr.write(f"{done}/{options['battles']} battles"),
                )
            )
        except (StackError, ValueError) as error:
            raise CommandError(str(error)) from error
        finally:
            stack.stop()


def board_report(voters: list[CheckerVoter]) -> dict[str, Any]:
    """Refresh the leaderboard, as the site does, and report its "Fixing mistakes" board beside
    what the voters did, and whether the server's checker judged every reply as they did."""
    results = [voter.result for voter in voters]
    services.refresh_leaderboard()
    board = LeaderboardSnapshot.objects.filter(category=FIXING).order_by("-refresh__created", "-pk").first()
    rows = board.rows if board is not None else []
    verdicts = {
        (battle, turn, side): verdict
        for battle, turn, side, verdict in Message.objects.filter(role=Message.Role.ASSISTANT).values_list(
            "battle__public_id", "turn", "side", "check_verdict"
        )
    }
    judged = [(voter.battle_id, judged) for voter in voters for judged in voter.log.judged]
    ended = Battle.objects.filter(state=Battle.State.ENDED)
    return {
        "battles": len(results),
        "finished": sum(result.finished for result in results),
        "battles_ended": ended.count(),
        "votes": sum(result.votes for result in results),
        "replies_judged": len(judged),
        "judged_as_the_server": sum(
            verdicts.get((battle, one.turn, one.side)) == one.verdict for battle, one in judged
        ),
        "corrections": sum(voter.log.corrections for voter in voters),
        "cut_at_limit": sum(voter.log.cut_at_limit for voter in voters),
        "closed_after_a_name": sum(voter.log.closed for voter in voters),
        "episodes_recorded": FixEpisode.objects.filter(battle__in=ended).count(),
        "errors": [error for result in results for error in result.errors],
        "board": rows,
        "unrated": board.unrated if board is not None else [],
        "excluded": board.excluded if board is not None else {},
        "separated": separated(rows),
    }


# The worker and daphne of the run: every voter comes from 127.0.0.1, so the per-network budgets
# and caps are off (each voter has a session of its own); pacing is off, as the board, not the
# voter's view of time, is what is measured; and a reply may take as long as a voter waits for it
# (CheckerVoter.frame_timeout_s): many battles at once on a few cores make slow models slower.
BENCH_ENV = {
    "ARENA_GENERATION_TIMEOUT_SECONDS": "900",
    "ARENA_REPLY_QUEUE_SECONDS": "900",
    "ARENA_RATE_LIMITS": "battle=30/0/3600,message=60/0/60,vote=60/0/60,frame=600/0/60",
    "ARENA_NEW_SESSIONS_PER_NETWORK": "0",
    "ARENA_SOCKETS_PER_NETWORK": "0",
    "ARENA_REPLIES_PER_NETWORK": "0",
    "ARENA_STREAM_CHARS_PER_S": "0",
    "ARENA_STREAM_FIRST_TEXT_SECONDS": "0",
}


async def play(
    battles: int,
    at_once: int,
    seed: int,
    voter: Callable[[int, random.Random], CheckerVoter],
    progress: Callable[[int], object] = lambda done: None,
) -> list[CheckerVoter]:
    """``battles`` voters, ``at_once`` of them playing at any time, each once; in order."""
    voters = [voter(index, random.Random(seed * 100_003 + index)) for index in range(battles)]
    pending = iter(voters)
    done = 0

    async def lane() -> None:
        nonlocal done
        for each in pending:
            await each.play()
            done += 1
            progress(done)

    await asyncio.gather(*(lane() for _ in range(min(at_once, battles))))
    return voters


def parse_expectation(text: str) -> tuple[str, str]:
    better, sep, worse = text.partition(">")
    if not sep or not better.strip() or not worse.strip():
        raise CommandError(f"--expect takes BETTER>WORSE (two model names), got {text!r}.")
    return better.strip(), worse.strip()


def above(better: dict[str, Any] | None, worse: dict[str, Any] | None) -> bool:
    """Whether ``better``'s interval lies wholly above ``worse``'s (an open end bounds nothing)."""
    if better is None or worse is None or better["lower"] is None or worse["upper"] is None:
        return False
    return bool(better["lower"] > worse["upper"])


def separated(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Every pair of models whose intervals do not overlap, the better one first."""
    return [[high["model"], low["model"]] for high in rows for low in rows if above(high, low)]


def format_board(report: dict[str, Any]) -> str:
    def bound(value: float | None) -> str:
        return "open" if value is None else f"{value:.0f}"

    lines = [
        f"battles {report['finished']}/{report['battles']} finished ({report['cut_at_limit']} ended early at the"
        f" arena's length or turn limit, {report['closed_after_a_name']} closed by the arena after a reply named a"
        f" model), {len(report['errors'])} errors; {report['corrections']} corrections;"
        f" the server's checker judged {report['judged_as_the_server']} of {report['replies_judged']} replies as"
        " the voters did",
        "Fixing mistakes (fix-ability, 95% intervals; raw share fixed with its Wilson interval):",
    ]
    for row in report["board"]:
        rating = "unrated" if row["rating"] is None else f"{row['rating']:.0f}"
        lines.append(
            f"  {row['model']:<32} {rating:>7} [{bound(row['lower'])}, {bound(row['upper'])}]"
            f"  fixed {row['fixed']}/{row['episodes']} = {row['fix_rate']:.0%}"
            f" [{row['fix_lower']:.0%}, {row['fix_upper']:.0%}]"
        )
    lines += [f"  unrated: {name}" for name in report["unrated"]]
    left_out = ", ".join(f"{n} ({reason})" for reason, n in report["excluded"].items() if n)
    lines.append(f"episodes left out: {left_out or 'none'}")
    lines.append(
        "separated (intervals apart): " + ("; ".join(f"{high} > {low}" for high, low in report["separated"]) or "none")
    )
    return "\n".join(lines)
