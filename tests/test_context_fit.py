"""Context limits do not tell the models apart.

The arena's own limit (inference.context_budget, ``ARENA_MAX_CONVERSATION_BYTES``): a prompt that
takes a side's conversation past it is refused before anything is stored, with the same message
whichever models play; anonymous battles draw only models whose context holds any conversation
within it and a whole reply, so no model's own limit is reached there. The review's probe (a
1,998-character prompt refused exactly when the 512-token demo model was in the pair) is replayed
against every pair and side order of the roster below. The limit's count bounds the tokens of
every template with every tokenizer the arena and its tests load, on adversarial texts.

A model's own limit, reached past the arena's only where a battle was given a model with a
shorter context (named and direct battles may pick any): the models' templates and tokenizers
differ, so a prompt of emoji can fit one model's context and not the other's; refused on one
side only, it would tell the voter which model sat there. votes.generation._both_sides_fit
refuses both sides alike; the last tests replay that probe against the real consumer and worker
with the two test models, whose tokenizers differ the same way.
"""

import itertools
import random
from pathlib import Path
from typing import Any

import keras_hub
import pytest
from channels.db import database_sync_to_async

from inference import chat_templates, context_budget, registry
from inference import services as inference_services
from inference.building.demo_models import SEQUENCE_LENGTH
from inference.hosts import engines
from inference.models import LLM
from tests.conftest import PRESETS_DIR, battle_llm_fields
from votes import generation, services
from votes.models import Battle, Message
from votes.selectors import GenerationContext

DB = pytest.mark.django_db(transaction=True)
# Every tokenizer the arena and its tests load: the tests' tiny presets, the bundled demo
# presets, and the imported real checkpoints (session fixtures).
TOKENIZERS = (
    *(PRESETS_DIR / name for name in ("tiny-gemma", "tiny-llama3")),
    *sorted(path for path in (Path(__file__).parents[1] / "inference" / "presets").iterdir() if path.is_dir()),
    "smollm2_preset",
    "gemma3_preset",
)
PIECES = (
    "\N{GRINNING FACE}",
    "\N{REGIONAL INDICATOR SYMBOL LETTER F}\N{REGIONAL INDICATOR SYMBOL LETTER R}",
    "\u6f22\u5b57",
    "\ufdfa",  # one character that NFKC normalisation would spell in 18
    "\u202e",
    "\u00e9",
    "a",
    " ",
    "  ",
    "\n",
    "\t",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "[INST]",
    "</s>",
    "<s>",
    "User:",
    "\nAssistant:",
)


def random_text(rng: random.Random, length: int) -> str:
    """Pieces no tokenizer merges well, markers of every template, and random code points."""
    parts = []
    for _ in range(length):
        if rng.random() < 0.2:
            point = rng.randrange(0x20, 0x30000)
            parts.append(chr(point) if not 0xD800 <= point < 0xE000 else "x")
        else:
            parts.append(rng.choice(PIECES))
    return "".join(parts)


def conversations(seed: int) -> list[tuple[str | None, list[str]]]:
    """System prompt (or none) and messages, user first and last: short and long, up to the arena's
    12 turns, with empty messages (a stopped reply) and one long message of emoji."""
    rng = random.Random(seed)
    cases: list[tuple[str | None, list[str]]] = [
        (None, [""]),
        (None, ["\N{GRINNING FACE}" * 470]),
        ("You add calendar entries.", ["", "", "a"]),
    ]
    for _ in range(40):
        messages = [random_text(rng, rng.randrange(0, 40)) for _ in range(2 * rng.randrange(0, 13) + 1)]
        system = random_text(rng, rng.randrange(1, 30)) if rng.random() < 0.5 else None
        cases.append((system, messages))
    return cases


@pytest.mark.parametrize("source", TOKENIZERS, ids=lambda source: Path(str(source)).name)
def test_the_arena_count_bounds_the_tokens_of_every_tokenizer(source: Path | str, request: Any) -> None:
    """However a conversation is written, its size as the arena counts it is at least its tokens
    with each model's template and tokenizer (a start token included): no model is given more
    than the arena accepted."""
    path = request.getfixturevalue(source) if isinstance(source, str) else source
    family = registry.read_preset(path).family
    tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(path))
    for system, messages in conversations(seed=len(str(path))):
        turns = [
            chat_templates.ChatTurn("user" if i % 2 == 0 else "assistant", text) for i, text in enumerate(messages)
        ]
        prompt = chat_templates.render_prompt(family, system, turns)
        tokens = len(tokenizer([prompt])[0]) + 1
        assert tokens <= context_budget.conversation_size(system, messages), (family, system, messages)


def llm_draws(count: int) -> set[str]:
    draws: set[str] = set()
    for _ in range(count):
        battle = services.start_battle(voter_key="draws")
        draws |= {battle.model_a.name, battle.model_b.name}
    return draws


@DB
def test_anonymous_battles_draw_only_models_that_hold_the_arenas_longest_conversation(
    demo_llms: list[LLM], run_id: str, admin_client: Any, settings: Any
) -> None:
    """A model with the demo presets' 512-token context, or an unknown one, is never drawn into an
    anonymous battle (a named one may still pick it); the admin says why."""
    short = LLM.objects.create(
        name="short",
        **{**battle_llm_fields("tiny-gemma", f"test-{run_id}.tiny-gemma"), "context_tokens": SEQUENCE_LENGTH},
    )
    unknown = LLM.objects.create(
        name="unknown", **{**battle_llm_fields("tiny-llama3", f"test-{run_id}.tiny-llama3"), "context_tokens": None}
    )
    assert llm_draws(40) == {llm.name for llm in demo_llms}
    named = services.start_battle(voter_key="draws", mode=Battle.Mode.NAMED, models=["short", "unknown"])
    assert (named.model_a, named.model_b) == (short, unknown)
    # Room for the arena's longest conversation and a whole reply: a shorter limit lets it in.
    settings.ARENA_MAX_CONVERSATION_BYTES = SEQUENCE_LENGTH - short.max_new_tokens
    assert llm_draws(40) == {llm.name for llm in demo_llms} | {"short"}
    settings.ARENA_MAX_CONVERSATION_BYTES += 1
    form = {
        **{field: getattr(short, field) for field in ("name", "family", "preset", "queue", "dtype", "mesh_shape")},
        **{field: getattr(short, field) for field in ("sampling_weight", "temperature", "top_k", "top_p")},
        "enabled": "on",
        "max_new_tokens": short.max_new_tokens,
        "max_reply_seconds": short.max_reply_seconds,
        "context_tokens": SEQUENCE_LENGTH,
    }
    response = admin_client.post(f"/admin/inference/llm/{short.pk}/change/", form, follow=True)
    warnings = [str(message) for message in response.context["messages"]]
    assert any("short has a 512-token context" in text and "not drawn" in text for text in warnings), warnings


def emoji_prompt(size: int) -> str:
    """A first prompt of emoji (4 bytes each, and up to 4 tokens) whose conversation is ``size``
    as the arena counts it."""
    empty = context_budget.conversation_size(None, [""])
    assert (size - empty) % 4 == 0
    text = "\N{GRINNING FACE}" * ((size - empty) // 4)
    assert context_budget.conversation_size(None, [text]) == size
    return text


async def receive_ends(client: Any, sides: int) -> list[dict[str, Any]]:
    ends: list[dict[str, Any]] = []
    while len(ends) < sides:
        frame = await client.receive()
        if frame["type"] == "end":
            ends.append(frame)
    return ends


@DB
async def test_the_same_prompts_are_refused_and_answered_with_every_pair(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    """The review's probe against the arena's limit: a first prompt one byte past it is refused,
    with the same message, in an anonymous battle and with every pair and order of the models
    (named) and each model alone (direct), and nothing is stored; a prompt right at the limit is
    answered in full on every side: no model's context is reached first. The workers correct a
    roster context that is wrong (a preset changed after it was registered): what anonymous
    battles are drawn by stays what the engines have."""
    await database_sync_to_async(LLM.objects.filter(pk=demo_llms[0].pk).update)(context_tokens=99_999)
    limit = settings.ARENA_MAX_CONVERSATION_BYTES
    at_limit = emoji_prompt(limit)
    names = [llm.name for llm in demo_llms]
    starts: list[dict[str, Any]] = [{"type": "start"}]
    starts += [{"type": "start", "mode": "named", "models": list(pair)} for pair in itertools.permutations(names)]
    starts += [{"type": "start", "mode": "direct", "models": [name]} for name in names]
    refusals = set()
    for start in starts:
        client = await connect_battle()
        await client.send(start)
        while (await client.receive())["type"] != "state":
            pass
        stored = await database_sync_to_async(Message.objects.count)()
        await client.send({"type": "prompt", "text": at_limit + "a"})
        refused = await client.receive()
        assert refused["type"] == "error" and refused["code"] == "conversation_too_long", refused
        refusals.add(refused["message"])
        assert await database_sync_to_async(Message.objects.count)() == stored
        await client.send({"type": "prompt", "text": at_limit})
        ends = await receive_ends(client, 1 if start.get("mode") == "direct" else 2)
        assert {frame["status"] for frame in ends} == {"done"}, ends
    assert len(refusals) == 1 and f"{limit + 1:,} of the {limit:,} bytes" in refusals.pop()
    contexts = LLM.objects.filter(pk__in=[llm.pk for llm in demo_llms]).values_list("context_tokens", flat=True)
    assert await database_sync_to_async(set)(contexts) == {2048}


def prompt_tokens(llm: LLM, text: str) -> tuple[int, int]:
    """The prompt's tokens in ``llm``'s context, and the most the worker lets it take."""
    engine = engines.engine_for(inference_services.model_spec(llm))
    prompt = chat_templates.render_prompt(llm.family, None, [chat_templates.ChatTurn(role="user", content=text)])
    return engine.prompt_tokens(prompt), engine.context_length - llm.max_new_tokens


def one_sided_prompt(llms: list[LLM]) -> tuple[str, LLM, LLM]:
    """The probe's prompt: emoji then a few a's, as many as fit the roomier model but not the
    other (the test models' templates differ by a token). Past the arena's limit: these tests
    raise it, as an operator who set it above a model's context would have."""
    for count, extra in itertools.product(range(490, 520), range(5)):
        text = "\N{GRINNING FACE}" * count + "a" * extra
        fits = {llm.name: tokens <= limit for llm in llms for tokens, limit in [prompt_tokens(llm, text)]}
        if sorted(fits.values()) == [False, True]:
            fitting = next(llm for llm in llms if fits[llm.name])
            outgrown = next(llm for llm in llms if not fits[llm.name])
            return text, fitting, outgrown
    raise AssertionError("no prompt fits one test model only: the probe needs tokenizers that differ")


async def battle_with(connect_battle: Any, models: list[str], text: str) -> list[dict[str, Any]]:
    client = await connect_battle()
    await client.send({"type": "start", "mode": "named", "models": models})
    while (await client.receive())["type"] != "state":
        pass
    await client.send({"type": "prompt", "text": text})
    return await client.receive_both_ends()


@DB
async def test_a_prompt_that_outgrows_one_model_is_refused_on_both_sides_alike(
    connect_battle, demo_llms, celery_worker, settings
) -> None:
    settings.ARENA_MAX_CONVERSATION_BYTES = 100_000
    text, fitting, outgrown = await database_sync_to_async(one_sided_prompt)(demo_llms)
    for models in ([fitting.name, outgrown.name], [outgrown.name, fitting.name]):  # either side
        frames = await battle_with(connect_battle, models, text)
        ends = [frame for frame in frames if frame["type"] == "end"]
        assert [(end["status"], end["error"], end["text"]) for end in ends] == [
            ("failed", generation.TOO_LONG, ""),
            ("failed", generation.TOO_LONG, ""),
        ]
        assert not [frame for frame in frames if frame["type"] == "delta"]  # neither model said a word
    replies = Message.objects.filter(role=Message.Role.ASSISTANT)
    assert await database_sync_to_async(lambda: {(m.status, m.content) for m in replies})() == {
        (Message.Status.FAILED, "")
    }


@DB
async def test_a_prompt_that_fits_both_is_answered_on_both(connect_battle, demo_llms, celery_worker, settings) -> None:
    settings.ARENA_MAX_CONVERSATION_BYTES = 100_000
    text, fitting, outgrown = await database_sync_to_async(one_sided_prompt)(demo_llms)
    shorter = text[10:]  # ten emoji fewer: within both contexts
    fits = [await database_sync_to_async(prompt_tokens)(llm, shorter) for llm in demo_llms]
    assert all(tokens <= limit for tokens, limit in fits)
    frames = await battle_with(connect_battle, [fitting.name, outgrown.name], shorter)
    assert sorted(frame["status"] for frame in frames if frame["type"] == "end") == ["done", "done"]


def context(message_id: int, partner_id: int | None) -> GenerationContext:
    return GenerationContext(
        message_id=message_id,
        battle_public_id="b",
        side="a",
        turn=0,
        model=None,  # type: ignore[arg-type]
        seed=0,
        system_prompt=None,
        conversation=[],
        pace_chars_per_s=None,
        partner_reply_id=partner_id,
    )


@DB
def test_each_side_waits_for_the_others_verdict(demo_llms) -> None:
    battle = services.start_battle(voter_key="fit")
    jobs = services.submit_prompt(battle=battle, text="Hello").jobs
    own, partner = (job.message_id for job in jobs)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the partner decides while this side waits
        slept.append(seconds)
        generation._both_sides_fit(context(partner, own), False)

    assert generation._both_sides_fit(context(own, partner), True, sleep=sleep) is False
    assert len(slept) == 1
    # The partner, deciding second, finds this side's verdict at once.
    assert generation._both_sides_fit(context(partner, own), True) is True
    # A one-sided turn (a correction) has no partner to wait for.
    assert generation._both_sides_fit(context(own, None), False) is False


@DB
def test_a_partner_that_ends_without_a_verdict_is_not_waited_for(demo_llms) -> None:
    battle = services.start_battle(voter_key="fit")
    own, partner = (job.message_id for job in services.submit_prompt(battle=battle, text="Hello").jobs)
    Message.objects.filter(pk=partner).update(status=Message.Status.STOPPED)
    assert generation._both_sides_fit(context(own, partner), True, sleep=pytest.fail) is True
    # Nor one that never comes: the hold's limit applies.
    Message.objects.filter(pk=partner).update(status=Message.Status.PENDING)
    clock = iter([0.0, 5.0, 1e9])
    assert generation._both_sides_fit(context(own, partner), True, clock=lambda: next(clock), sleep=lambda s: None)
