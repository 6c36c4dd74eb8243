"""Pair sampling for new battles (votes/pairing.py): admin weights, new-model boost, active sampling."""

import random
from collections import Counter

import pytest
from django.test import override_settings

from inference.models import LLM
from votes import services
from votes.apps import check_pair_sampling
from votes.models import Battle, Vote
from votes.pairing import Candidate, draw_pair, new_model_factor, pair_weights, uncertainty_reduction

DRAWS = 20_000


def frequencies(weights: dict[tuple[int, int], float], seed: int = 0) -> Counter[frozenset[int]]:
    rng = random.Random(seed)
    return Counter(frozenset(draw_pair(weights, rng)) for _ in range(DRAWS))


def test_a_model_never_meets_itself_and_sides_are_shuffled() -> None:
    weights = pair_weights([Candidate(1, 1.0), Candidate(2, 1.0), Candidate(3, 1.0)])
    assert set(weights) == {(1, 2), (1, 3), (2, 3)}
    rng = random.Random(1)
    draws = [draw_pair(weights, rng) for _ in range(3000)]
    assert all(a != b for a, b in draws)
    on_side_a = Counter(a for a, _ in draws)
    assert all(900 < on_side_a[m] < 1100 for m in (1, 2, 3)), on_side_a


def test_pairs_follow_the_admin_weights() -> None:
    # Weights 1, 1, 2: pair weights 1, 2, 2 -> probabilities 0.2, 0.4, 0.4.
    seen = frequencies(pair_weights([Candidate(1, 1.0), Candidate(2, 1.0), Candidate(3, 2.0)]))
    assert abs(seen[frozenset((1, 2))] / DRAWS - 0.2) < 0.015
    assert abs(seen[frozenset((1, 3))] / DRAWS - 0.4) < 0.015


def test_a_model_with_zero_weight_is_never_drawn() -> None:
    weights = pair_weights([Candidate(1, 1.0), Candidate(2, 0.0), Candidate(3, 1.0)])
    assert set(weights) == {(1, 3)}
    with pytest.raises(ValueError, match="No pair"):
        draw_pair(pair_weights([Candidate(1, 1.0), Candidate(2, 0.0)]), random.Random(0))


def test_a_new_model_is_boosted_until_it_has_its_battles() -> None:
    assert new_model_factor(0, boost=1.0, settle_battles=50) == 2.0
    assert new_model_factor(25, boost=1.0, settle_battles=50) == 1.5
    assert new_model_factor(80, boost=1.0, settle_battles=50) == 1.0
    candidates = [Candidate(1, 1.0, battles=500), Candidate(2, 1.0, battles=500), Candidate(3, 1.0, battles=0)]
    boosted = pair_weights(candidates, new_model_boost=1.0, new_model_battles=50)
    seen = frequencies(boosted)
    # Pairs with the newcomer weigh 2, the old pair 1: the newcomer is in 80 % of battles.
    share = (seen[frozenset((1, 3))] + seen[frozenset((2, 3))]) / DRAWS
    assert abs(share - 0.8) < 0.015


def test_active_sampling_favours_the_least_certain_pair() -> None:
    assert uncertainty_reduction(0, 0.5) > uncertainty_reduction(1, 0.5) > uncertainty_reduction(100, 0.5)
    assert uncertainty_reduction(10, 0.5) > uncertainty_reduction(10, 0.95)  # A lopsided pair is known.
    candidates = [Candidate(1, 1.0, rating=1000), Candidate(2, 1.0, rating=1010), Candidate(3, 1.0, rating=1400)]
    votes = {frozenset((1, 2)): 400, frozenset((1, 3)): 5, frozenset((2, 3)): 5}
    weights = pair_weights(candidates, policy="active", pair_votes=votes)
    assert weights[(1, 3)] > 3 * weights[(1, 2)]
    # Never compared at all beats everything.
    weights = pair_weights(candidates, policy="active", pair_votes={frozenset((1, 2)): 5, frozenset((1, 3)): 5})
    assert max(weights, key=weights.get) == (2, 3)


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown pair sampling policy"):
        pair_weights([Candidate(1, 1.0), Candidate(2, 1.0)], policy="round-robin")
    with override_settings(ARENA_PAIR_SAMPLING="round-robin"):
        (error,) = check_pair_sampling()
    assert error.id == "votes.E002"


@pytest.mark.django_db
@pytest.mark.parametrize("policy", ["weighted", "active"])
def test_battles_are_drawn_by_the_configured_policy(policy: str) -> None:
    models = [
        LLM.objects.create(name=f"m{i}", family="gemma", preset=f"p{i}", queue=f"q{i}", context_tokens=2048)
        for i in range(3)
    ]
    LLM.objects.filter(pk=models[2].pk).update(enabled=False)
    with override_settings(ARENA_PAIR_SAMPLING=policy):
        rng = random.Random(3)
        battles = [services.start_battle(voter_key="voter", rng=rng) for _ in range(30)]
        for battle in battles[:10]:
            Vote.objects.create(battle=battle, choice="a", stage=Vote.Stage.FIRST_TRY)
        more = [services.start_battle(voter_key="voter", rng=rng) for _ in range(10)]
    for battle in battles + more:  # Only the two enabled models, never against itself.
        assert {battle.model_a_id, battle.model_b_id} == {models[0].pk, models[1].pk}
    assert Battle.objects.count() == 40


@pytest.mark.django_db
def test_a_greedy_model_is_never_drawn_for_an_anonymous_battle() -> None:
    """A greedy model's replies are a lookup table (the same prompt, the same reply): the probe
    named it from them. However greedy (temperature 0, top-k 1, top-p 0), it is never drawn for
    an anonymous battle, under either policy; a named or direct battle may still pick it. With
    fewer than two sampling models, an anonymous battle is refused with the no_models error."""
    sampling = [LLM.objects.create(name=f"s{i}", family="gemma", preset=f"s{i}", context_tokens=2048) for i in range(2)]
    greedy = [
        LLM.objects.create(name="t0", family="gemma", preset="t0", temperature=0.0, context_tokens=2048),
        LLM.objects.create(name="k1", family="gemma", preset="k1", top_k=1, context_tokens=2048),
        LLM.objects.create(name="p0", family="gemma", preset="p0", top_p=0.0, context_tokens=2048),
    ]
    assert all(llm.samples for llm in sampling) and not any(llm.samples for llm in greedy)
    rng = random.Random(5)
    for policy in ("weighted", "active"):
        with override_settings(ARENA_PAIR_SAMPLING=policy, ARENA_NEW_MODEL_BOOST=5.0):
            drawn = {
                frozenset((battle.model_a_id, battle.model_b_id))
                for battle in (services.start_battle(voter_key="voter", rng=rng) for _ in range(60))
            }
        assert drawn == {frozenset(llm.pk for llm in sampling)}, policy
    named = services.start_battle(voter_key="voter", mode=Battle.Mode.NAMED, models=["t0", "s0"])
    assert named.model_a_id == greedy[0].pk and named.excluded
    direct = services.start_battle(voter_key="voter", mode=Battle.Mode.DIRECT, models=["k1"])
    assert direct.model_a_id == greedy[1].pk
    LLM.objects.filter(pk=sampling[1].pk).update(temperature=0.0)
    with pytest.raises(services.ArenaError) as refused:
        services.start_battle(voter_key="voter", rng=rng)
    assert refused.value.code == "no_models" and "sample" in str(refused.value)


@pytest.mark.django_db
def test_the_admin_says_why_a_greedy_model_is_not_in_anonymous_battles(admin_client) -> None:
    """The roster list shows which models anonymous battles may draw; saving a greedy model warns
    why it is left out, and the temperature field's help says so."""
    form = {
        "name": "greedy-one",
        "family": "gemma",
        "preset": "p",
        "queue": "",
        "enabled": "on",
        "sampling_weight": "1",
        "dtype": "",
        "mesh_shape": "",
        "temperature": "0",
        "top_k": "0",
        "top_p": "1",
        "max_new_tokens": "96",
        "max_reply_seconds": "60",
    }
    response = admin_client.post("/admin/inference/llm/add/", form, follow=True)
    assert response.status_code == 200
    warnings = [str(message) for message in response.context["messages"]]
    assert any(
        "greedy-one decodes greedily" in text and "never drawn into anonymous battles" in text for text in warnings
    )
    listing = admin_client.get("/admin/inference/llm/").content.decode()
    assert "In anonymous battles" in listing and 'alt="False"' in listing
    assert "never drawn into anonymous battles" in admin_client.get("/admin/inference/llm/add/").content.decode()
