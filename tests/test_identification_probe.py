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
eight at a time so the engine batches them, with pacing off and 12 new tokens a reply. The last
test plays the review's probe against the real roster, paced as the arena paces it (below): 83
battles of 12 new tokens, four at a time, about 6 minutes on a 2-core machine.
"""

import asyncio
import dataclasses
import html
import itertools
import json
import math
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np
import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client
from scipy.stats import binomtest

from inference.management.commands.register_roster import REAL_MODEL_SAMPLING
from inference.models import LLM
from tests.conftest import BATTLE_PRESETS, new_session, registered_llm
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


async def vote_and_reveal(client: Any) -> None:
    """Vote (for side a) and end the battle: its names are revealed to its voter."""
    await client.send({"type": "vote", "choice": "a"})
    await client.receive()
    await client.send({"type": "end"})
    await client.receive_until(lambda frame: frame["type"] == "revealed")


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
        await vote_and_reveal(client)
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


# --- The real roster: timing, context probes and every text a voter can hold ---------------------
#
# The review's probe against the roster scripts/serve registers (SmolLM2-135M-Instruct, the
# fine-tuned fixer, Gemma 3 270M base; the demo model's 512-token context keeps it out of
# anonymous battles), paced as the arena paces them. A voter chats with each model directly (its
# replies, and its own timing, paced by itself), plays anonymous battles four at a time, one of
# each four (at random) to the reveal (labelled timing of anonymous battles, and their texts with
# the names, as their share pages show them), reads every public page and API response, and
# names the models of the other, fresh anonymous battles from what it can time: when each side's
# first text comes, the pace, the longest pause, the wait between its last text and its end, and
# whether a prompt past the length limit is refused (the context probe).
# Two timing probes, Gaussian classifiers with a pooled variance: one of each side (what each
# model's sides look like in the labelled battles), one of each battle (what each pair's battles
# look like). A score is the mean probability a probe gives the truth, so a probe without
# information scores chance with little noise. The arena's pace and first-text lead drift as it
# measures its models (the first battles run at the unmeasured pace, eight times the later one),
# the same for every battle played at once; a voter sees that drift and times each battle against
# the others played beside it (features less their mean over the battles played together). Left
# in, the drift is a confound: a probe learns each model's look from the few moments its revealed
# battles were played, and names the fresh battles played at the same moments after them, by
# when they were played, not by anything that tells the models apart. The labelled battles are
# interleaved with the fresh ones, as a voter who reveals some battles all along has them (a probe
# trained on the first battles only extrapolates to the later ones). The control, a known truth
# planted in the same battles: each pair's replies shown over 1.2 times as long as the pair
# before it (as pacing each battle by its pair would, were its models' speeds that far apart),
# the battle probe names the pair. (Named battles played paced by their pair, as every battle was
# before the arena-wide pace, or unpaced, made weak controls: the roster's models write nearly
# the same characters a second on this machine, 13.9, 14.6 and 17.6 in one run, so the pairs'
# paces differed by 5 %, and named the pair 0.37 and 0.42 of the time where chance is 0.33.)
# Style is measured too (character trigrams of every text the voter holds): it names the models
# of a battle from their writing, which no arena that reveals names after the vote can hide.

ROSTER_ANONYMOUS = 60  # Anonymous battles: one of each ROSTER_AT_ONCE revealed, the rest fresh.
ROSTER_DIRECT = 1  # Direct chats with each model.
# The control's planted pace: each pair's replies take this many times as long as the pair before
# it (the pairs in the order of their names).
PLANTED_SLOWER = 1.2
# Battles in flight together: the eight replies two networks may have in flight (the default
# ARENA_REPLIES_PER_NETWORK of 4 each), as a voter with two addresses has.
ROSTER_AT_ONCE = 4
TARGET = "gemma3-270m"  # The side a stuffer looks for: the slowest model, the easiest to time.


@dataclass(frozen=True)
class TimedSide:
    text: str
    first_s: float  # From the prompt to the side's first text.
    last_s: float  # To its last text.
    end_s: float  # To its end frame.
    longest_pause_s: float  # The longest wait between two of its deltas.


@dataclass(frozen=True)
class TimedBattle:
    battle_id: str
    refused: bool  # The context probe: a prompt past the length limit was refused.
    sides: dict[str, TimedSide]
    # The mean of the timings over every side of the battles played at the same time as this one.
    beside: tuple[float, ...] = ()

    def timings(self, side: str) -> list[float]:
        """What the voter can time of a side, apart from its text: first text, pace, longest
        pause, the wait after the last text. The pace is characters after the first over the time
        from the first text to the last (a pace shows the first character at its start and one
        more each 1/pace s), so that it does not follow the text's length, which the text shows."""
        timed = self.sides[side]
        shown_s = timed.last_s - timed.first_s
        pace = (len(timed.text) - 1) / shown_s if shown_s > 0 else 0.0
        return [timed.first_s, pace, timed.longest_pause_s, timed.end_s - timed.last_s]

    def features(self, side: str) -> list[float]:
        """The side's timings against the battles played beside it, and the context probe's
        answer. (How much later its first text, or longer its longest pause, than the other
        side's are left to tests/test_stream_pacing.py, which checks that both sides get the same
        frames at the same moments.)"""
        timings = np.array(self.timings(side)) - np.array(self.beside)
        return [*timings.tolist(), float(self.refused)]

    def battle_features(self) -> list[float]:
        """Of the battle, whichever side is which: the mean of its sides' features."""
        return np.mean([self.features(side) for side in self.sides], axis=0).tolist()


async def play_timed(
    connect_battle: Callable[..., Awaitable[Any]], start: dict[str, Any], reveal: bool = False
) -> TimedBattle:
    """One battle from a fresh session, timed as its voter sees it, after a context probe."""
    client = await connect_battle(session=await database_sync_to_async(new_session)())
    await client.send({"type": "start", "task": "probe", **start})
    battle_id = (await client.receive())["battle"]
    await client.receive()  # The battle's state.
    await client.send({"type": "prompt", "text": "\N{GRINNING FACE}" * 480})  # Past every limit.
    answer = (await client.receive_until(lambda frame: frame["type"] in ("error", "prompt")))[-1]
    refused = answer.get("code") == "conversation_too_long"
    sides = ["a"] if start.get("mode") == "direct" else ["a", "b"]
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    pauses: dict[str, float] = dict.fromkeys(sides, 0.0)
    ends: dict[str, tuple[float, str, str]] = {}
    sent = time.monotonic()
    await client.send({"type": "prompt", "text": PROMPT})
    while len(ends) < len(sides):
        frame = await client.receive()
        now = time.monotonic() - sent
        if frame["type"] == "delta":
            side = frame["side"]
            first.setdefault(side, now)
            pauses[side] = max(pauses[side], now - last.get(side, now))
            last[side] = now
        elif frame["type"] == "end":
            ends[frame["side"]] = (now, frame["text"], frame["status"])
    if reveal:
        await vote_and_reveal(client)
    await client.communicator.disconnect()
    assert {status for _, _, status in ends.values()} == {"done"}, ends
    return TimedBattle(
        battle_id=battle_id,
        refused=refused,
        sides={
            side: TimedSide(
                text=text,
                first_s=first.get(side, end),
                last_s=last.get(side, end),
                end_s=end,
                longest_pause_s=pauses[side],
            )
            for side, (end, text, _) in ends.items()
        },
    )


async def play_many(
    connect_battle: Callable[..., Awaitable[Any]], starts: list[dict[str, Any]], reveal: list[bool] | None = None
) -> list[TimedBattle]:
    """The battles, ROSTER_AT_ONCE at a time; those ``reveal`` marks are played to the reveal.
    Each knows the mean timings of the battles played with it."""
    reveal = reveal or [False] * len(starts)
    played: list[TimedBattle] = []
    for at in range(0, len(starts), ROSTER_AT_ONCE):
        batch = zip(starts[at : at + ROSTER_AT_ONCE], reveal[at : at + ROSTER_AT_ONCE], strict=True)
        played += await asyncio.gather(*(play_timed(connect_battle, start, shown) for start, shown in batch))
    return played_together(played)


def played_together(battles: list[TimedBattle]) -> list[TimedBattle]:
    """The battles, each ROSTER_AT_ONCE played at once knowing their mean timings."""
    known = []
    for at in range(0, len(battles), ROSTER_AT_ONCE):
        together = battles[at : at + ROSTER_AT_ONCE]
        beside = tuple(np.mean([battle.timings(side) for battle in together for side in battle.sides], axis=0))
        known += [dataclasses.replace(battle, beside=beside) for battle in together]
    return known


def planted(
    battles: list[TimedBattle], truths: dict[str, dict[str, str]], slower: dict[frozenset[str], float]
) -> list[TimedBattle]:
    """The battles as they would time had each pair a pace of its own: each side's text shown
    over ``slower[pair]`` times as long from its first text (its longest pause and its wait
    after the last text stretched alike)."""
    stretched = []
    for battle in battles:
        factor = slower[frozenset(truths[battle.battle_id].values())]
        sides = {
            side: dataclasses.replace(
                timed,
                last_s=timed.first_s + factor * (timed.last_s - timed.first_s),
                end_s=timed.first_s + factor * (timed.end_s - timed.first_s),
                longest_pause_s=factor * timed.longest_pause_s,
            )
            for side, timed in battle.sides.items()
        }
        stretched.append(dataclasses.replace(battle, sides=sides))
    return played_together(stretched)


def models_of(battle: TimedBattle) -> dict[str, str]:
    found = Battle.objects.select_related("model_a", "model_b").get(public_id=battle.battle_id)
    return {"a": found.model_a.name, "b": found.model_b.name}


class GaussianProbe:
    """Per label, the mean of its rows of features, with one variance per feature pooled over the
    labels (a floor keeps a constant feature from dividing by 0)."""

    def __init__(self, labelled: Sequence[tuple[list[float], Hashable]]) -> None:
        self.labels = sorted({label for _, label in labelled}, key=str)
        rows = np.array([features for features, _ in labelled])
        masks = {label: np.array([other == label for _, other in labelled]) for label in self.labels}
        self.means = {label: rows[masks[label]].mean(axis=0) for label in self.labels}
        residuals = np.concatenate([rows[masks[label]] - self.means[label] for label in self.labels])
        self.variances = residuals.var(axis=0) + 1e-6 + 1e-4 * rows.var(axis=0)

    def log_likelihood(self, features: list[float], label: Hashable) -> float:
        return float(-0.5 * np.sum((np.array(features) - self.means[label]) ** 2 / self.variances))


def posterior(log_likelihoods: dict[Any, float]) -> dict[Any, float]:
    """The probability of each answer, every answer drawn alike."""
    top = max(log_likelihoods.values())
    weights = {answer: float(np.exp(value - top)) for answer, value in log_likelihoods.items()}
    total = sum(weights.values())
    return {answer: weight / total for answer, weight in weights.items()}


class TimingProbe(GaussianProbe):
    """Per model, what its sides look like in labelled battles (``features``)."""

    def assignments(self, battle: TimedBattle) -> dict[tuple[str, str], float]:
        """The probability of each (model on a, model on b), two different models drawn alike."""
        return posterior(
            {
                (a, b): self.log_likelihood(battle.features("a"), a) + self.log_likelihood(battle.features("b"), b)
                for a, b in itertools.permutations(self.labels, 2)
            }
        )


class BattleProbe(GaussianProbe):
    """Per pair (either way round), what its battles look like (``battle_features``)."""

    def score(self, battle: TimedBattle, truth: dict[str, str]) -> float:
        """The probability it gives the battle's true pair, every pair drawn alike."""
        features = battle.battle_features()
        return posterior({pair: self.log_likelihood(features, pair) for pair in self.labels})[frozenset(truth.values())]


def labelled(battle: TimedBattle, truths: dict[str, dict[str, str]]) -> tuple[list[float], frozenset[str]]:
    return battle.battle_features(), frozenset(truths[battle.battle_id].values())


def pair_score(probe: TimingProbe, battle: TimedBattle, truth: dict[str, str]) -> float:
    """The probability the probe gives the battle's true pair (either way round)."""
    posterior = probe.assignments(battle)
    return posterior[(truth["a"], truth["b"])] + posterior[(truth["b"], truth["a"])]


def paired_differences(battles: list[TimedBattle], truths: dict[str, dict[str, str]], target: str) -> str:
    """How the target's side's timings differ from the other side's in the battles it played
    against another model: per timing, the mean difference and its t statistic (printed, for
    docs/security.md: a difference no classifier picked up yet)."""
    differences = np.array(
        [
            np.subtract(battle.timings(side), battle.timings("b" if side == "a" else "a"))
            for battle in battles
            for side, name in truths[battle.battle_id].items()
            if name == target and set(truths[battle.battle_id].values()) != {target}
        ]
    )
    if len(differences) < 2:
        return "too few battles of the target's"
    differences *= (1000, 1, 1000, 1000)  # Milliseconds, and characters a second.
    means, errors = differences.mean(axis=0), differences.std(axis=0, ddof=1) / np.sqrt(len(differences))
    labels = ("first text (ms)", "pace (chars/s)", "longest pause (ms)", "wait after the last text (ms)")
    return f"{len(differences)} battles: " + ", ".join(
        f"{label} {mean:+.1f} (t = {mean / error if error else 0.0:.1f})"
        for label, mean, error in zip(labels, means, errors, strict=True)
    )


def side_score(probe: TimingProbe, battle: TimedBattle, truth: dict[str, str], target: str) -> float:
    """In a battle the target plays, the probability the probe gives its true side, given that
    it plays (what a stuffer needs to vote for it)."""
    posterior = probe.assignments(battle)
    on_a = sum(p for (a, _), p in posterior.items() if a == target)
    on_b = sum(p for (_, b), p in posterior.items() if b == target)
    return (on_a if truth["a"] == target else on_b) / (on_a + on_b)


def trigrams(text: str) -> Counter[str]:
    return Counter(text[i : i + 3] for i in range(max(len(text) - 2, 0)))


def cosine(left: Counter[str], right: Counter[str]) -> float:
    dot = sum(count * right[gram] for gram, count in left.items())
    norm = math.sqrt(sum(c * c for c in left.values()) * sum(c * c for c in right.values()))
    return dot / norm if norm else 0.0


def style_names(battle: TimedBattle, profiles: dict[str, Counter[str]]) -> tuple[str, str]:
    """The (model on a, model on b) whose writing the two texts are most like."""
    a, b = (trigrams(battle.sides[side].text) for side in ("a", "b"))
    return max(
        itertools.permutations(profiles, 2),
        key=lambda pair: cosine(a, profiles[pair[0]]) + cosine(b, profiles[pair[1]]),
    )


def real_roster(smollm2: Path, fixer: Path, gemma3: Path, run_id: str, settings: Any) -> list[LLM]:
    """The roster as register_roster makes it, served by the tests' worker, with short replies."""
    settings.ARENA_RATE_LIMITS = "battle=1000/1000/3600,message=1000/1000/60,frame=5000/5000/60"
    settings.ARENA_MAX_NEW_TOKENS = 12
    settings.ARENA_REPLIES_PER_NETWORK = 2 * 4  # The probe's sessions share one address: two networks' caps.
    settings.ARENA_ENGINE_SLOTS = 4  # A model plays once a battle: at most four of its replies at once.
    # The engines as the embedded arena runs them (arena_site.settings): its shapes, float16
    # caches, Gemma 3's embedding in bfloat16 (which changes Gemma 3's speed, what the pace hides).
    settings.ARENA_ENGINE_COMPACT = True
    settings.ARENA_ENGINE_CACHE_DTYPE = "float16"
    settings.ARENA_ENGINE_EMBEDDING_DTYPE = "bfloat16"
    services.import_tasks(PROBE_TASK)
    # The fixer on its base's queue: hosted beside it, as the embedded arena hosts every model (with
    # ARENA_FIXERS_AS_ADAPTERS, served by its base's engine).
    queues = [f"test-{run_id}.{name}" for name in BATTLE_PRESETS]
    return [
        registered_llm(path, queue) for path, queue in ((smollm2, queues[0]), (fixer, queues[0]), (gemma3, queues[1]))
    ]


async def test_timing_and_context_probes_name_no_pair_and_no_side_on_the_real_roster(
    connect_battle, celery_worker, settings, run_id, smollm2_preset, fixer_preset, gemma3_preset
) -> None:
    """Timing and context probes name neither the pair of a fresh anonymous battle nor the
    target's side better than chance plus 10 points; the battle probe names the pair of battles
    shown at a pace planted per pair; style names the models (the residual no pacing can hide)."""
    roster = await database_sync_to_async(real_roster)(smollm2_preset, fixer_preset, gemma3_preset, run_id, settings)
    names = [llm.name for llm in roster]
    assert TARGET in names
    rng = random.Random(7)
    # The voter chats with each model (which also measures each model's speed for the pace).
    direct = await play_many(
        connect_battle, [{"mode": "direct", "models": [name]} for name in names for _ in range(ROSTER_DIRECT)]
    )
    # Anonymous battles, one of each four played at once revealed (which one, at random).
    chosen = [rng.randrange(ROSTER_AT_ONCE) for _ in range(ROSTER_ANONYMOUS // ROSTER_AT_ONCE)]
    reveal = [at % ROSTER_AT_ONCE == chosen[at // ROSTER_AT_ONCE] for at in range(ROSTER_ANONYMOUS)]
    anonymous = await play_many(connect_battle, [{}] * ROSTER_ANONYMOUS, reveal=reveal)
    revealed = [battle for battle, shown in zip(anonymous, reveal, strict=True) if shown]
    fresh = [battle for battle, shown in zip(anonymous, reveal, strict=True) if not shown]
    truths = {
        battle.battle_id: await database_sync_to_async(models_of)(battle) for battle in [*direct, *revealed, *fresh]
    }
    known = await database_sync_to_async(published_texts)(Client())
    assert known == {}  # No text of a model in the arena on any public page or API response.
    assert all(battle.refused for battle in [*direct, *revealed, *fresh])  # The arena's limit, for all.

    # Timing: trained on the revealed anonymous battles, scored on the fresh ones.
    probe = TimingProbe(
        [(battle.features(side), truths[battle.battle_id][side]) for battle in revealed for side in ("a", "b")]
    )
    pairs = mean(pair_score(probe, battle, truths[battle.battle_id]) for battle in fresh)
    with_target = [battle for battle in fresh if TARGET in truths[battle.battle_id].values()]
    sides = mean(side_score(probe, battle, truths[battle.battle_id], TARGET) for battle in with_target)
    battle_probe = BattleProbe([labelled(battle, truths) for battle in revealed])
    battles = mean(battle_probe.score(battle, truths[battle.battle_id]) for battle in fresh)
    assert len(with_target) >= len(fresh) // 2
    assert pairs <= 1 / 3 + 0.10, pairs
    assert battles <= 1 / 3 + 0.10, battles
    assert sides <= 1 / 2 + 0.10, sides

    # The control: the same battles with a pace planted per pair, the battle probe trained and
    # scored as above.
    pairs_seen = sorted({frozenset(truths[battle.battle_id].values()) for battle in anonymous}, key=sorted)
    slower = {pair: PLANTED_SLOWER**index for index, pair in enumerate(pairs_seen)}
    paced = planted(anonymous, truths, slower)
    planted_probe = BattleProbe(
        [labelled(battle, truths) for battle, shown in zip(paced, reveal, strict=True) if shown]
    )
    control = mean(
        planted_probe.score(battle, truths[battle.battle_id])
        for battle, shown in zip(paced, reveal, strict=True)
        if not shown
    )
    assert control > 1 / 3 + 0.10, control

    # Style: every text the voter holds with its model's name (direct chats, its revealed battles).
    profiles: dict[str, Counter[str]] = {name: Counter() for name in names}
    for battle in [*direct, *revealed]:
        for side, timed in battle.sides.items():
            profiles[truths[battle.battle_id][side]] += trigrams(timed.text)
    styled = [
        style_names(battle, profiles) == (truths[battle.battle_id]["a"], truths[battle.battle_id]["b"])
        for battle in fresh
    ]
    # Style names both models and their sides far more often than chance (1 in 6): the residual
    # docs/security.md states, which the board's favour test (leaderboard/anomaly.py) answers.
    assert binomtest(sum(styled), len(styled), 1 / 6, alternative="greater").pvalue < 0.01, sum(styled)
    print(  # The figures docs/security.md quotes (pytest -s).
        f"real roster: timing gives the true pair {pairs:.3f} by sides and {battles:.3f} by battles (chance"
        f" 0.333), the target's side {sides:.3f} (chance 0.5, {len(with_target)} battles); a planted pace,"
        f" {control:.3f}; style names both sides of"
        f" {sum(styled)} of {len(styled)} (chance 1 in 6); the target's side less the other's, in"
        f" {paired_differences(anonymous, truths, TARGET)}"
    )
