"""The identification probe of issue 17: a client that has every public page and API response
(the evaluation pages, /api/v1/evaluations and the anonymous vote sample of /api/v1/votes, after
some battles have ended and been published there) tries to name the models of fresh battles from
their streamed text, and does no better than chance. The same probe, given what the arena
published before the fix (every text, as a staff session still sees them) against greedy
decoding, names them: the probe can identify, so its failure means something. (With the vote
sample's texts in view, even sampled battles were named 50 of 50: two models' writing differs,
so the public sample carries no text of a model in the arena.)

The probe (``name_sides``): for each side, how closely its text matches the replies published
for each model (the lookup table of the review), how close its length is to theirs, and whether
it shares their leading space. It names the sides one way when the evidence says so; with none
it cannot do better than a coin, and such a battle is scored as a coin's expectation, 1/2, so
that the test does not fail one run in a hundred by chance when the probe has nothing to go on.
Its score over the battles is tested against chance with a one-sided binomial test (the sides
of each battle are shuffled, so a probe without information is right half the time).

Cost: the battles are real (the consumer, a Celery worker, the tiny demo models' engines), run
eight at a time so the engine batches them, with pacing off and 12 new tokens a reply.
"""

import asyncio
import html
import json
import random
import re
from collections.abc import Awaitable, Callable
from difflib import SequenceMatcher
from statistics import mean
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from scipy.stats import binomtest

from inference.management.commands.register_roster import REAL_MODEL_SAMPLING
from inference.models import LLM
from tests.conftest import new_session
from votes import evaluation_services, services
from votes.models import Battle, Task

pytestmark = pytest.mark.django_db(transaction=True)

PROMPT = "Add a meeting with Fred on Nov 11 at 5PM"
EXPECTED = 'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00")'
PROBE_TASK = {
    "tasks": [
        {
            "slug": "probe",
            "title": "Probe",
            "system_prompt": "You add calendar entries.",
            "active": True,
            "turns": [
                {
                    "prompt": PROMPT,
                    "expected_output": EXPECTED,
                    "checker": "python_call",
                    "checker_options": {"signature": ["action.add_calendar_entry(title, date, time)"]},
                }
            ],
        }
    ]
}
BATTLES = 50  # Fresh battles the probe tries to name, after the fix.
CONTROL_BATTLES = 16  # Before the fix (texts published, greedy decoding).
REVEALED = 8  # Battles voted on and ended first, for the public vote sample.
AT_ONCE = 8  # Battles in flight together (the worker's threads; the engine batches them).
Knowledge = dict[str, list[str]]  # Per model, the texts published for it.


# --- The probe ---------------------------------------------------------------------------------------


def published_texts(client: Client) -> Knowledge:
    """Every reply text the evaluation pages and the API show ``client``, per model."""
    known: Knowledge = {}
    listing = client.get("/evaluations/").content.decode()
    for run_id in sorted(set(re.findall(r'href="/evaluations/(\d+)/"', listing))):
        page = client.get(f"/evaluations/{run_id}/").content.decode()
        for model, row in re.findall(r"<tr><th>([^<]+)</th>(.*?)</tr>", page, re.DOTALL):
            texts = re.findall(r"<div data-markdown>(.*?)</div>", row, re.DOTALL)
            known.setdefault(html.unescape(model), []).extend(html.unescape(text) for text in texts)
    for run in client.get("/api/v1/evaluations").json():
        for reply in client.get(f"/api/v1/evaluations/{run['id']}").json()["replies"]:
            if reply["reply"] is not None:
                known.setdefault(reply["model"], []).append(reply["reply"])
    # The anonymous sample of the newest counted votes: ended battles, their models named.
    for line in b"".join(client.get("/api/v1/votes").streaming_content).decode().splitlines():
        record = json.loads(line)
        for side in ("a", "b"):
            replies = [
                turn["content"]
                for turn in record[f"conversation_{side}"]
                if turn["role"] == "assistant" and turn["content"] is not None
            ]
            known.setdefault(record[f"model_{side}"], []).extend(replies)
    return {model: texts for model, texts in known.items() if texts}


def fit(text: str, texts: list[str]) -> float:
    """How much ``text`` looks like ``texts``: the best lookup match, then length and a leading
    space as tie-breakers; 0 without published texts."""
    if not texts:
        return 0.0
    lookup = max(SequenceMatcher(None, text, known).ratio() for known in texts)
    typical = mean(len(known) for known in texts)
    length = 1.0 - min(1.0, abs(len(text) - typical) / max(typical, 1.0))
    spaced = mean(known.startswith(" ") for known in texts) > 0.5
    return lookup + 0.1 * length + 0.1 * (text.startswith(" ") == spaced)


def name_sides(text_a: str, text_b: str, known: Knowledge, names: tuple[str, str]) -> float:
    """The probe's belief that side a is ``names[0]`` (and b ``names[1]``): 1, 0, or 1/2 when
    nothing it has tells the two assignments apart."""
    first, second = names
    as_named = fit(text_a, known.get(first, [])) + fit(text_b, known.get(second, []))
    swapped = fit(text_a, known.get(second, [])) + fit(text_b, known.get(first, []))
    if abs(as_named - swapped) < 1e-9:
        return 0.5
    return 1.0 if as_named > swapped else 0.0


def score(beliefs: list[float], truths: list[bool]) -> float:
    """Battles named right: a belief of 1/2 counts as a coin's expectation."""
    return sum(belief if truth else 1.0 - belief for belief, truth in zip(beliefs, truths, strict=True))


def p_better_than_chance(points: float, battles: int) -> float:
    """One-sided binomial test of the probe's score against 1/2 a battle."""
    return binomtest(int(points), battles, 0.5, alternative="greater").pvalue


def test_the_probe_scores_a_coin_without_evidence_and_a_lookup_with_it() -> None:
    known = {"x": ["alpha beta gamma"], "y": ["1234 5678"]}
    assert name_sides("alpha beta gamma", "1234 5678", known, ("x", "y")) == 1.0
    assert name_sides("1234 5678", "alpha beta gamma", known, ("x", "y")) == 0.0
    assert name_sides("anything", "else", {}, ("x", "y")) == 0.5
    assert score([0.5] * 50, [True] * 20 + [False] * 30) == 25.0
    assert p_better_than_chance(25, 50) > 0.5 and p_better_than_chance(34, 50) < 0.01


# --- Fresh battles against the real consumer ---------------------------------------------------------


async def play(
    connect_battle: Callable[..., Awaitable[Any]], reveal: bool = False, named: tuple[str, str] | None = None
) -> tuple[str, str, str]:
    """One battle from a fresh session (as the review's script did): its id and the two texts as
    the end frames carry them. Anonymous, or with ``named`` a named battle of those models on
    sides in random order (greedy models are never drawn for anonymous battles)."""
    client = await connect_battle(session=await database_sync_to_async(new_session)())
    if named is None:
        await client.send({"type": "start", "task": "probe"})
    else:
        models = random.sample(named, 2)
        await client.send({"type": "start", "task": "probe", "mode": "named", "models": models})
    battle_id = (await client.receive())["battle"]
    await client.receive()  # The battle's state.
    await client.send({"type": "prompt", "text": PROMPT})
    ends = {frame["side"]: frame for frame in await client.receive_both_ends() if frame["type"] == "end"}
    if reveal:
        await client.send({"type": "vote", "choice": "a"})
        await client.receive()
        await client.send({"type": "end"})
        await client.receive_until(lambda frame: frame["type"] == "revealed")
    await client.communicator.disconnect()
    assert {end["status"] for end in ends.values()} == {"done"}, ends
    return battle_id, ends["a"]["text"], ends["b"]["text"]


async def reveal_some(connect_battle: Callable[..., Awaitable[Any]], named: tuple[str, str] | None = None) -> None:
    """Battles voted on and ended before the probe: the anonymous vote sample publishes them with
    their models' names (without their texts; with them, the probe named 50 of 50)."""
    await asyncio.gather(*(play(connect_battle, reveal=True, named=named) for _ in range(REVEALED)))


def side_a_is(battle_id: str, name: str) -> bool:
    return Battle.objects.select_related("model_a").get(public_id=battle_id).model_a.name == name


async def probe(
    connect_battle: Callable[..., Awaitable[Any]],
    known: Knowledge,
    names: tuple[str, str],
    battles: int,
    named: bool = False,
) -> tuple[float, list[str]]:
    """The probe's score over ``battles`` fresh battles (named ones in random order, if
    ``named``), and their texts."""
    beliefs, truths, texts = [], [], []
    pick = names if named else None
    for start in range(0, battles, AT_ONCE):
        played = await asyncio.gather(*(play(connect_battle, named=pick) for _ in range(min(AT_ONCE, battles - start))))
        for battle_id, text_a, text_b in played:
            beliefs.append(name_sides(text_a, text_b, known, names))
            truths.append(await database_sync_to_async(side_a_is)(battle_id, names[0]))
            texts += [text_a, text_b]
    return score(beliefs, truths), texts


def arena(demo_llms: list[LLM], settings: Any, **sampling: float) -> tuple[str, str]:
    """The probe's task, the tiny models with short replies and ``sampling``, pacing off, and a
    finished evaluation run of both on the task (greedy, as runs are): the texts it publishes."""
    settings.ARENA_STREAM_CHARS_PER_S = settings.ARENA_STREAM_FIRST_TEXT_SECONDS = 0
    settings.ARENA_STREAM_UNMEASURED_CHARS_PER_S = 0
    settings.ARENA_RATE_LIMITS = "battle=1000/1000/3600,message=1000/1000/60,frame=5000/5000/60"
    services.import_tasks(PROBE_TASK)
    for llm in demo_llms:
        LLM.objects.filter(pk=llm.pk).update(max_new_tokens=12, **sampling)
    run = evaluation_services.create_evaluation(
        task=Task.objects.get(slug="probe"),
        llms=demo_llms,
        attempts=2,
        max_tries=0,
        fix_attempts=0,
        decoys=0,
        feedback_mistakes=0,
    )
    assert evaluation_services.run_evaluation(run.pk).status == "done"
    first, second = sorted(llm.name for llm in demo_llms)
    return first, second


async def test_the_probe_names_both_models_when_the_texts_are_published_and_decoding_is_greedy(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    """Before the fix: the evaluation texts in view (staff see them still), greedy decoding. An
    anonymous battle never draws a greedy model now (tests/test_pair_sampling.py), so the battles
    here are named ones with their sides in random order: to the probe, which reads only the
    texts, the same as the anonymous battles greedy models once played."""
    names = await database_sync_to_async(arena)(demo_llms, settings, temperature=0.0)
    staff = Client()
    user = await database_sync_to_async(get_user_model().objects.create_user)(
        "staff", password="a-long-password-9", is_staff=True
    )
    await database_sync_to_async(staff.force_login)(user)
    await reveal_some(connect_battle, named=names)
    known = await database_sync_to_async(published_texts)(staff)
    assert set(known) == set(names)
    points, _ = await probe(connect_battle, known, names, CONTROL_BATTLES, named=True)
    assert p_better_than_chance(points, CONTROL_BATTLES) < 0.001, points


async def test_a_client_with_every_public_page_cannot_name_the_models_better_than_chance(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    names = await database_sync_to_async(arena)(demo_llms, settings, **REAL_MODEL_SAMPLING)
    await reveal_some(connect_battle)
    known = await database_sync_to_async(published_texts)(Client())
    assert known == {}  # Not one text of a model in the arena, on any public page or API response.
    points, texts = await probe(connect_battle, known, names, BATTLES)
    assert len(set(texts)) > 1.5 * BATTLES  # Live battles sample: the texts differ.
    assert p_better_than_chance(points, BATTLES) > 0.01, points
    assert not any(text != text.strip() for text in texts)  # No leading space, no trailing one.
