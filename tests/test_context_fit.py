"""Context limits are the same for both sides: a prompt that outgrows one model's context only is
refused on both sides, with one message, at the same moment, before either model sees it.

The review's probe: the models' templates and tokenizers differ, so a prompt of emoji can fit
one model's context and not the other's; refused on one side only, it told the voter which model
sat there. inference.services._both_sides_fit is the rule; these tests replay the probe against
the real consumer and worker with the two test models, whose tokenizers differ the same way.
"""

import itertools
from typing import Any

import pytest
from channels.db import database_sync_to_async

from inference import chat_templates, hosting
from inference import services as inference_services
from inference.models import LLM
from votes import services
from votes.models import Message
from votes.selectors import GenerationContext

pytestmark = pytest.mark.django_db(transaction=True)


def prompt_tokens(llm: LLM, text: str) -> tuple[int, int]:
    """The prompt's tokens in ``llm``'s context, and the most the worker lets it take."""
    engine = hosting.engine_for(inference_services.model_spec(llm))
    prompt = chat_templates.render_prompt(llm.family, None, [chat_templates.ChatTurn(role="user", content=text)])
    return engine.prompt_tokens(prompt), engine.context_length - llm.max_new_tokens


def one_sided_prompt(llms: list[LLM]) -> tuple[str, LLM, LLM]:
    """The probe's prompt: emoji then a few a's, as many as fit the roomier model but not the
    other (the test models' templates differ by a token)."""
    for count, extra in itertools.product(range(100, 130), range(5)):
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


async def test_a_prompt_that_outgrows_one_model_is_refused_on_both_sides_alike(
    connect_battle, demo_llms, celery_worker
) -> None:
    text, fitting, outgrown = await database_sync_to_async(one_sided_prompt)(demo_llms)
    for models in ([fitting.name, outgrown.name], [outgrown.name, fitting.name]):  # either side
        frames = await battle_with(connect_battle, models, text)
        ends = [frame for frame in frames if frame["type"] == "end"]
        assert [(end["status"], end["error"], end["text"]) for end in ends] == [
            ("failed", inference_services.TOO_LONG, ""),
            ("failed", inference_services.TOO_LONG, ""),
        ]
        assert not [frame for frame in frames if frame["type"] == "delta"]  # neither model said a word
    replies = Message.objects.filter(role=Message.Role.ASSISTANT)
    assert await database_sync_to_async(lambda: {(m.status, m.content) for m in replies})() == {
        (Message.Status.FAILED, "")
    }


async def test_a_prompt_that_fits_both_is_answered_on_both(connect_battle, demo_llms, celery_worker) -> None:
    text, fitting, outgrown = await database_sync_to_async(one_sided_prompt)(demo_llms)
    shorter = text[10:]  # ten emoji fewer: within both contexts
    assert all(tokens <= limit for tokens, limit in [prompt_tokens(llm, shorter) for llm in demo_llms])
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


def test_each_side_waits_for_the_others_verdict(db, demo_llms) -> None:
    battle = services.start_battle(voter_key="fit")
    jobs = services.submit_prompt(battle=battle, text="Hello").jobs
    own, partner = (job.message_id for job in jobs)
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the partner decides while this side waits
        slept.append(seconds)
        inference_services._both_sides_fit(context(partner, own), False)

    assert inference_services._both_sides_fit(context(own, partner), True, sleep=sleep) is False
    assert len(slept) == 1
    # The partner, deciding second, finds this side's verdict at once.
    assert inference_services._both_sides_fit(context(partner, own), True) is True
    # A one-sided turn (a correction) has no partner to wait for.
    assert inference_services._both_sides_fit(context(own, None), False) is False


def test_a_partner_that_ends_without_a_verdict_is_not_waited_for(db, demo_llms) -> None:
    battle = services.start_battle(voter_key="fit")
    own, partner = (job.message_id for job in services.submit_prompt(battle=battle, text="Hello").jobs)
    Message.objects.filter(pk=partner).update(status=Message.Status.STOPPED)
    assert inference_services._both_sides_fit(context(own, partner), True, sleep=pytest.fail) is True
    # Nor one that never comes: the hold's limit applies.
    Message.objects.filter(pk=partner).update(status=Message.Status.PENDING)
    clock = iter([0.0, 5.0, 1e9])
    assert inference_services._both_sides_fit(
        context(own, partner), True, clock=lambda: next(clock), sleep=lambda s: None
    )
