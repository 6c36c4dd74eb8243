"""Curated tasks: the bundled fixtures, validation, JSON import/export and the admin."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from inference.building.calendar_data import SYSTEM_PROMPT
from inference.models import LLM
from votes import checkers, selectors, services
from votes.management.commands.import_tasks import BUNDLED_TASKS
from votes.models import EvaluationRun, Task, TaskTurn

pytestmark = pytest.mark.django_db

# shared/scenario.md, "Scripted dialog and expected outputs", word for word.
SCENARIO = [
    (
        "Add a meeting with Fred on Nov 11 at 5PM",
        'action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)',
    ),
    (
        "The current year is 2024.",
        'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)',
    ),
    (
        "I'm going to a rock concert in the evening of the same day at 8pm. Add a calendar entry for that.",
        'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration=30)',
    ),
    (
        "Set the duration to 3 hours.",
        'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration=60*3)',
    ),
    (
        "Add a meeting with Paul on the next day at 8am. 1/2h.",
        'action.add_calendar_entry("Meeting with Paul", date="2024-11-12", time="08:00", duration=30)',
    ),
    ("Cancel the meeting with Fred.", 'action.remove_calendar_entry("Meeting with Fred", "2024-11-11", "17:00")'),
]


def bundled() -> dict:
    return json.loads(Path(BUNDLED_TASKS).read_text(encoding="utf-8"))


def test_bundled_tasks_import_with_a_checker_on_every_turn() -> None:
    tasks = services.import_tasks(bundled())
    assert len(tasks) >= 5
    for task in tasks:
        turns = list(task.turns.order_by("position"))
        assert task.system_prompt and len(turns) >= 3
        for turn in turns:
            assert turn.checker != TaskTurn.Checker.NONE
            # Every expected output passes its own check, and an empty reply fails it.
            checkers.validate(turn.checker, turn.expected_output, turn.checker_options)
            if turn.checker != TaskTurn.Checker.REGEX:
                assert turn.check_reply(turn.expected_output).verdict == "correct"
            assert turn.check_reply("").verdict == "garbage"
    assert {task.checker for task in TaskTurn.objects.all()} == {"python_call", "exact", "regex", "json"}


def test_calendar_task_is_the_scenario_word_for_word() -> None:
    services.import_tasks(bundled())
    task = Task.objects.get(slug="calendar")
    assert task.system_prompt == SYSTEM_PROMPT
    assert [(turn.prompt, turn.expected_output) for turn in task.turns.order_by("position")] == SCENARIO
    first, correction = task.turns.order_by("position")[:2]
    # Prompt 1 gives no year: the year the model assumes is fine there, not after prompt 2.
    assumed = SCENARIO[0][1].replace("2023", "2025")
    assert first.check_reply(assumed).verdict == "correct"
    assert correction.check_reply(assumed).reason == "date is 2025-11-11, expected 2024-11-11"


def test_invalid_task_is_refused_and_nothing_is_written() -> None:
    data = bundled()
    data["tasks"][1]["turns"][2]["expected_output"] = "convert(5.5, 'ft'"
    with pytest.raises(services.TaskImportError, match=r"task 'unit-conversion', turn 3: .*not a Python call"):
        services.import_tasks(data)
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(tasks="x"), r'Expected a JSON object \{"tasks"'),
        (lambda d: d["tasks"][0].update(slug="not a slug"), "slug"),
        (lambda d: d["tasks"][0].update(turns=[]), "non-empty list of turns"),
        (lambda d: d["tasks"][0]["turns"][0].update(checker="sql"), "checker"),
        (lambda d: d["tasks"][0]["turns"][0].update(colour="red"), "unknown field"),
        (lambda d: d["tasks"][2]["turns"][0].update(expected_output=""), "needs an expected output"),
        (lambda d: d["tasks"][4]["turns"][0].update(expected_output="{'name': 1}"), "not valid JSON"),
        (lambda d: d["tasks"].append(dict(d["tasks"][0])), "given twice"),
        # Past the arena's longest conversation before the first prompt (inference.context_budget).
        (lambda d: d["tasks"][0].update(system_prompt="\N{GRINNING FACE}" * 500), "no prompt would fit"),
    ],
)
def test_import_errors_say_what_is_wrong(change, message: str) -> None:
    data = bundled()
    change(data)
    with pytest.raises(services.TaskImportError, match=message):
        services.import_tasks(data)
    assert not Task.objects.exists()


def test_export_then_import_round_trips_and_replaces_by_slug() -> None:
    services.import_tasks(bundled())
    exported = selectors.export_tasks(Task.objects.order_by("slug"))
    task = Task.objects.get(slug="csv-header")
    task.title = "Edited"
    task.save()
    TaskTurn.objects.filter(task=task, position=0).update(prompt="changed")
    services.import_tasks(exported, keep_existing=True)  # Admin edits are kept.
    assert Task.objects.get(slug="csv-header").title == "Edited"
    services.import_tasks(exported)  # Replaced, turns included.
    assert selectors.export_tasks(Task.objects.order_by("slug")) == exported


def test_import_and_export_commands(tmp_path: Path) -> None:
    out = StringIO()
    call_command("import_tasks", stdout=out)
    assert "Imported 5 task(s)" in out.getvalue()
    target = tmp_path / "tasks.json"
    call_command("export_tasks", "--task=calendar", f"--output={target}")
    assert [task["slug"] for task in json.loads(target.read_text())["tasks"]] == ["calendar"]
    with pytest.raises(CommandError, match="No task with slug nope"):
        call_command("export_tasks", "--task=nope")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("import_tasks", str(broken))
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("import_tasks", str(tmp_path / "missing.json"))


def test_duplicate_makes_an_inactive_copy() -> None:
    (task, *_) = services.import_tasks(bundled())
    copy = services.duplicate_task(task)
    again = services.duplicate_task(task)
    assert (copy.slug, again.slug) == ("calendar-copy", "calendar-copy-2")
    assert not copy.active
    assert list(copy.turns.values_list("prompt", flat=True)) == list(task.turns.values_list("prompt", flat=True))


@pytest.fixture
def admin_client(client):
    user = User.objects.create_superuser("admin", "admin@example.org", "pw")
    client.force_login(user)
    return client


def turn_form(prefix_index: int, **fields: str) -> dict[str, str]:
    return {f"turns-{prefix_index}-{name}": value for name, value in fields.items()}


def test_admin_refuses_a_turn_whose_expected_call_does_not_parse(admin_client) -> None:
    data = {
        "slug": "api",
        "title": "API",
        "category": "",
        "system_prompt": "Call f.",
        "active": "on",
        "notes": "",
        "turns-TOTAL_FORMS": "1",
        "turns-INITIAL_FORMS": "0",
        "turns-MIN_NUM_FORMS": "0",
        "turns-MAX_NUM_FORMS": "1000",
        **turn_form(
            0,
            position="0",
            prompt="Call f with 1.",
            expected_output="f(1",
            checker="python_call",
            checker_options="{}",
        ),
    }
    response = admin_client.post("/admin/votes/task/add/", data)
    assert response.status_code == 200
    assert "The expected output is not a Python call" in response.content.decode()
    assert not Task.objects.exists()
    data["turns-0-expected_output"] = "f(1)"
    response = admin_client.post("/admin/votes/task/add/", data)
    assert response.status_code == 302
    assert Task.objects.get(slug="api").turns.get().expected_output == "f(1)"


def test_admin_actions_and_import(admin_client) -> None:
    upload = SimpleUploadedFile("tasks.json", Path(BUNDLED_TASKS).read_bytes(), content_type="application/json")
    response = admin_client.post("/admin/votes/task/import/", {"file": upload})
    assert response.status_code == 302 and Task.objects.count() == 5
    bad = SimpleUploadedFile("tasks.json", b'{"tasks": [{"slug": "x"}]}', content_type="application/json")
    response = admin_client.post("/admin/votes/task/import/", {"file": bad})
    assert response.status_code == 200 and "Nothing was imported" in response.content.decode()

    calendar = Task.objects.get(slug="calendar")
    changelist = "/admin/votes/task/"
    admin_client.post(changelist, {"action": "deactivate", "_selected_action": [calendar.pk]})
    assert not Task.objects.get(pk=calendar.pk).active
    admin_client.post(changelist, {"action": "activate", "_selected_action": [calendar.pk]})
    assert Task.objects.get(pk=calendar.pk).active
    admin_client.post(changelist, {"action": "duplicate", "_selected_action": [calendar.pk]})
    assert Task.objects.filter(slug="calendar-copy", active=False).exists()
    response = admin_client.post(changelist, {"action": "export_json", "_selected_action": [calendar.pk]})
    assert json.loads(response.content)["tasks"][0]["slug"] == "calendar"
    assert admin_client.get(changelist).status_code == 200
    assert admin_client.get(f"/admin/votes/task/{calendar.pk}/change/").status_code == 200

    # Run an evaluation: a pending run of every enabled model, handed to a worker on commit.
    strong = LLM.objects.create(name="strong", family="gemma", preset="/presets/strong", context_tokens=2048)
    LLM.objects.create(name="off", family="gemma", preset="/presets/off", enabled=False, context_tokens=2048)
    admin_client.post(changelist, {"action": "run_evaluation", "_selected_action": [calendar.pk]})
    run = EvaluationRun.objects.get()
    assert (run.task, list(run.llms.all()), run.status) == (calendar, [strong], EvaluationRun.Status.PENDING)
    assert run.total == 5 + 6 + 3 + 3 + 2  # Reliability, dialog, fixing, decoys, feedback (defaults).


def test_arena_page_offers_the_active_tasks(client) -> None:
    services.import_tasks(bundled())
    Task.objects.filter(slug="csv-header").update(active=False)
    html = client.get("/").content.decode()
    assert 'data-task="calendar"' in html and "Calendar assistant" in html
    assert 'data-task="csv-header"' not in html


def test_a_battle_keeps_what_its_models_were_given_when_its_task_is_edited(admin_client) -> None:
    """An admin edits a task after a battle on it (the browser sends its text with CR LF): the
    text is stored as typed with LF line endings, and the battle (what its models were given, how
    its prompts are matched, its research export) is unchanged."""
    from votes import research
    from votes.models import Battle, Vote

    for name in ("m", "n"):
        LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}", context_tokens=2048)
    services.import_tasks(bundled())
    task = Task.objects.get(slug="calendar")
    battle = services.start_battle(voter_key="v", task=task)
    Vote.objects.create(battle=battle, stage="first_try", choice="a", after_turn=0)
    Battle.objects.filter(pk=battle.pk).update(state="ended")
    exported = research.vote_record(Vote.objects.get())
    assert exported["system_prompt"] == SYSTEM_PROMPT and "\r" not in SYSTEM_PROMPT
    assert [turn["prompt"] for turn in exported["script"]] == [prompt for prompt, _ in SCENARIO]

    turns = list(task.turns.order_by("position"))
    data = {
        "slug": task.slug,
        "title": task.title,
        "category": task.category,
        "system_prompt": "Only call the API.\r\nNever chat.\r\n",
        "context": "[]",
        "active": "on",
        "notes": "Edited\r\nby an admin.",
        "turns-TOTAL_FORMS": str(len(turns)),
        "turns-INITIAL_FORMS": str(len(turns)),
        "turns-MIN_NUM_FORMS": "0",
        "turns-MAX_NUM_FORMS": "1000",
    }
    for index, turn in enumerate(turns):
        data |= turn_form(
            index,
            id=str(turn.pk),
            task=str(task.pk),
            position=str(turn.position),
            prompt=turn.prompt if index else "Add Fred\r\non Monday.",
            expected_output=turn.expected_output,
            checker=turn.checker,
            checker_options=json.dumps(turn.checker_options),
            **({"corrects_previous": "on"} if turn.corrects_previous else {}),
        )
    response = admin_client.post(f"/admin/votes/task/{task.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    task.refresh_from_db()
    assert task.system_prompt == "Only call the API.\nNever chat.\n"  # As typed, ends kept, LF.
    assert task.notes == "Edited\nby an admin."
    assert task.turns.get(position=0).prompt == "Add Fred\non Monday."

    battle.refresh_from_db()
    assert research.vote_record(Vote.objects.get()) == exported
    assert battle.system_prompt == SYSTEM_PROMPT and battle.script[0]["prompt"] == SCENARIO[0][0]
    # A new battle gets the task as it is now.
    assert services.start_battle(voter_key="w", task=task).system_prompt == "Only call the API.\nNever chat.\n"
