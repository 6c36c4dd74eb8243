"""A voter acts on a side as soon as that side is done: rates it, corrects it (a prompt to it
alone) and regenerates it while the other side still writes; only what needs both sides (a
prompt to both, a vote, the end) waits for both. The services on PostgreSQL; the page, which
says why a control is disabled before it is pressed, in chromium (tests/test_browser.py)."""

from typing import Any

import pytest

from tests.conftest import answer_prompt, finish_as_worker
from votes import services
from votes.models import Battle, Message

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_finished_side_is_rated_and_corrected_while_the_other_writes(demo_llms: list[Any]) -> None:
    battle = services.start_battle(voter_key="voter")
    answer_prompt(battle)
    services.cast_vote(battle=battle, choice="tie")
    jobs = services.submit_prompt(battle=battle, text="And one with Ann on Nov 12 at 9AM").jobs
    by_side = {Message.objects.get(pk=job.message_id).side: job.message_id for job in jobs}
    finish_as_worker(by_side["a"], "action.add(ann)")  # B still writes.

    rated = services.rate_reply(battle=battle, side="a", turn=1, rating="mistake")
    assert rated.rating == "mistake"
    correction = services.submit_prompt(battle=battle, text="It is at 9AM, not 9PM.", side="a")
    assert correction.side == "a" and correction.corrects == ("a",) and correction.turn == 2
    # What B is writing is untouched, and B cannot be sent to, nor both, until B is done.
    assert Message.objects.get(pk=by_side["b"]).status == Message.Status.PENDING
    finish_as_worker(correction.jobs[0].message_id, "action.add(ann, 9AM)")
    with pytest.raises(services.ArenaError) as refused:
        services.submit_prompt(battle=battle, text="Try again.", side="b")
    assert refused.value.code == "busy" and "B's reply is finished" in str(refused.value)
    with pytest.raises(services.ArenaError) as refused:
        services.submit_prompt(battle=battle, text="Both of you.")
    assert refused.value.code == "busy" and "corrected (sent to alone) already" in str(refused.value)
    regenerated = services.regenerate_reply(battle=battle, side="a")
    assert regenerated.turn == 2
    with pytest.raises(services.ArenaError) as refused:
        services.cast_vote(battle=battle, choice="a")
    assert refused.value.code == "not_ready"
    # B done: everything opens again.
    finish_as_worker(by_side["b"], "action.add(ann)")
    finish_as_worker(regenerated.job.message_id, "action.add(ann, 9AM)")
    services.rate_reply(battle=battle, side="a", turn=2, rating="fixed")
    assert services.cast_vote(battle=battle, choice="a").stage == "after_fix"
    services.end_battle(battle=battle)
    services.record_fix_episodes(battle_ids=[battle.pk])
    assert Battle.objects.get(pk=battle.pk).fix_episodes.count() == 1


def test_the_first_try_still_waits_for_both(demo_llms: list[Any]) -> None:
    """The first-try vote compares both first replies, so the first correction waits for it."""
    battle = services.start_battle(voter_key="voter")
    jobs = services.submit_prompt(battle=battle, text="Add a meeting with Fred on Nov 11 at 5PM").jobs
    finish_as_worker(jobs[0].message_id, "action.add(fred)")
    side = Message.objects.get(pk=jobs[0].message_id).side
    with pytest.raises(services.ArenaError) as refused:
        services.submit_prompt(battle=battle, text="Wrong time.", side=side)
    assert refused.value.code == "vote_first"
