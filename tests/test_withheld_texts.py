"""The texts of models in the arena are never published: not on the evaluation pages, not in
/api/v1/evaluations/<id> (with or without a researcher key: votes.evaluation.published), not in
the fix episodes of the API and dumps, not in the anonymous sample of /api/v1/votes
(votes.research.without_arena_texts). A voter who had them could match a battle's text against
them and name its models before voting (tests/test_identification_probe.py). Counts and verdicts
stay public; staff see every text, and everyone does once the model leaves the roster."""

import json
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client

from inference.models import LLM
from tests.conftest import answer_prompt
from votes import evaluation, evaluation_services, services
from votes.models import Battle, EvaluationRun, Task

pytestmark = pytest.mark.django_db
BUNDLED_TASKS = Path(settings.BASE_DIR) / "votes" / "fixtures" / "tasks.json"
HIDDEN_NOTE = "hidden while this model is in the arena"


def reply_of(llm: LLM) -> str:
    """A wrong call with chatter that names its model: the checker's reason quotes the chatter,
    and the dialog's corrections quote the reason."""
    return f'Sure! marker-{llm.name} action.add_calendar_entry("Meeting with Fred", date="1999-01-01", time="17:00")'


@pytest.fixture
def finished_run(db: None) -> EvaluationRun:
    services.import_tasks(json.loads(BUNDLED_TASKS.read_text()))
    llms = [
        LLM.objects.create(name=name, family="gemma", preset="unused", context_tokens=2048)
        for name in ("alpha", "beta")
    ]
    run = evaluation_services.create_evaluation(
        task=Task.objects.get(slug="calendar"), llms=llms, attempts=2, max_tries=1, fix_attempts=1, decoys=0
    )
    return evaluation_services.run_evaluation(run.pk, generate=lambda llm, system, conversation, seed: reply_of(llm))


def markers(text: str) -> set[str]:
    return {name for name in ("alpha", "beta") if f"marker-{name}" in text}


def test_a_model_in_the_arena_has_its_texts_and_what_quotes_them_withheld() -> None:
    wrong = evaluation.Record(
        "m",
        evaluation.DIALOG,
        0,
        1,
        1,
        "Text around the call: 'Sure! m'.",
        "Sure! m f()",
        "garbage",
        "text around the call: 'Sure! m'",
        "garbage",
    )
    shown = evaluation.published(wrong, {"m"})
    assert shown["reply"] is None and shown["reason"] is None and shown["prompt"] is None
    assert shown["verdict"] == shown["rating"] == "garbage" and shown["text_hidden"] is True
    scripted = evaluation.published(
        evaluation.Record("m", evaluation.DIALOG, 0, 1, 0, "Add a meeting", "f()", "correct", "", "correct"), {"m"}
    )
    assert scripted["prompt"] == "Add a meeting" and scripted["reply"] is None  # The script is public.
    # Another model's correction of m's mistake quotes m's reply: withheld; its own reply is not.
    fixing = evaluation.Record(
        "n",
        evaluation.FIXING,
        0,
        1,
        1,
        "Text around the call: 'Sure! m'.",
        "f()",
        "correct",
        "",
        "fixed",
        mistake_by="m",
    )
    shown = evaluation.published(fixing, {"m"})
    assert shown["prompt"] is None and shown["reply"] == "f()" and shown["text_hidden"] is True
    assert evaluation.published(wrong, set()) | {"text_hidden": False} == evaluation.published(wrong, set())


def test_the_page_shows_marks_and_counts_but_not_the_texts(finished_run: EvaluationRun, client: Client) -> None:
    html = client.get(f"/evaluations/{finished_run.pk}/").content.decode()
    assert markers(html) == set()
    assert HIDDEN_NOTE in html and "The replies of alpha, beta are hidden while these models are in the arena" in html
    assert "🔥" in html and 'id="recap"' in html  # Verdicts and counts stay public.
    assert "Add a meeting with Fred on Nov 11 at 5PM" in html  # So does the script.

    staff = get_user_model().objects.create_user("staff", password="a-long-password-9", is_staff=True)
    client.force_login(staff)
    assert markers(client.get(f"/evaluations/{finished_run.pk}/").content.decode()) == {"alpha", "beta"}

    client.logout()
    LLM.objects.filter(name="alpha").update(enabled=False)  # alpha leaves the roster.
    html = client.get(f"/evaluations/{finished_run.pk}/").content.decode()
    assert markers(html) == {"alpha"} and "The replies of beta are hidden while this model is in the arena" in html


def test_the_api_withholds_the_texts_from_everyone_but_staff(finished_run: EvaluationRun, client: Client) -> None:
    _, token = services.issue_researcher_key("lab")
    address = f"/api/v1/evaluations/{finished_run.pk}"
    for headers in ({}, {"HTTP_X_API_KEY": token}):  # A researcher key is not staff.
        response = client.get(address, **headers)
        assert response.status_code == 200 and markers(response.content.decode()) == set()
        body = response.json()
        assert body["texts_hidden_for"] == ["alpha", "beta"]
        assert body["recap"] and all(reply["text_hidden"] and reply["reply"] is None for reply in body["replies"])
        assert {reply["verdict"] for reply in body["replies"]} <= {"garbage", "mistake"}  # Verdicts stay.

    staff = get_user_model().objects.create_user("staff", password="a-long-password-9", is_staff=True)
    client.force_login(staff)
    body = client.get(address).json()
    assert body["texts_hidden_for"] == [] and markers(json.dumps(body)) == {"alpha", "beta"}

    client.logout()
    LLM.objects.filter(name="beta").update(enabled=False)
    body = client.get(address, HTTP_X_API_KEY=token).json()
    assert body["texts_hidden_for"] == ["alpha"] and markers(json.dumps(body)) == {"beta"}


def test_fix_episodes_withhold_a_correction_that_quotes_a_model_in_the_arena(
    finished_run: EvaluationRun, client: Client
) -> None:
    services.record_fix_episodes()
    _, token = services.issue_researcher_key("lab")
    episodes = client.get("/api/v1/episodes", HTTP_X_API_KEY=token).json()["episodes"]
    checker = [e for e in episodes if e["evaluation_run"] == finished_run.pk and e["source"] == "checker"]
    assert checker and all(e["correction"] is None for e in checker)
    assert markers(json.dumps(episodes)) == set()

    LLM.objects.update(enabled=False)  # Both leave the roster: their corrections are public again.
    episodes = client.get("/api/v1/episodes", HTTP_X_API_KEY=token).json()["episodes"]
    assert markers(json.dumps(episodes)) == {"alpha", "beta"}


def ended_battle_with(texts: dict[str, str]) -> Battle:
    """An anonymous battle between alpha and beta, replied, voted on and ended."""
    battle = services.start_battle(voter_key="voter")
    answer_prompt(battle, replies=lambda reply: texts[(battle.model_a if reply.side == "a" else battle.model_b).name])
    services.cast_vote(battle=battle, choice="a")
    return services.end_battle(battle=battle)


def test_the_anonymous_vote_sample_names_the_models_but_withholds_their_texts(db: None, client: Client) -> None:
    # Texts that do not name their model (one that did would be an identity leak, not counted).
    texts = {"alpha": "Booked: walrus-one.", "beta": "Booked: heron-two."}
    for name in texts:
        LLM.objects.create(name=name, family="gemma", preset="unused", context_tokens=2048)
    ended_battle_with(texts)

    def shown(body: str) -> set[str]:
        return {name for name, text in texts.items() if text in body}

    record = json.loads(b"".join(client.get("/api/v1/votes").streaming_content))
    assert {record["model_a"], record["model_b"]} == {"alpha", "beta"} and record["winner"] == "model_a"
    assert sorted(record["texts_hidden"]) == ["a", "b"] and shown(json.dumps(record)) == set()
    replies = [turn for side in "ab" for turn in record[f"conversation_{side}"] if turn["role"] == "assistant"]
    assert [turn["content"] for turn in replies] == [None, None] and [turn["num_tokens"] for turn in replies] == [5, 5]
    csv = b"".join(client.get("/api/v1/votes?format=csv").streaming_content).decode()
    assert "alpha" in csv and shown(csv) == set()

    _, token = services.issue_researcher_key("lab")  # Researchers get the dataset, texts and all.
    keyed = b"".join(client.get("/api/v1/votes", HTTP_X_API_KEY=token).streaming_content).decode()
    assert shown(keyed) == {"alpha", "beta"}
    LLM.objects.filter(name="alpha").update(enabled=False)  # alpha leaves the roster.
    record = json.loads(b"".join(client.get("/api/v1/votes").streaming_content))
    assert shown(json.dumps(record)) == {"alpha"} and len(record["texts_hidden"]) == 1
