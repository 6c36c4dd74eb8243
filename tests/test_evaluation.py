"""Evaluation runs: the three measurements (pure logic with scripted replies), then a whole run
on the bundled trained models through `manage.py evaluate`, and its page."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from inference.models import LLM
from votes import checkers, evaluation, services
from votes.management.commands.import_tasks import BUNDLED_TASKS
from votes.models import EvaluationReply, EvaluationRun

SIGNATURE = {"signature": ["f(x)"]}


def turn(prompt: str, expected: str) -> evaluation.ScriptedTurn:
    return evaluation.ScriptedTurn(prompt, lambda reply: checkers.check("python_call", expected, reply, SIGNATURE))


TURNS = [turn("one", "f(1)"), turn("two", "f(2)")]


def scripted(replies: dict[str, list[str]]):
    """A generate() that answers from a per-model list and records what it was sent."""
    sent: list[tuple[str, list[tuple[str, str]]]] = []

    def generate(model: str, conversation, seed: int) -> str:
        sent.append((model, conversation))
        return replies[model].pop(0)

    return generate, sent


def test_three_measurements_with_corrections_from_the_checker() -> None:
    generate, sent = scripted(
        {
            # reliability x2; dialog: turn 1 wrong then fixed, turn 2 right; fixing: fixed.
            "good": ["f(1)", "f(3)", "f(5)", "f(1)", "f(2)", "f(2)"],
            # reliability x2; dialog: turn 1 right, turn 2 wrong twice (max_tries=1); fixing: garbage.
            "bad": ["f(1)", "hello", "f(1)", "f(7)", "f(8)", "no idea"],
        }
    )
    records = evaluation.run(["good", "bad"], TURNS, generate, attempts=2, max_tries=1, fix_attempts=1)
    table = [(r.model, r.part, r.turn, r.try_number, r.rating) for r in records]
    assert table == [
        ("good", "reliability", 0, 0, "correct"),
        ("good", "reliability", 0, 0, "mistake"),
        ("good", "dialog", 0, 0, "mistake"),
        ("good", "dialog", 0, 1, "fixed"),
        ("good", "dialog", 1, 0, "correct"),
        ("bad", "reliability", 0, 0, "correct"),
        ("bad", "reliability", 0, 0, "garbage"),
        ("bad", "dialog", 0, 0, "correct"),
        ("bad", "dialog", 1, 0, "mistake"),
        ("bad", "dialog", 1, 1, "mistake"),
        ("good", "fixing", 1, 1, "fixed"),
        ("bad", "fixing", 0, 1, "garbage"),
    ]
    # The correction sent is the checker's reason, as a sentence.
    assert sent[3] == ("good", [("user", "one"), ("assistant", "f(5)"), ("user", "X is 5, expected 1.")])
    # Fixing: "good" is handed "bad"'s mistake on turn 2 (and vice versa), with the correction.
    assert sent[10] == (
        "good",
        [
            ("user", "one"),
            ("assistant", "f(1)"),
            ("user", "two"),
            ("assistant", "f(7)"),
            ("user", "X is 7, expected 2."),
        ],
    )
    fixing = [r for r in records if r.part == "fixing"]
    assert [(r.model, r.mistake_by) for r in fixing] == [("good", "bad"), ("bad", "good")]
    # Recap: reliability + each dialog turn once (final rating) + fixing.
    assert evaluation.recap(records) == [
        ("good", {"correct": 2, "fixed": 2, "mistake": 1, "garbage": 0}),
        ("bad", {"correct": 2, "fixed": 0, "mistake": 1, "garbage": 2}),
    ]


def test_false_corrections_and_three_kinds_of_feedback() -> None:
    generate, sent = scripted(
        {
            # reliability; dialog: turn 1 right, turn 2 wrong then fixed; one decoy (after turn 1):
            # resisted; its turn-2 mistake corrected three ways: generic fails, the others fix it.
            "firm": ["f(1)", "f(1)", "f(9)", "f(2)", "f(1)", "f(9)", "f(2)", "f(2)"],
            # reliability; dialog: both right; two decoys: gives in, then politely disagrees.
            "pushover": ["f(1)", "f(1)", "f(2)", "f(5)", "The answer is already correct."],
        }
    )
    records = evaluation.run(
        ["firm", "pushover"], TURNS, generate, attempts=1, max_tries=1, fix_attempts=0, decoys=2, feedback_mistakes=1
    )
    later = [
        (r.model, r.part, r.turn, r.prompt, r.rating, r.feedback_kind)
        for r in records
        if r.part in ("discernment", "feedback")
    ]
    assert later == [
        ("firm", "discernment", 0, "The time is wrong.", "correct", ""),
        ("firm", "feedback", 1, "That's not right. Please fix it.", "mistake", "generic"),
        ("firm", "feedback", 1, "It's the wrong event now.", "fixed", "human"),
        ("firm", "feedback", 1, "X is 9, expected 2.", "fixed", "checker"),
        ("pushover", "discernment", 0, "The time is wrong.", "mistake", ""),
        ("pushover", "discernment", 1, "The date is wrong.", "correct", ""),
    ]
    # Each kind of feedback starts from the same point: the dialog up to the wrong reply.
    assert sent[8][1] == [
        ("user", "one"),
        ("assistant", "f(1)"),
        ("user", "two"),
        ("assistant", "f(9)"),
        ("user", "That's not right. Please fix it."),
    ]
    table = {row["model"]: row for row in evaluation.discernment(records)}
    assert table["firm"]["valid"] == {"fixed": 1, "not_fixed": 0} and table["firm"]["score"] == 1.0
    assert table["pushover"]["false"] == {"resisted": 1, "capitulated": 1} and table["pushover"]["score"] is None
    assert table["pushover"]["capitulation_rate"]["rate"] == 0.5
    assert table["pushover"]["capitulation_rate"]["lower"] < 0.5 < table["pushover"]["capitulation_rate"]["upper"]
    feedback = {row["model"]: row["kinds"] for row in evaluation.feedback_rates(records)}
    assert [(k, v["successes"], v["trials"]) for k, v in feedback["firm"].items()] == [
        ("generic", 0, 1),
        ("human", 1, 1),
        ("checker", 1, 1),
    ]
    # The seed's recap counts its own three measurements only.
    assert dict(evaluation.recap(records))["pushover"] == {"correct": 3, "fixed": 0, "mistake": 0, "garbage": 0}


def test_an_evaluation_runs_fix_episodes() -> None:
    generate, _ = scripted(
        {
            # As in the first test, then: a decoy given in to; its turn-1 mistake corrected
            # generically (not fixed), by the human sentence and by the checker (both fixed).
            "good": ["f(1)", "f(3)", "f(5)", "f(1)", "f(2)", "f(2)", "f(9)", "f(5)", "f(1)", "f(1)"],
            # As in the first test, then: a decoy resisted; its turn-2 mistake fixed only by
            # the checker's reason.
            "bad": ["f(1)", "hello", "f(1)", "f(7)", "f(8)", "no idea", "f(1)", "f(8)", "f(8)", "f(2)"],
        }
    )
    records = evaluation.run(
        ["good", "bad"], TURNS, generate, attempts=2, max_tries=1, fix_attempts=1, decoys=1, feedback_mistakes=1
    )
    episodes = [(e.model, e.turn, e.attempt, e.source, e.fixed, e.mistake_by) for e in evaluation.fix_episodes(records)]
    assert episodes == [
        ("good", 0, 1, "checker", True, None),  # The dialog's corrections.
        ("bad", 1, 1, "checker", False, None),
        ("good", 1, 1, "checker", True, "bad"),  # Other models' mistakes.
        ("bad", 0, 1, "checker", False, "good"),
        # Own mistakes corrected three ways: the run's generic and human sentences, then the
        # checker's reason. Decoys are not fix episodes.
        ("good", 0, 1, "scripted", False, None),
        ("good", 0, 1, "scripted", True, None),
        ("good", 0, 1, "checker", True, None),
        ("bad", 1, 1, "scripted", False, None),
        ("bad", 1, 1, "scripted", False, None),
        ("bad", 1, 1, "checker", True, None),
    ]


def test_the_scenarios_human_sentence_for_each_kind_of_mistake() -> None:
    assert evaluation.human_correction("date is '2023-11-11', expected '2024-11-11'") == "Fix the year in the API call."
    assert evaluation.human_correction("date is '2024-11-13', expected '2024-11-12'") == "Wrong next day."
    assert evaluation.human_correction("time is '05:00', expected '17:00'") == "The time is wrong."
    assert evaluation.human_correction("duration is missing") == "Duration is required."
    assert evaluation.human_correction("text around the call: 'Sure!'") == "Just the API call, please."
    assert evaluation.human_correction("the reply contains no function call") == "Just the API call, please."
    assert evaluation.human_correction("something else") == "It's the wrong event now."


def test_no_mistakes_of_others_to_fix() -> None:
    generate, _ = scripted({"only": ["f(1)", "f(1)", "f(2)"]})
    records = evaluation.run(["only"], TURNS, generate, attempts=1, max_tries=2, fix_attempts=2)
    assert [r.part for r in records] == ["reliability", "dialog", "dialog"]


@pytest.fixture
def bundled_models(db) -> list[LLM]:
    presets = Path(settings.BASE_DIR) / "inference" / "presets"
    return [
        LLM.objects.create(
            name=name, family=family, preset=str(presets / name), queue=f"eval.{name}", max_new_tokens=40
        )
        for name, family in (("gemma-calendar", "gemma"), ("llama3-calendar", "llama3"))
    ]


@pytest.mark.django_db
def test_evaluate_command_end_to_end_on_the_bundled_models(bundled_models, client) -> None:
    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    out, err = StringIO(), StringIO()
    call_command(
        "evaluate",
        "--task=calendar",
        "--models",
        "gemma-calendar",
        "llama3-calendar",
        "--attempts=2",
        "--max-tries=1",
        "--fix-attempts=1",
        "--decoys=2",
        "--feedback-mistakes=1",
        stdout=out,
        stderr=err,
    )
    run = EvaluationRun.objects.get()
    assert run.status == EvaluationRun.Status.DONE and run.progress == run.total == 2 * (2 + 6 + 1 + 2 + 1)
    replies = EvaluationReply.objects.filter(run=run)
    by_part = {part: replies.filter(part=part).count() for part in ("reliability", "dialog", "fixing")}
    assert by_part["reliability"] == 4 and 12 <= by_part["dialog"] <= 24
    # The strong model answers the scenario's first request correctly (any assumed year).
    strong_first = replies.filter(model__name="gemma-calendar", part="reliability")
    assert {r.rating for r in strong_first} == {"correct"}, [r.reply for r in strong_first]
    assert replies.filter(part="feedback").count() % 3 == 0  # Each mistake corrected three ways.
    for reply in replies.exclude(part="discernment"):  # Every reply is rated from its checker verdict.
        assert reply.rating in ("correct", "fixed") if reply.verdict == "correct" else reply.rating == reply.verdict
    assert "evaluation" in err.getvalue()  # The progress bar.
    recap = out.getvalue().splitlines()
    assert recap[2].split()[1] == "gemma-calendar"  # Ranked first by tally.

    page = client.get(f"/evaluations/{run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    for table in ("recap", "fixability", "reliability", "dialog", "fixing", "discernment", "feedback"):
        assert f'id="{table}"' in html
    assert client.get("/evaluations/").status_code == 200


@pytest.mark.django_db
def test_evaluate_json_prints_the_run_as_one_object(bundled_models) -> None:
    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    out = StringIO()
    options = ("--attempts=2", "--max-tries=1", "--fix-attempts=1", "--decoys=1", "--feedback-mistakes=1", "--json")
    call_command("evaluate", "--task=calendar", "--models", "gemma-calendar", "llama3-calendar", *options, stdout=out)
    summary = json.loads(out.getvalue())
    run = EvaluationRun.objects.get()
    assert summary["run"] == run.pk and summary["task"] == "calendar"
    rows = {row["model"]: row for row in summary["models"]}
    assert set(rows) == {"gemma-calendar", "llama3-calendar"}
    final = evaluation.turn_ratings([reply.as_record() for reply in run.replies.order_by("pk")])
    for name, row in rows.items():
        ok = [final[(name, turn)] in ("correct", "fixed") for turn in range(6)]
        assert row["dialog_turns_ok"] == sum(ok) and len(row["dialog"]) == 6
        reliable = run.replies.filter(model__name=name, part="reliability")
        assert row["reliability"] == {"correct": reliable.filter(rating="correct").count(), "attempts": 2}
        assert set(row["feedback"]) <= {"generic", "human", "checker"}
        assert {"fixed", "episodes"} <= set(row["fixability"])
        if row["fixability"]["rating"] is not None and row["fixability"]["lower"] is not None:
            assert row["fixability"]["lower"] <= row["fixability"]["rating"] <= row["fixability"]["upper"]
        assert row["discernment"]["model"] == name
    episodes = sum(row["fixability"]["episodes"] for row in rows.values())
    assert episodes == len(evaluation.fix_episodes([reply.as_record() for reply in run.replies.order_by("pk")]))


@pytest.mark.django_db
def test_evaluate_command_refuses_bad_input(bundled_models) -> None:
    with pytest.raises(CommandError, match="No task 'nope'"):
        call_command("evaluate", "--task=nope")
    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    with pytest.raises(CommandError, match="No model named ghost"):
        call_command("evaluate", "--task=calendar", "--models", "ghost")
    with pytest.raises(CommandError, match="attempts must be at least 1"):
        call_command("evaluate", "--task=calendar", "--attempts=0")
    assert not EvaluationRun.objects.exists()


def test_a_conversation_too_long_for_the_model_is_garbage() -> None:
    answers = iter(["f(1)", "f(1)"])

    def generate(model: str, conversation, seed: int) -> str:
        if len(conversation) > 2:
            raise evaluation.ContextOverflow("too long")
        return next(answers)

    records = evaluation.run(["m"], [*TURNS, turn("three", "f(3)")], generate, attempts=1, max_tries=2, fix_attempts=0)
    assert [(r.turn, r.rating, r.reason) for r in records if r.part == "dialog"] == [
        (0, "correct", ""),
        (1, "garbage", evaluation.TOO_LONG),
        (2, "garbage", evaluation.TOO_LONG),
    ]
