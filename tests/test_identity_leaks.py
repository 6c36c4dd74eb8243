"""Identity leaks: a reply naming a model, a family or a maker excludes the battle's votes."""

import pytest

from leaderboard.selectors import counted_votes, excluded_votes
from tests.conftest import answer_prompt
from votes import services
from votes.leaks import find_identity_leak
from votes.models import Battle, Message


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        ("As a Gemma model, I can't do that.", "Gemma"),
        ("I was trained by Google DeepMind.", "Google"),
        ("I'm LLaMA-3, here to help", "LLaMA"),
        ("mistral here", "mistral"),
        ("Built by Meta AI.", "Meta AI"),
        ("I am tiny-gemma.", "tiny-gemma"),  # The battle's own roster name, whole.
        ('action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)', None),
        ("The metadata says 'geMMArk'.", None),  # Words that merely contain a name are fine.
    ],
)
def test_find_identity_leak(text: str, leak: str | None) -> None:
    assert find_identity_leak(text, ["tiny-gemma", "tiny-llama3"]) == leak


@pytest.mark.django_db
def test_leaking_reply_excludes_the_battle_from_the_leaderboard(demo_llms) -> None:
    def play(texts: dict[str, str]) -> Battle:
        battle = services.start_battle(voter_key="k")
        answer_prompt(battle, "Who are you?", replies=lambda reply: texts[reply.side])
        services.cast_vote(battle=battle, choice="a")
        battle.refresh_from_db()
        return battle

    clean = play({"a": "I am a calendar assistant.", "b": "Hello."})
    leaky = play({"a": "Hello.", "b": "I am Llama, made by Meta AI."})
    # The reason is shown to the voter only once the battle has ended (it would name the model).
    from votes.selectors import battle_state

    assert battle_state(leaky)["excluded"] is None
    for battle in (clean, leaky):
        services.end_battle(battle=battle)
        battle.refresh_from_db()
    assert battle_state(leaky)["excluded"] == leaky.excluded_reason

    assert not clean.excluded
    assert leaky.excluded
    assert leaky.excluded_reason == "the reply of side B at turn 1 names 'Llama'"
    assert Message.objects.get(battle=leaky, side="b", role="assistant").identity_leak == "Llama"
    # The votes are kept, but only the clean battle's counts.
    assert leaky.votes.count() == 1
    assert list(counted_votes().values_list("battle", flat=True)) == [clean.pk]
    assert excluded_votes() == {"identity leak": 1, "flagged voter": 0, "over daily cap": 0, "unfinished battle": 0}
