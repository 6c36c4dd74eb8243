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
        stdout=out,
        stderr=err,
    )
    run = EvaluationRun.objects.get()
    assert run.status == EvaluationRun.Status.DONE and run.progress == run.total == 2 * (2 + 6 + 1)
    replies = EvaluationReply.objects.filter(run=run)
    by_part = {part: replies.filter(part=part).count() for part in ("reliability", "dialog", "fixing")}
    assert by_part["reliability"] == 4 and 12 <= by_part["dialog"] <= 24
    # The strong model answers the scenario's first request correctly (any assumed year).
    strong_first = replies.filter(model__name="gemma-calendar", part="reliability")
    assert {r.rating for r in strong_first} == {"correct"}, [r.reply for r in strong_first]
    for reply in replies:  # Every reply is rated from its checker verdict.
        assert reply.rating in ("correct", "fixed") if reply.verdict == "correct" else reply.rating == reply.verdict
    assert "evaluation" in err.getvalue()  # The progress bar.
    recap = out.getvalue().splitlines()
    assert recap[2].split()[1] == "gemma-calendar"  # Ranked first by tally.

    page = client.get(f"/evaluations/{run.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    for table in ('id="recap"', 'id="reliability"', 'id="dialog"', 'id="fixing"'):
        assert table in html
    assert client.get("/evaluations/").status_code == 200


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
