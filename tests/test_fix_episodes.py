"""Fix episodes: which correction is which (votes/feedback.py), and the episodes a battle holds
(votes.selectors.fix_episodes), stored at every refresh and rated on the "Fixing mistakes" board."""

import pytest

from inference.models import LLM
from leaderboard import selectors as leaderboard_selectors
from leaderboard import services as leaderboard_services
from votes import research, selectors, services
from votes.evaluation import DIALOG, FEEDBACK, FIXED, FIXING, MISTAKE, Record
from votes.evaluation import fix_episodes as evaluation_episodes
from votes.feedback import GENERIC, POINTING, PRESCRIPTIVE, specificity
from votes.models import Battle, EvaluationReply, EvaluationRun, FixEpisode, Message, Task, TaskTurn

# The scenario's typical corrections (shared/scenario.md), and generic ones.
SENTENCES = {
    "The current year is 2024.": PRESCRIPTIVE,
    "Fix the year in the API call.": POINTING,
    "Just the API call, please.": PRESCRIPTIVE,
    "Respect the date format.": POINTING,
    "Time in 24h format.": PRESCRIPTIVE,
    "Duration is required.": POINTING,
    "Use the default duration.": PRESCRIPTIVE,
    "Wrong next day.": POINTING,
    "The time is wrong.": POINTING,
    "The API requires three parameters.": PRESCRIPTIVE,
    "It's the wrong event now.": POINTING,
    "Extra parenthesis.": POINTING,
    "You don't need that info.": POINTING,
    "The date should be the 12th.": PRESCRIPTIVE,
    'The title should be "Rock Concert".': PRESCRIPTIVE,
    "That's wrong, try again.": GENERIC,
    "That's not right. Please fix it.": GENERIC,
    "Try again.": GENERIC,
    "No.": GENERIC,
    "Hmm, are you sure?": GENERIC,
}


@pytest.mark.parametrize(("sentence", "kind"), SENTENCES.items())
def test_specificity_of_corrections(sentence: str, kind: str) -> None:
    assert specificity(sentence) == kind


@pytest.fixture
def pair(db) -> tuple[LLM, LLM]:
    return tuple(
        LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}", context_tokens=2048)
        for name in ("fixer", "stubborn")
    )


def battle_with(pair, side_a: list[tuple | None], side_b: list[tuple | None] = (), task: Task | None = None) -> Battle:
    """Each side's turns: (prompt, script_turn, rating, verdict) of the prompt and its reply, or
    None where the side got no prompt (the other side's prompt went to it alone)."""
    snapshot = task.snapshot() if task is not None else {}
    battle = Battle.objects.create(
        model_a=pair[0], model_b=pair[1], voter_key="v", task=task, state="ended", **snapshot
    )
    for side, turns in (("a", side_a), ("b", side_b)):
        for turn, entry in enumerate(turns):
            if entry is None:
                continue
            prompt, script_turn, rating, verdict = entry
            Message.objects.create(
                battle=battle, side=side, turn=turn, role="user", content=prompt, script_turn=script_turn
            )
            Message.objects.create(
                battle=battle, side=side, turn=turn, role="assistant", rating=rating, check_verdict=verdict
            )
    return battle


def episodes(**filters) -> list[tuple]:
    return [
        (e.side, e.wrong_turn, e.attempt, e.source, e.specificity, e.fixed)
        for e in selectors.fix_episodes()
        if all(getattr(e, key) == value for key, value in filters.items())
    ]


@pytest.mark.django_db
def test_a_voter_correction_after_a_wrong_reply_is_an_episode(pair) -> None:
    battle_with(
        pair,
        [("Add a meeting", None, "mistake", ""), ("The time is wrong.", None, "correct", "")],  # ✓ counts as fixed.
        [("Add a meeting", None, "correct", "")],  # Nothing was wrong; it waited.
    )
    assert episodes() == [("a", 0, 1, "voter", POINTING, True)]


@pytest.mark.django_db
def test_a_prompt_to_both_sides_is_no_correction(pair) -> None:
    """A new question to both sides after a 🍄 is not a correction, and its answer no fix."""
    battle_with(
        pair,
        [("Add a meeting", None, "mistake", ""), ("Explain photosynthesis in two sentences.", None, "correct", "")],
        [("Add a meeting", None, "correct", ""), ("Explain photosynthesis in two sentences.", None, "correct", "")],
    )
    assert episodes() == []


@pytest.mark.django_db
def test_checker_verdicts_judge_and_unjudged_replies_give_no_outcome(pair) -> None:
    battle_with(
        pair,
        [("q", None, "", "garbage"), ("Try again.", None, "", "mistake"), None],  # Wrong, corrected, still wrong.
        [("q", None, "garbage", ""), None, ("Try again.", None, "", "")],  # The reply was never judged.
    )
    assert episodes() == [("a", 0, 1, "voter", GENERIC, False)]


@pytest.mark.django_db
def test_repeated_corrections_of_one_mistake_are_its_attempts(pair) -> None:
    battle_with(
        pair,
        [
            ("q", None, "mistake", ""),
            ("Wrong.", None, "mistake", ""),
            ("The time should be 17:00.", None, "fixed", ""),
            ("Now cancel it.", None, "mistake", ""),
            ("Wrong event.", None, "mistake", ""),
        ],
    )
    assert episodes() == [
        ("a", 0, 1, "voter", GENERIC, False),
        ("a", 1, 2, "voter", PRESCRIPTIVE, True),
        ("a", 3, 1, "voter", POINTING, False),
    ]


@pytest.mark.django_db
def test_only_scripted_prompts_marked_as_corrections_start_an_episode(pair) -> None:
    task = Task.objects.create(slug="cal", title="Calendar")
    for position, (prompt, corrects) in enumerate(
        [("Add a meeting", False), ("The current year is 2024.", True), ("Add a concert", False), ("Cancel", False)]
    ):
        TaskTurn.objects.create(task=task, position=position, prompt=prompt, corrects_previous=corrects)
    battle_with(
        pair,
        [
            ("Add a meeting", 0, "", "mistake"),
            ("The current year is 2024.", 1, "", "correct"),  # The script's correction.
            ("Add a concert", 2, "", "mistake"),
            ("Cancel", 3, "", "correct"),  # A new request, not a correction.
        ],
        task=task,
    )
    assert episodes() == [("a", 0, 1, "scripted", PRESCRIPTIVE, True)]


@pytest.mark.django_db
def test_the_bundled_calendar_task_marks_its_correction() -> None:
    from django.core.management import call_command

    call_command("import_tasks", verbosity=0)
    marked = TaskTurn.objects.filter(corrects_previous=True).values_list("task__slug", "position", "prompt")
    assert list(marked) == [("calendar", 1, "The current year is 2024.")]


FRED = 'action.add_calendar_entry("Meeting with Fred", date="{year}-11-11", time="{time}", duration=30)'
CONCERT = 'action.add_calendar_entry("Rock Concert", date="{year}-11-11", time="{time}", duration={minutes})'


def checked_calendar_battle(pair, sides: dict[str, list[tuple[str, int | None, str, str]]]) -> None:
    """A calendar battle whose replies the bundled task's checker judges, part by part as the
    site does (votes.services.review_reply); each turn is (prompt, script_turn, reply, rating)."""
    from django.core.management import call_command

    call_command("import_tasks", verbosity=0)
    task = Task.objects.get(slug="calendar")
    battle = Battle.objects.create(
        model_a=pair[0], model_b=pair[1], voter_key="v", task=task, state="ended", **task.snapshot()
    )
    for side, turns in sides.items():
        for turn, entry in enumerate(turns):
            if entry is None:
                continue
            prompt, script_turn, reply, rating = entry
            Message.objects.create(
                battle=battle, side=side, turn=turn, role="user", content=prompt, script_turn=script_turn
            )
            message = Message.objects.create(
                battle=battle,
                side=side,
                turn=turn,
                role="assistant",
                content=reply,
                script_turn=script_turn,
                rating=rating,
            )
            services.review_reply(message)


@pytest.mark.django_db
def test_regression_persistence_and_turns_to_fix_field_by_field(pair) -> None:
    # The task leaves turn 1's year open (any year is right until the voter says which): the
    # mistakes here are the time in 12-hour format and, once, a duration. The correction's turn
    # judges the wrong reply as it judges the answer, so the year 2023 is a fact the correction
    # fixed; it persists while the later turns that expect 2024 get it.
    year = "The current year is 2024."
    checked_calendar_battle(
        pair,
        {
            # Fixes the time at once, and keeps it right in the next turn: persisted.
            "a": [
                ("Add a meeting with Fred", 0, FRED.format(year=2023, time="5PM"), ""),
                (year, 1, FRED.format(year=2024, time="17:00"), ""),
                ("Add a rock concert", 2, CONCERT.format(year=2024, time="20:00", minutes=30), ""),
            ],
            # Fixes the time but breaks the duration (a regression, not fixed); the voter's
            # correction, to this side alone while A waits, fixes it: two corrections for one mistake.
            "b": [
                ("Add a meeting with Fred", 0, FRED.format(year=2023, time="5PM"), ""),
                (year, 1, FRED.format(year=2024, time="17:00").replace("30)", "60)"), ""),
                None,
                ("Use the default duration.", None, FRED.format(year=2024, time="17:00"), "fixed"),
            ],
        },
    )
    checked_calendar_battle(
        pair,
        {  # Fixes the year and the time, then writes the next entry in the old year: a lapse.
            "a": [
                ("Add a meeting with Fred", 0, FRED.format(year=2023, time="5PM"), ""),
                (year, 1, FRED.format(year=2024, time="17:00"), ""),
                ("Add a rock concert", 2, CONCERT.format(year=2023, time="20:00", minutes=30), ""),
            ],
            # Fixes them, then gets the concert's time wrong: a new mistake, not a lapse of a
            # corrected fact (the concert is not at 17:00); the year stays 2024: persisted.
            "b": [
                ("Add a meeting with Fred", 0, FRED.format(year=2023, time="5PM"), ""),
                (year, 1, FRED.format(year=2024, time="17:00"), ""),
                ("Add a rock concert", 2, CONCERT.format(year=2024, time="8PM", minutes=30), ""),
            ],
        },
    )
    found = [
        (e.side, e.attempt, e.source, e.fixed, e.regression, e.persisted, e.turns_to_fix)
        for e in selectors.fix_episodes()
    ]
    assert found == [
        ("a", 1, "scripted", True, False, True, 1),
        ("b", 1, "scripted", False, True, None, 2),
        # The voter's prompt has no scripted turn, so its reply has no checked parts: no
        # regression verdict, and nothing checked to follow in later turns.
        ("b", 2, "voter", True, None, None, 2),
        ("a", 1, "scripted", True, False, False, 1),
        ("b", 1, "scripted", True, False, True, 1),
    ]
    parts = Message.objects.filter(side="b", turn=1, role="assistant", content__contains="60)").get().check_parts
    assert parts["time"] is True and parts["duration"] is False


@pytest.mark.django_db
def test_refresh_stores_the_episodes_and_rates_fixing_on_them(client, pair) -> None:
    for _ in range(3):
        battle_with(
            pair,
            [("q", None, "mistake", ""), ("Wrong date.", None, "fixed", ""), None],
            [("q", None, "mistake", ""), None, ("Wrong date.", None, "mistake", "")],
        )
    leaderboard_services.refresh_leaderboard(rounds=10)
    assert FixEpisode.objects.count() == 6
    assert set(FixEpisode.objects.values_list("model__name", "fixed").distinct()) == {
        ("fixer", True),
        ("stubborn", False),
    }
    board = client.get("/leaderboard/", {"category": "fixing"}).context["snapshot"]
    assert board.method == "fix-ability" and board.votes == 6
    assert [(row["model"], row["episodes"], row["fixed"]) for row in board.rows] == [
        ("fixer", 3, 3),
        ("stubborn", 3, 0),
    ]
    # Neither has a finite maximum-likelihood ability: open-ended intervals, said so; beside them
    # the share of each model's judged replies judged wrong (where its episodes start).
    fixer, stubborn = board.rows
    assert (fixer["upper"], fixer["open_ended"], stubborn["lower"], stubborn["open_ended"]) == (
        None,
        "no failure observed",
        None,
        "no fix observed",
    )
    # The judged-wrong rate counts first tries only (turn 0, to both sides), not answers to corrections.
    assert (fixer["wrong_rate"]["wrong"], fixer["wrong_rate"]["judged"]) == (3, 3)
    assert (stubborn["wrong_rate"]["wrong"], stubborn["wrong_rate"]["judged"]) == (3, 3)
    page = client.get("/leaderboard/", {"category": "fixing"}).content.decode()
    assert "no fix observed" in page and "Judged wrong" in page and "100% <small>of 3</small>" in page
    api = client.get("/api/v1/leaderboard", {"category": "fixing"}).json()["rows"]
    assert [(row["model"], row["open_ended"], row["wrong_rate"]["rate"]) for row in api] == [
        ("fixer", "no failure observed", 1.0),
        ("stubborn", "no fix observed", 1.0),
    ]
    # Rebuilding is idempotent.
    assert services.record_fix_episodes() == 6 and FixEpisode.objects.count() == 6


@pytest.mark.django_db
def test_evaluation_runs_episodes_are_recorded_but_not_on_the_live_board(pair) -> None:
    fixer, stubborn = pair
    task = Task.objects.create(slug="cal", title="Calendar")
    run = EvaluationRun.objects.create(task=task, status=EvaluationRun.Status.DONE)
    rows = [
        (fixer, "dialog", 0, 0, "f(5)", "mistake", None),
        (fixer, "dialog", 0, 1, "X is 5, expected 1.", "fixed", None),
        (stubborn, "fixing", 0, 1, "X is 5, expected 1.", "mistake", fixer),
    ]
    for model, part, turn, try_number, prompt, rating, mistake_by in rows:
        EvaluationReply.objects.create(
            run=run,
            model=model,
            part=part,
            turn=turn,
            try_number=try_number,
            prompt=prompt,
            reply="",
            verdict="correct" if rating == "fixed" else rating,
            rating=rating,
            mistake_by=mistake_by,
        )
    assert services.record_fix_episodes() == 2
    stored = FixEpisode.objects.filter(evaluation_run=run).order_by("pk")
    assert [(e.model.name, e.source, e.specificity, e.fixed, e.mistake_by) for e in stored] == [
        ("fixer", "checker", PRESCRIPTIVE, True, None),
        ("stubborn", "checker", PRESCRIPTIVE, False, fixer),
    ]
    assert leaderboard_selectors.fix_episode_counts().count.sum() == 0  # The live board rates battles only.
    records = research.episode_records()
    assert [(r["evaluation_run"], r["battle"], r["mistake_by"]) for r in records] == [
        (run.pk, None, None),
        (run.pk, None, "fixer"),
    ]


def test_evaluation_dialog_tries_give_regressions_and_turns_to_fix() -> None:
    """evaluation.fix_episodes: a turn's tries, each judged part by part against the try before."""
    judged = {  # reply -> its parts, as the turn's checker would judge them
        "time wrong": {"time": False, "duration": True},
        "duration wrong": {"time": True, "duration": False},
        "right": {"time": True, "duration": True},
    }
    tries = [
        ("q", "time wrong", MISTAKE),
        ("The time is wrong.", "duration wrong", MISTAKE),
        ("Fix it.", "right", FIXED),
    ]
    records = [
        Record("m", DIALOG, 0, 0, number, prompt, reply, "", "", rating)
        for number, (prompt, reply, rating) in enumerate(tries)
    ]
    found = evaluation_episodes(records, lambda record: judged[record.reply])
    assert [(e.attempt, e.fixed, e.regression, e.turns_to_fix) for e in found] == [
        (1, False, True, 2),  # fixed the time, broke the duration
        (2, True, False, 2),
    ]
    assert [e.regression for e in evaluation_episodes(records)] == [None, None]  # no checker: not judged


def test_evaluation_fixing_and_feedback_attempts_give_regressions() -> None:
    """An attempt at another model's mistake, and each kind of feedback on a model's own, are
    judged part by part against the mistake they correct: the first reply of its dialog turn."""
    judged = {
        "time wrong": {"time": False, "duration": True},
        "duration wrong": {"time": True, "duration": False},
        "right": {"time": True, "duration": True},
    }
    records = [
        Record("m", DIALOG, 0, 0, 0, "q", "time wrong", "", "", MISTAKE),
        Record("n", FIXING, 0, 0, 1, "The time is wrong.", "duration wrong", "", "", MISTAKE, mistake_by="m"),
        Record("n", FIXING, 1, 0, 1, "The time is wrong.", "right", "", "", FIXED, mistake_by="m"),
        Record("m", FEEDBACK, 0, 0, 1, "Fix it.", "duration wrong", "", "", MISTAKE, feedback_kind="generic"),
        Record("m", FEEDBACK, 0, 0, 1, "The time is wrong.", "right", "", "", FIXED, feedback_kind="human"),
        Record("m", FEEDBACK, 0, 5, 1, "Fix it.", "right", "", "", FIXED, feedback_kind="generic"),  # No such turn.
    ]
    found = evaluation_episodes(records, lambda record: judged[record.reply])
    assert [(e.model, e.fixed, e.regression) for e in found] == [
        ("n", False, True),  # Fixed the time, broke the duration.
        ("n", True, False),
        ("m", False, True),
        ("m", True, False),
        ("m", True, None),  # No mistake to compare with: not judged.
    ]


@pytest.mark.django_db
def test_a_refresh_reads_only_the_battles_ended_since_the_last_one(pair) -> None:
    """The episodes are recorded incrementally: a refresh reads the battles that ended since the
    previous refresh's newest (less a margin), unless a task changed, which rebuilds them all."""
    from datetime import timedelta

    from django.utils import timezone

    old = battle_with(pair, [("q", None, "mistake", ""), ("Wrong date.", None, "fixed", "")])
    Battle.objects.filter(pk=old.pk).update(ended=timezone.now() - timedelta(hours=1))
    recent = battle_with(pair, [("q", None, "correct", "")])  # The newest when the refresh runs.
    Battle.objects.filter(pk=recent.pk).update(ended=timezone.now())
    leaderboard_services.refresh_leaderboard(rounds=10)
    assert list(FixEpisode.objects.values_list("fixed", flat=True)) == [True]
    # An old battle's message changed behind the refresh's back (say, by hand in the database):
    # the next refresh does not read it again; a battle that ended since is read.
    Message.objects.filter(battle=old, turn=1, role="assistant").update(rating="mistake")
    new = battle_with(pair, [("q", None, "mistake", ""), ("Wrong date.", None, "mistake", "")])
    Battle.objects.filter(pk=new.pk).update(ended=timezone.now())
    refresh = leaderboard_services.refresh_leaderboard(rounds=10)
    assert sorted(FixEpisode.objects.values_list("battle_id", "fixed")) == [(old.pk, True), (new.pk, False)]
    assert refresh.episodes_through is not None and "fix episodes" in refresh.stages
    # A task edited in the admin (its correction turns, perhaps): everything is read again.
    Task.objects.create(slug="new", title="New")
    leaderboard_services.refresh_leaderboard(rounds=10)
    assert sorted(FixEpisode.objects.values_list("battle_id", "fixed")) == [(old.pk, False), (new.pk, False)]


@pytest.mark.django_db
def test_a_direct_chat_has_no_voter_corrections(pair) -> None:
    """A direct chat has one side and none that waits: a prompt after its 🍄 is no correction."""
    battle = battle_with(pair, [("Add a meeting", None, "mistake", ""), ("The time is wrong.", None, "fixed", "")])
    Battle.objects.filter(pk=battle.pk).update(mode=Battle.Mode.DIRECT, model_b=pair[0])
    assert episodes() == []
