"""The leaderboard refresh from PostgreSQL (``manage.py bench_leaderboard --from-database``).

A scratch database (``bench_<name>``, created and dropped around the run, so no real data is
touched) is filled by COPY with synthetic battles as the arena stores them: their models,
tasks and voters, each battle's messages (both sides' replies, with their text for style
control; one battle in seven has a correction to side A and a second vote), and its votes.
Then ``refresh_leaderboard`` runs as the site runs it: the first refresh counts every vote and
replays online Elo over them all; then, ``NEXT_REFRESHES`` times, ``NEW_BATTLES`` more battles
end and the next refresh goes on from the previous one's running counts and Elo with those, as
every later refresh does. Each refresh's
seconds per stage are those it records itself (``LeaderboardRefresh.stages``).
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import numpy as np
from django.db import connection
from django.utils import timezone

from leaderboard import bench, style

TASK_CATEGORIES = ("calendar", "conversion", "csv", "dates", "json")
# Battles that end before each next refresh: a busy arena's minute, which that refresh counts.
NEW_BATTLES = 1_000
NEXT_REFRESHES = 3  # Each one's time is reported: the machine's noise shows.
# Replies of varied length and markdown, as style control reads them.
REPLIES = (
    "action.add_calendar_entry('Meeting', date='2024-11-11', time='17:00', duration=30)",
    "Sure! Here is the call:\n\n```python\naction.add_calendar_entry('Meeting', '2024-11-11', '17:00', 30)\n```",
    "## Plan\n\n- add the meeting\n- **then** confirm\n\naction.add_calendar_entry('Meeting')",
    "I **cannot** do that.",
    "# Steps\n\n1. Parse the date\n2. Convert\n3. **Check** it\n\nThe answer is 42 km.",
    "name,email,phone",
)


@contextmanager
def scratch_database() -> Iterator[str]:
    """A fresh PostgreSQL database with the project's migrations, dropped afterwards."""
    if connection.vendor != "postgresql":
        raise ValueError("--from-database needs PostgreSQL: set DATABASE_URL to a PostgreSQL server.")
    test = connection.settings_dict.setdefault("TEST", {})
    test_name = test.get("NAME")
    test["NAME"] = name = f"bench_{connection.settings_dict['NAME']}"
    original = connection.settings_dict["NAME"]  # Restored by destroy_test_db.
    try:
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            yield name
        finally:
            connection.creation.destroy_test_db(original, verbosity=0)
    finally:
        test["NAME"] = test_name


def _copy(table: str, columns: tuple[str, ...], lines: Iterator[str]) -> None:
    """COPY tab-separated lines into ``table``, in chunks."""
    raw = connection.connection
    with raw.cursor() as cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        buffer = io.StringIO()
        for count, line in enumerate(lines, 1):
            buffer.write(line)
            if count % 200_000 == 0:
                copy.write(buffer.getvalue())
                buffer = io.StringIO()
        copy.write(buffer.getvalue())


def populate(votes: int, models: int, seed: int = 0) -> dict[str, int]:
    """Synthetic battles, messages and votes (one first-try vote per battle; a battle in seven
    has a correction to side A and an after-fix vote), by COPY, ended over the last 30 days.
    Returns the row counts."""
    from inference.models import LLM
    from votes.models import Task

    connection.ensure_connection()
    LLM.objects.bulk_create(
        LLM(name=f"model-{i:02d}", family="gemma", preset=f"/presets/model-{i:02d}", queue=f"q{i}")
        for i in range(models)
    )
    Task.objects.bulk_create(
        Task(slug=f"task-{i}", title=f"Task {i}", category=category) for i, category in enumerate(TASK_CATEGORIES)
    )
    return _copy_battles(votes, timedelta(days=30), seed)


def add_battles(count: int, seed: int) -> dict[str, int]:
    """``count`` more battles, ended over the last minute (what a refresh finds new)."""
    return _copy_battles(count, timedelta(minutes=1), seed)


def _copy_battles(votes: int, over: timedelta, seed: int) -> dict[str, int]:
    """``votes`` battles between the stored models, ended over the span ``over`` up to a minute
    ago, in id order after the stored ones, with their messages and votes (``populate``)."""
    from inference.models import LLM
    from votes.models import Battle, Task

    model_ids = np.array(LLM.objects.order_by("name").values_list("pk", flat=True))
    models = len(model_ids)
    task_ids = [None, *Task.objects.order_by("slug").values_list("pk", flat=True)]
    a, b, score = bench.synthetic_votes(votes, models, seed)
    rng = np.random.default_rng(seed + 6)
    task = rng.integers(0, len(task_ids), votes)
    voter = rng.integers(0, bench.VOTERS, votes)
    corrected = rng.random(votes) < 1 / 7
    reply = rng.integers(0, len(REPLIES), (votes, 2))
    tokens = rng.integers(20, 800, (votes, 3))  # Lengths as varied as real replies': cells do not compress.
    fixed = rng.random(votes) < 0.5
    now = timezone.now()
    ended = [(now - timedelta(minutes=1) - over * (1 - i / max(votes - 1, 1))).isoformat() for i in range(votes)]
    pair_probability = 1.0 / (models * (models - 1) / 2)
    first_id = (Battle.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1
    battle_ids = np.arange(first_id, first_id + votes)
    stamp = now.isoformat()
    null = "\\N"  # COPY's NULL

    def battles() -> Iterator[str]:
        for i in range(votes):
            task_id = task_ids[task[i]]
            yield (
                f"{battle_ids[i]}\tb{battle_ids[i]:011d}\t{model_ids[a[i]]}\t{model_ids[b[i]]}\t"
                f"{null if task_id is None else task_id}\tv{voter[i]:05d}\tended\tvoter\tf\t\t{ended[i]}\t"
                f"{ended[i]}\t{pair_probability}\n"
            )

    columns = (
        "id, public_id, model_a_id, model_b_id, task_id, voter_key, state, ended_by, excluded, excluded_reason, "
        "created, ended, pair_probability"
    )
    _copy("votes_battle", tuple(columns.split(", ")), battles())
    texts = [text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t") for text in REPLIES]
    message_columns = (
        "battle_id, side, turn, role, content, status, delta_count, stop_requested, stop_reason, error, rating, "
        "check_verdict, check_reason, check_parts, identity_leak, regenerations, created, token_count, "
        "header_count, list_count, bold_count"
    )
    markdown = ["\t".join(map(str, style.markdown_counts(text))) for text in REPLIES]

    def message(battle: int, side: str, turn: int, role: str, text: int | None, rating: str, length: int = 0) -> str:
        """A prompt (``text`` None) or a reply (the index of its text in REPLIES, ``length`` tokens)."""
        if text is None:
            content = "The time is wrong." if turn else "Add a meeting with Fred on Nov 11 at 5PM"
            counts = "\t".join([null] * 4)
        else:
            content, counts = texts[text], f"{length}\t{markdown[text]}"
        fields = (battle, side, turn, role, content, "done", 0, "f", "", "", rating, "", "", "{}", "", 0, stamp, counts)
        return "\t".join(map(str, fields)) + "\n"

    def messages() -> Iterator[str]:
        for i in range(votes):
            battle = battle_ids[i]
            for s, side in enumerate("ab"):
                rating = "mistake" if corrected[i] and side == "a" else ""
                yield message(battle, side, 0, "user", None, "")
                yield message(battle, side, 0, "assistant", int(reply[i, s]), rating, tokens[i, s])
            if corrected[i]:
                yield message(battle, "a", 1, "user", None, "")
                yield message(battle, "a", 1, "assistant", 0, "fixed" if fixed[i] else "mistake", tokens[i, 2])

    _copy("votes_message", tuple(message_columns.split(", ")), messages())
    choices = np.where(score == 1.0, "a", np.where(score == 0.0, "b", "tie"))

    reply_markdown = np.array([style.markdown_counts(text) for text in REPLIES], dtype=float)

    def seen(length: float, markdown: np.ndarray) -> str:
        """A side's seen style, as casting the vote stores it (Vote.seen_*)."""
        return "\t".join(map(str, (float(length), *markdown.tolist())))

    def vote_rows() -> Iterator[str]:
        for i in range(votes):
            side_a, side_b = reply_markdown[reply[i, 0]], reply_markdown[reply[i, 1]]
            first_b = seen(tokens[i, 1], side_b)
            yield f"{battle_ids[i]}\tfirst_try\t0\t{choices[i]}\t{stamp}\t{seen(tokens[i, 0], side_a)}\t{first_b}\n"
            if corrected[i]:  # Side A's correction reply (REPLIES[0]) was seen too.
                both_a = seen(tokens[i, 0] + tokens[i, 2], side_a + reply_markdown[0])
                choice = "a" if fixed[i] else "b"
                yield f"{battle_ids[i]}\tafter_fix\t1\t{choice}\t{stamp}\t{both_a}\t{first_b}\n"

    seen_columns = tuple(f"seen_{feature}_{side}" for side in "ab" for feature in style.FEATURES)
    _copy("votes_vote", ("battle_id", "stage", "after_turn", "choice", "created", *seen_columns), vote_rows())
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval('votes_battle_id_seq', %s)", [int(battle_ids[-1])])
        cursor.execute("ANALYZE")
        counts = {}
        for table in ("votes_battle", "votes_message", "votes_vote"):
            cursor.execute(f"SELECT count(*) FROM {table}")  # Fixed table names.
            counts[table] = cursor.fetchone()[0]
    return counts


def run_database_bench(*, votes: int, models: int, rounds: int, seed: int = 0) -> dict[str, Any]:
    """Fill a scratch database, refresh it as the site does (the first time, then after more
    battles ended, ``NEXT_REFRESHES`` times), and report every refresh's stages."""
    from leaderboard.services import refresh_leaderboard

    with scratch_database() as name:
        began = time.perf_counter()
        counts = populate(votes, models, seed)
        filled = time.perf_counter() - began
        refreshes = []
        runs = [("first refresh (every vote counted, online Elo over all)", 0)] + [
            (f"next refresh {k} of {NEXT_REFRESHES} ({NEW_BATTLES:,} battles ended since)", NEW_BATTLES)
            for k in range(1, NEXT_REFRESHES + 1)
        ]
        for label, new in runs:
            if new:
                add_battles(new, seed + len(refreshes))
            began = time.perf_counter()
            refresh = refresh_leaderboard(rounds=rounds, seed=seed)
            refreshes.append({"refresh": label, "seconds": time.perf_counter() - began, "stages": dict(refresh.stages)})
    return {
        "database": name,
        "votes": votes,
        "models": models,
        "rounds": rounds,
        "rows": counts,
        "fill_seconds": filled,
        "refreshes": refreshes,
    }


def format_table(result: dict[str, Any]) -> str:
    rows = ", ".join(f"{count:,} {table.removeprefix('votes_')}s" for table, count in result["rows"].items())
    lines = [
        f"PostgreSQL ({result['database']}, dropped afterwards): {rows}, {result['models']} models, "
        f"{result['rounds']} bootstrap rounds (filled in {result['fill_seconds']:.0f} s)"
    ]
    for refresh in result["refreshes"]:
        lines.append(f"{refresh['refresh']}: {refresh['seconds']:.2f} s")
        lines += [f"  {stage:<40} {seconds:>8.3f}" for stage, seconds in refresh["stages"].items()]
    return "\n".join(lines)
