"""Style control (leaderboard/style.py): the contextual Bradley-Terry fit, checked by simulation
and against LMArena's arena-rank; its toggle on the page and in the API; rate_battles."""

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from inference.models import LLM
from leaderboard import ratings, services, style
from votes import services as vote_services
from votes.models import Battle, Message, Vote

TRUE = np.array([0.0, 0.0, 50.0, -50.0, 100.0, -100.0])
LENGTH_EFFECT = 1.0  # Log-odds per unit of normalised length difference.


def verbose_arena(votes: int, seed: int, tie_share: float = 0.1) -> list[tuple[int, int, float, np.ndarray]]:
    """Six models; model 0 always writes 400 tokens, the others 100-300. Voters prefer longer
    replies by LENGTH_EFFECT and otherwise follow TRUE; ``tie_share`` ties, whatever the style."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(votes):
        a, b = rng.choice(TRUE.size, 2, replace=False)
        length_a = 400.0 if a == 0 else rng.uniform(100, 300)
        length_b = 400.0 if b == 0 else rng.uniform(100, 300)
        difference = style.differences((length_a, 0, 1, 0), (length_b, 0, 1, 0))
        logit = (TRUE[a] - TRUE[b]) * np.log(10.0) / 400.0 + LENGTH_EFFECT * difference[0]
        score = 0.5 if rng.random() < tie_share else float(rng.random() < 1.0 / (1.0 + np.exp(-logit)))
        out.append((int(a), int(b), score, difference))
    return out


def test_style_control_removes_what_verbosity_gained() -> None:
    votes = verbose_arena(20_000, seed=1, tie_share=0.0)  # Ties would dilute the effect (test_ratings).
    plain = ratings.sandwich_intervals(ratings.PairOutcomes.from_games(6, [(a, b, s) for a, b, s, _ in votes]))
    controlled = style.style_controlled(style.StyleOutcomes.from_votes(6, votes))
    truth = 1000.0 + TRUE - TRUE.mean()
    assert plain.ratings[0] - truth[0] > 25  # Verbosity bought the verbose model points...
    assert controlled.lower[0] <= truth[0] <= controlled.upper[0]  # ...which style control takes back.
    assert np.all(np.abs(controlled.ratings - truth) < 20)
    length = style.FEATURES.index("length")
    assert controlled.coefficient_lower[length] <= LENGTH_EFFECT <= controlled.coefficient_upper[length]


def test_cost_is_flat_in_the_number_of_votes() -> None:
    few = style.StyleOutcomes.from_votes(6, verbose_arena(2_000, seed=2))
    many = style.StyleOutcomes.from_votes(6, verbose_arena(40_000, seed=2))
    assert many.total == 40_000 and many.first.size < 3 * few.first.size  # Cells, not votes.


def few_styles(votes: int, seed: int) -> style.StyleOutcomes:
    """Votes whose replies come in three lengths: cells of many votes each."""
    rng = np.random.default_rng(seed)
    out = []
    for a, b, score, _ in verbose_arena(votes, seed):
        lengths = rng.choice([100.0, 200.0, 400.0], 2)
        out.append((a, b, score, style.differences((lengths[0], 0, 1, 0), (lengths[1], 0, 0, 0))))
    return style.StyleOutcomes.from_votes(6, out)


def varied_styles(votes: int, seed: int) -> style.StyleOutcomes:
    """Votes whose replies vary in length and in every markdown count: nearly a cell per vote."""
    rng = np.random.default_rng(seed)
    out = []
    for a, b, score, _ in verbose_arena(votes, seed):
        sides = np.column_stack([rng.integers(50, 800, 2), rng.integers(0, 6, (2, 3))]).astype(float)
        out.append((a, b, score, style.differences(sides[0], sides[1])))
    return style.StyleOutcomes.from_votes(6, out)


@pytest.mark.parametrize("kind", ["mostly a vote per cell", "many votes per cell"])
def test_bootstrap_rounds_land_on_their_own_maximum_likelihood(kind: str) -> None:
    """Each round's chord iterations end where a full Newton fit of that round's resampled
    votes ends (within the tolerance: 0.009 rating points), whether its entries draw Poisson(1)
    weights (one vote each) or Poisson(c)."""
    outcomes = varied_styles(3_000, 5) if kind == "mostly a vote per cell" else few_styles(3_000, 5)
    fit = style._fit(outcomes, ratings.default_prior(6))
    rounds = style._StyleRounds(fit)
    seed = np.random.SeedSequence(7)
    fitted = rounds.rounds(seed, 6)
    weights = rounds.weights(np.random.default_rng(seed), 6)[:, rounds.slot]
    share_of_single_votes = np.mean(rounds.counts == 1.0)
    assert share_of_single_votes > 0.5 if kind == "mostly a vote per cell" else share_of_single_votes < 0.25
    for index in range(6):
        assert not np.allclose(weights[index], rounds.counts)  # A resampling, not the votes.
        exact = rounds._full_fit(weights[index])
        np.testing.assert_allclose(fitted[index], exact, rtol=0, atol=style._StyleRounds.TOLERANCE)
        assert np.max(np.abs(fitted[index] - fit.params)) > 1e-3  # Rounds differ from the fit.


def test_rounds_not_converged_finish_with_full_newton(monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = few_styles(2_000, 6)
    rounds = style._StyleRounds(style._fit(outcomes, ratings.default_prior(6)))
    monkeypatch.setattr(style._StyleRounds, "CHORD_ITERATIONS", 1)
    seed = np.random.SeedSequence(8)
    fitted = rounds.rounds(seed, 3)
    weights = rounds.weights(np.random.default_rng(seed), 3)[:, rounds.slot]
    for index in range(3):
        np.testing.assert_allclose(fitted[index], rounds._full_fit(weights[index]), atol=1e-9)


def test_poisson_one_draws_follow_poisson_one() -> None:
    draws = style.poisson_one(np.random.default_rng(9), (4, 500_000))
    pmf = [np.exp(-1.0) / np.prod(np.arange(1, k + 1)) for k in range(7)]
    frequencies = np.bincount(draws.astype(int).ravel(), minlength=9)[:7] / draws.size
    np.testing.assert_allclose(frequencies, pmf, atol=0.002)
    assert draws.mean() == pytest.approx(1.0, abs=0.003) and draws.var() == pytest.approx(1.0, abs=0.005)
    assert draws.dtype == np.float32 and draws.max() <= 8


def test_bootstrap_intervals_agree_with_sandwich_intervals() -> None:
    """On 20,000 votes, bootstrap and sandwich intervals estimate the same spread: widths within
    15% for every rating and coefficient (the bootstrap's own Monte Carlo error, with 1000
    rounds, is about 5% of a width); the point estimates are the same fit."""
    outcomes = style.StyleOutcomes.from_votes(6, verbose_arena(20_000, seed=10))
    sandwich = style.style_controlled(outcomes)
    bootstrap = style.bootstrap_intervals(outcomes, rounds=1000, seed=3)
    np.testing.assert_allclose(bootstrap.ratings, sandwich.ratings)
    np.testing.assert_allclose(bootstrap.coefficients, sandwich.coefficients)
    np.testing.assert_allclose(bootstrap.upper - bootstrap.lower, sandwich.upper - sandwich.lower, rtol=0.15)
    informative = slice(0, 1)  # Length: the only feature that varies here besides "lists".
    np.testing.assert_allclose(
        (bootstrap.coefficient_upper - bootstrap.coefficient_lower)[informative],
        (sandwich.coefficient_upper - sandwich.coefficient_lower)[informative],
        rtol=0.15,
    )
    assert np.all(bootstrap.lower < bootstrap.ratings) and np.all(bootstrap.ratings < bootstrap.upper)
    again = style.bootstrap_intervals(outcomes, rounds=1000, seed=3, threads=1)
    np.testing.assert_array_equal(again.lower, bootstrap.lower)  # The seed decides, not the threads.
    nothing = style.bootstrap_intervals(style.StyleOutcomes.from_votes(6, []), rounds=10)
    np.testing.assert_array_equal(nothing.lower, nothing.ratings)


def test_markdown_counts_and_conv_metadata() -> None:
    text = "# Plan\n\n- one\n- two\n1. three\n\n**bold** and __also__"
    assert style.markdown_counts(text) == (1, 3, 2)
    meta = style.conv_metadata([(text, 30)], [("plain", 10)])
    assert meta == {
        "sum_assistant_a_tokens": 30,
        "header_count_a": 1,
        "list_count_a": 3,
        "bold_count_a": 2,
        "sum_assistant_b_tokens": 10,
        "header_count_b": 0,
        "list_count_b": 0,
        "bold_count_b": 0,
    }
    np.testing.assert_allclose(style.differences_from_metadata(meta), [0.5, 1.0, 1.0, 1.0])
    # LMArena's releases give counts per header level, list kind and bold marker.
    lmarena = {**meta, "header_count_a": {"h1": 1, "h2": 1}, "list_count_b": {"ordered": 0, "unordered": 1}}
    np.testing.assert_allclose(style.differences_from_metadata(lmarena), [0.5, 1.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="conv_metadata lacks sum_assistant_b_tokens"):
        style.differences_from_metadata({k: v for k, v in meta.items() if k != "sum_assistant_b_tokens"})


ARENA_RANK = """
import json, sys
import jax.numpy as jnp
from arena_rank.models.bradley_terry import BradleyTerry
from arena_rank.models.contextual_bradley_terry import ContextualBradleyTerry
from arena_rank.utils.data_utils import ContextualPairDataset, PairDataset
data = json.load(sys.stdin)
names = data["names"]
pairs = jnp.array(data["pairs"], dtype=jnp.int32)
outcomes = jnp.array(data["outcomes"], dtype=jnp.float64)
features = jnp.array(data["features"], dtype=jnp.float64)
ones = jnp.ones(len(data["outcomes"]), dtype=jnp.float64)
plain = BradleyTerry(len(names))
plain_data = PairDataset(names, pairs, outcomes, ones, ones, ones)
plain_result = plain.compute_ratings_and_cis(plain_data, ci_method="sandwich")
contextual = ContextualBradleyTerry(len(names), features.shape[1], reg=0.0)
contextual_data = ContextualPairDataset(names, pairs, outcomes, features, ones)
contextual_result = contextual.compute_ratings_and_cis(contextual_data, ci_method="sandwich")
print(json.dumps({
    key: {field: [float(x) for x in result[field]] for field in ("ratings", "rating_lower", "rating_upper")}
    | {"coeffs": [float(x) for x in result.get("coeffs", [])]}
    for key, result in (("plain", plain_result), ("contextual", contextual_result))
}))
"""


def test_agrees_with_lmarenas_arena_rank() -> None:
    """Plain and contextual Bradley-Terry within 0.1 rating points of arena-rank 0.1.1 on the same
    votes (unpenalised: no prior here, no regularisation there), sandwich intervals within 1%.
    arena-rank turns on 64-bit floats globally, so it runs in a process of its own."""
    votes = verbose_arena(6_000, seed=3)
    binned = style.StyleOutcomes.from_votes(6, votes)  # The cells' rounded differences, as data.
    rows = [
        (int(i), int(j), outcome, list(x))
        for i, j, x, wins_i, wins_j, ties in zip(
            binned.first,
            binned.second,
            binned.features,
            binned.first_wins,
            binned.second_wins,
            binned.ties,
            strict=True,
        )
        for outcome, count in ((1.0, wins_i), (0.0, wins_j), (0.5, ties))
        for _ in range(int(count))
    ]
    payload = {
        "names": [f"m{i}" for i in range(6)],
        "pairs": [[i, j] for i, j, _, _ in rows],
        "outcomes": [outcome for _, _, outcome, _ in rows],
        "features": [x for _, _, _, x in rows],
    }
    done = subprocess.run(
        [sys.executable, "-c", ARENA_RANK], input=json.dumps(payload), capture_output=True, text=True, check=True
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours_plain = ratings.sandwich_intervals(
        ratings.PairOutcomes.from_games(6, [(i, j, outcome) for i, j, outcome, _ in rows]), prior=0.0
    )
    ours_contextual = style.style_controlled(binned, prior=0.0)
    for ours, key in ((ours_plain, "plain"), (ours_contextual, "contextual")):
        np.testing.assert_allclose(ours.ratings, theirs[key]["ratings"], atol=0.1)
        width = np.array(theirs[key]["rating_upper"]) - np.array(theirs[key]["rating_lower"])
        np.testing.assert_allclose(ours.upper - ours.lower, width, rtol=0.01)
    np.testing.assert_allclose(ours_contextual.coefficients, theirs["contextual"]["coeffs"], atol=1e-3)


@pytest.mark.django_db
def test_the_overall_board_has_a_style_toggle(client) -> None:
    verbose, terse = (
        LLM.objects.create(name=n, family="gemma", preset=f"/p/{n}", context_tokens=2048) for n in ("verbose", "terse")
    )
    for index in range(6):
        battle = Battle.objects.create(model_a=verbose, model_b=terse, voter_key=f"v{index}", state="ended")
        long, short = "# Answer\n\n- **long** reply " * 5, "short"
        # Either model writes the long reply, so style and model are not confounded.
        for side, text in (("a", long if index % 2 else short), ("b", short if index % 2 else long)):
            Message.objects.create(battle=battle, side=side, turn=0, role="user", content="q")
            Message.objects.create(battle=battle, side=side, turn=0, role="assistant", content=text, token_count=None)
        Vote.objects.create(battle=battle, choice="a" if index < 4 else "b", stage="first_try")
    vote_services.record_seen_style(Vote.objects.all())
    snapshot = services.refresh_leaderboard(rounds=20).snapshots.get(category="overall")
    assert {row["model"] for row in snapshot.style_rows} == {"verbose", "terse"}
    assert set(snapshot.style_coefficients) == set(style.FEATURES)
    page = client.get("/leaderboard/", {"category": "overall", "style": "1"})
    assert page.context["styled"] and "Ratings at equal style" in page.content.decode()
    assert "Style control:" in client.get("/leaderboard/").content.decode()


@pytest.mark.django_db
def test_the_site_reads_each_votes_style_from_the_database() -> None:
    """A vote stores the style of each side's replies up to its turn (summed in the database
    when it is cast: markdown counted when each reply was saved; characters / 4 without a token
    count), and selectors.style_outcomes bins and counts them there: the cells are those of the
    replies' texts, styled one by one."""
    from leaderboard import selectors

    names = ["m0", "m1", "m2"]
    models = [LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}", context_tokens=2048) for name in names]
    rng = np.random.default_rng(3)
    texts = ["plain", "# Title\n\n- a\n- b", "**bold** and **more**", "1. one\n2. two\n\n## H"]
    expected = []
    for index in range(40):
        a, b = rng.choice(3, 2, replace=False)
        battle = Battle.objects.create(model_a=models[a], model_b=models[b], voter_key=f"v{index}", state="ended")
        seen = {"a": np.zeros(4), "b": np.zeros(4)}
        for turn in range(2):  # The vote is cast after turn 0: turn 1's replies are not counted.
            for side in "ab":
                text = texts[rng.integers(len(texts))] * int(rng.integers(1, 4))
                tokens = None if rng.random() < 0.3 else int(rng.integers(5, 200))
                Message.objects.create(battle=battle, side=side, turn=turn, role="user", content="q")
                Message.objects.create(
                    battle=battle, side=side, turn=turn, role="assistant", content=text, token_count=tokens
                )
                if turn == 0:
                    seen[side] += style.style_of(text, tokens)
        choice = ["a", "b", "tie"][rng.integers(3)]
        vote = Vote.objects.create(battle=battle, choice=choice, stage="first_try", after_turn=0)
        vote_services.record_seen_style(Vote.objects.filter(pk=vote.pk))
        expected.append((int(a), int(b), ratings.VOTE_SCORES[choice], style.differences(seen["a"], seen["b"])))
    got = selectors.style_outcomes(names)
    want = style.StyleOutcomes.from_votes(3, expected)
    for field in ("first", "second", "features", "first_wins", "second_wins", "ties"):
        np.testing.assert_allclose(getattr(got, field), getattr(want, field))


def test_rate_battles_with_style_control(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    records = []
    for index, (a, b, score, _) in enumerate(verbose_arena(3_000, seed=4)):
        long_a = a == 0 or (b != 0 and rng.random() < 0.5)
        meta = style.conv_metadata([("x", 400 if long_a else 150)], [("x", 150 if long_a else 400)])
        winner = {1.0: "model_a", 0.0: "model_b", 0.5: "tie"}[score]
        records.append(
            {"model_a": f"m{a}", "model_b": f"m{b}", "winner": winner, "tstamp": index, "conv_metadata": meta}
        )
    path = tmp_path / "battles.json"
    path.write_text(json.dumps(records))
    out = StringIO()
    call_command("rate_battles", str(path), "--style-control", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert {row["model"] for row in result["rows"]} == {f"m{i}" for i in range(6)}
    assert set(result["coefficients"]) == set(style.FEATURES)
    table = StringIO()
    call_command("rate_battles", str(path), "--style-control", "--rounds=200", stdout=table)
    assert "style-controlled, 95% bootstrap intervals" in table.getvalue()
    assert "style coefficient length" in table.getvalue()
    sandwich = StringIO()
    call_command("rate_battles", str(path), "--style-control", "--ci=sandwich", "--json", stdout=sandwich)
    by_sandwich = {row["model"]: row for row in json.loads(sandwich.getvalue())["rows"]}
    for row in result["rows"]:  # The same fit; intervals of about the same width.
        assert row["rating"] == by_sandwich[row["model"]]["rating"]
        width, sandwich_width = (
            row["upper"] - row["lower"],
            by_sandwich[row["model"]]["upper"] - by_sandwich[row["model"]]["lower"],
        )
        assert 0.75 * sandwich_width < width < 1.25 * sandwich_width
    del records[5]["conv_metadata"]
    path.write_text(json.dumps(records))
    with pytest.raises(CommandError, match=r"Battle 6: conv_metadata is not an object; --style-control needs it\."):
        call_command("rate_battles", str(path), "--style-control")


@pytest.mark.django_db
def test_a_cast_vote_stores_the_style_its_voter_had_seen() -> None:
    a, b = (
        LLM.objects.create(name=name, family="gemma", preset=f"/p/{name}", context_tokens=2048) for name in ("m0", "m1")
    )
    battle = Battle.objects.create(model_a=a, model_b=b, voter_key="v")
    replies = {("a", 0): ("# Plan\n\n- one\n- **two**", 30), ("b", 0): ("plain" * 8, None), ("a", 1): ("later", 5)}
    for (side, turn), (text, tokens) in replies.items():
        Message.objects.create(battle=battle, side=side, turn=turn, role="user", content="q")
        Message.objects.create(battle=battle, side=side, turn=turn, role="assistant", content=text, token_count=tokens)
    first = vote_services.cast_vote(battle=battle, choice="a")
    first.refresh_from_db()
    assert first.after_turn == 1  # Both of side A's replies had been seen, and side B's one.
    assert (first.seen_length_a, first.seen_headers_a, first.seen_lists_a, first.seen_bold_a) == (35.0, 1.0, 2.0, 1.0)
    assert (first.seen_length_b, first.seen_headers_b, first.seen_lists_b, first.seen_bold_b) == (10.0, 0.0, 0.0, 0.0)
