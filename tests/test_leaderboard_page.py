"""The leaderboard: votes reduced per category, snapshots refreshed (by beat, or when due), pages."""

import math

import pytest
from django.conf import settings

from inference.models import LLM
from leaderboard import charts, selectors, services, wording
from leaderboard.models import LeaderboardRefresh
from leaderboard.templatetags import board
from votes import services as voter_services
from votes.models import Battle, FlaggedVoter, Message, Task, Vote

pytestmark = pytest.mark.django_db


def add_turns(battle: Battle, side: str, turns: list[tuple[str, str | None]]) -> None:
    """Replies on one side, each rated, each followed by the next prompt to that side (None: none)."""
    for turn, (rating, next_prompt) in enumerate(turns):
        Message.objects.create(battle=battle, side=side, turn=turn, role="assistant", rating=rating)
        if next_prompt is not None:
            Message.objects.create(battle=battle, side=side, turn=turn + 1, role="user", content=next_prompt)


def make_battle(model_a: LLM, model_b: LLM, first: str, after_fix: str | None = None, **fields) -> Battle:
    battle = Battle.objects.create(
        model_a=model_a,
        model_b=model_b,
        voter_key=fields.pop("voter_key", "k"),
        state=fields.pop("state", Battle.State.ENDED),
        **fields,
    )
    Vote.objects.create(battle=battle, choice=first, stage=Vote.Stage.FIRST_TRY)
    if after_fix:
        Vote.objects.create(battle=battle, choice=after_fix, stage=Vote.Stage.AFTER_FIX, after_turn=1)
    return battle


@pytest.fixture
def models() -> tuple[LLM, LLM, LLM]:
    return tuple(
        LLM.objects.create(name=name, family="gemma", preset=f"/presets/{name}", context_tokens=2048)
        for name in ("strong", "weak", "idle")
    )


def test_leaderboard_ranks_by_votes_with_intervals(client, models) -> None:
    strong, weak, _idle = models
    for _ in range(4):
        make_battle(strong, weak, "a")
    make_battle(weak, strong, "b")
    make_battle(weak, strong, "tie")

    response = client.get("/leaderboard/")
    assert response.status_code == 200
    rows = response.context["snapshot"].rows
    assert [row["model"] for row in rows] == ["strong", "weak"]  # "idle" has no vote: not rated.
    assert [row["votes"] for row in rows] == [6, 6]
    assert rows[0]["rating"] > 1000 > rows[1]["rating"]
    assert rows[0]["elo"] > rows[1]["elo"]
    assert all(row["lower"] <= row["rating"] <= row["upper"] for row in rows)
    assert all(row["provisional"] for row in rows)  # Fewer than LEADERBOARD_PROVISIONAL_VOTES.
    html = response.content.decode()
    assert html.index("strong") < html.index("weak")
    assert "<svg" in html and "Win fraction" in html


def test_categories_count_the_right_votes_and_say_what_is_left_out(client, models) -> None:
    strong, weak, _idle = models
    task = Task.objects.create(slug="t", title="T", category="API calls")
    corrected = make_battle(strong, weak, "b", after_fix="a", task=task)  # Fixed after the correction.
    add_turns(corrected, "a", [("mistake", "The year is wrong."), ("fixed", None)])
    follow_up = make_battle(strong, weak, "a", after_fix="b")  # A later vote, but nothing was wrong.
    add_turns(follow_up, "a", [("correct", "And tomorrow?"), ("correct", None)])
    make_battle(strong, weak, "a", excluded=True, excluded_reason="leak")
    make_battle(strong, weak, "a", state=Battle.State.ACTIVE)
    flagged = make_battle(strong, weak, "b")
    flagged.voter_key = "troll"
    flagged.save()
    FlaggedVoter.objects.create(voter_key="troll", reason="spam")
    voter_services.record_fix_episodes()
    keys = [key for key, _ in selectors.categories()]
    assert keys == ["overall", "fixing", "after_correction", "task:API calls"]
    # Overall and task boards: each battle's first-try vote (both sides untouched).
    assert [v.choice for v in selectors.counted_votes("overall").order_by("pk")] == ["b", "a"]
    assert [v.choice for v in selectors.counted_votes("task:API calls")] == ["b"]
    # After correction: only the battle where a wrong reply was corrected before the vote.
    assert [v.choice for v in selectors.counted_votes("after_correction")] == ["a"]
    assert selectors.excluded_votes("overall") == {
        "identity leak": 1,
        "flagged voter": 1,
        "over daily cap": 0,
        "unfinished battle": 1,
    }
    # The refresh's one-pass readings agree with the per-category queries.
    tally = selectors.vote_tally(["strong", "weak", "idle"])
    for key in keys:
        if key != "fixing":
            assert sum(map(sum, tally.boards[key].cells.values())) == selectors.counted_votes(key).count()
    assert tally.excluded("overall") == {
        "identity leak": 1,
        "flagged voter": 1,
        "over daily cap": 0,
        "unfinished battle": 1,
    }
    nothing = {"identity leak": 0, "flagged voter": 0, "over daily cap": 0, "unfinished battle": 0}
    assert selectors.excluded_votes("task:API calls") == nothing

    page = client.get("/leaderboard/", {"category": "after_correction"})
    assert page.context["snapshot"].votes == 1
    fixing = client.get("/leaderboard/", {"category": "fixing"})
    assert fixing.context["snapshot"].votes == 1  # One fix episode.
    assert [row["model"] for row in fixing.context["snapshot"].rows] == ["strong"]
    assert "fix episode" in fixing.content.decode()
    assert client.get("/leaderboard/", {"category": "nope"}).status_code == 404


def test_fix_rates_by_voters_and_checker(models) -> None:
    # From the stored fix episodes: each judge's own verdicts, a fixed reply rated ✓ counted as
    # fixed, and a reply after a correct one (no mistake to fix) not counted at all.
    strong, weak, idle = models
    battle = make_battle(strong, weak, "a", after_fix="a")
    replies = [  # Turn 0 to both sides; then a correction to A alone, then one to B alone.
        ("a", 0, "mistake", "mistake"),
        ("a", 1, "fixed", "correct"),
        ("b", 0, "garbage", "garbage"),
        ("b", 2, "correct", "mistake"),
    ]
    for side, turn, rating, verdict in replies:
        Message.objects.create(battle=battle, side=side, turn=turn, role="user", content="Wrong.")
        Message.objects.create(
            battle=battle, side=side, turn=turn, role="assistant", rating=rating, check_verdict=verdict
        )
    untouched = make_battle(idle, weak, "a")
    for turn, rating in ((0, "correct"), (1, "mistake")):
        Message.objects.create(battle=untouched, side="a", turn=turn, role="user", content="Next question.")
        Message.objects.create(battle=untouched, side="a", turn=turn, role="assistant", rating=rating)
    voter_services.record_fix_episodes()
    rates = selectors.fix_rates(["strong", "weak", "idle"])
    assert (rates["strong"]["voters"].fixed, rates["strong"]["voters"].corrections) == (1, 1)
    assert (rates["strong"]["checker"].fixed, rates["strong"]["checker"].corrections) == (1, 1)
    assert (rates["weak"]["voters"].fixed, rates["weak"]["voters"].corrections) == (1, 1)
    assert (rates["weak"]["checker"].fixed, rates["weak"]["checker"].corrections) == (0, 1)
    assert rates["idle"]["voters"].rate is None and rates["idle"]["checker"].corrections == 0


def test_snapshots_refresh_when_due_and_stay_viewable(client, models, settings) -> None:
    strong, weak, _idle = models
    make_battle(strong, weak, "a")
    first = services.refresh_leaderboard(rounds=50)
    assert services.refresh_if_due() is None  # No new vote.
    settings.LEADERBOARD_REFRESH_VOTES = 2
    make_battle(strong, weak, "b")
    assert services.refresh_if_due() is None  # One new vote, and the last refresh is recent.
    make_battle(strong, weak, "b")
    second = services.refresh_if_due()
    assert second is not None and second.pk != first.pk
    assert LeaderboardRefresh.objects.count() == 2
    old = client.get("/leaderboard/", {"refresh": first.pk})
    assert old.context["snapshot"].votes == 1 and not old.context["latest"]
    assert client.get("/leaderboard/", {"refresh": "999999"}).status_code == 404
    assert client.get("/leaderboard/", {"refresh": "x"}).status_code == 404


def test_beat_runs_the_refresh_every_minute() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["refresh-leaderboard"]
    assert entry["task"] == "leaderboard.refresh_if_due" and entry["schedule"] == 60.0
    from arena_site.celery import app

    app.loader.import_default_modules()
    assert "leaderboard.refresh_if_due" in app.tasks


def test_empty_leaderboard(client) -> None:
    response = client.get("/leaderboard/")
    assert response.status_code == 200
    assert "No model has a vote in this category yet" in response.content.decode()


def test_elo_is_maintained_incrementally_and_equals_a_full_replay(models) -> None:
    from datetime import timedelta

    from django.utils import timezone

    strong, weak, idle = models
    now = timezone.now()
    results = ["a", "b", "a", "tie", "a", "a", "b", "a"]

    def play(index: int, choice: str) -> None:
        pair = (strong, weak) if index % 2 else (idle, strong)
        battle = make_battle(*pair, choice)
        Battle.objects.filter(pk=battle.pk).update(ended=now + timedelta(seconds=index))

    for index, choice in enumerate(results[:4]):
        play(index, choice)
    services.refresh_leaderboard(rounds=10)
    for index, choice in enumerate(results[4:], start=4):
        play(index, choice)
    incremental = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    assert incremental.elo_through_vote == Vote.objects.order_by("-pk").first().pk

    LeaderboardRefresh.objects.all().delete()
    replayed = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    assert incremental.elo_state == pytest.approx(replayed.elo_state)
    assert incremental.elo_state != {"strong": 1000.0, "weak": 1000.0, "idle": 1000.0}


def test_elo_starts_again_when_a_voter_is_flagged_after_a_refresh(models) -> None:
    strong, weak, _idle = models
    for choice in ("a", "a", "b", "a"):
        make_battle(strong, weak, choice)
    for choice in ("b", "b", "b"):  # Another voter, flagged after the first refresh.
        make_battle(strong, weak, choice, voter_key="late-flag")
    first = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    FlaggedVoter.objects.create(voter_key="late-flag", reason="found by an admin")
    again = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    assert again.elo_votes == 4 and first.elo_votes == 7
    LeaderboardRefresh.objects.all().delete()
    replayed = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    assert again.elo_state == pytest.approx(replayed.elo_state)
    assert again.elo_state != pytest.approx(first.elo_state)
    # Clearing the flag lets the votes back in: Elo starts again from all seven.
    FlaggedVoter.objects.filter(voter_key="late-flag").update(cleared=True)
    cleared = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    assert cleared.elo_votes == 7


def test_a_model_without_votes_is_not_yet_rated_and_never_ranked(client, models) -> None:
    strong, weak, _idle = models
    for choice in ("a", "b", "a"):
        make_battle(strong, weak, choice)
    snapshot = services.refresh_leaderboard(rounds=20).snapshots.get(category="overall")
    assert [row["model"] for row in snapshot.rows] == ["strong", "weak"]
    assert snapshot.unrated == ["idle"]
    assert snapshot.model_names == ["strong", "weak"]  # The matrices: rated models, in rank order.
    page = client.get("/leaderboard/").content.decode()
    assert "Not yet rated (no vote in this category, so no rank):\nidle." in page
    assert "<td>idle" not in page


def test_admin_flags_the_voters_of_battles(client, models) -> None:
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("admin", "a@example.org", "pw"))
    strong, weak, _idle = models
    battle = make_battle(strong, weak, "a")
    assert selectors.counted_votes().count() == 1
    client.post("/admin/votes/battle/", {"action": "flag_voters", "_selected_action": [battle.pk]})
    assert FlaggedVoter.objects.get().voter_key == battle.voter_key
    assert selectors.counted_votes().count() == 0
    assert selectors.excluded_votes()["flagged voter"] == 1


def test_a_base_model_is_labelled_as_such(client, models) -> None:
    strong, weak, _idle = models
    LLM.objects.filter(pk=weak.pk).update(base=True)
    make_battle(strong, weak, "a")
    html = client.get("/leaderboard/").content.decode()
    row = next(line for line in html.splitlines() if "<td>weak" in line)
    assert "(base)" in row
    assert "(base)" not in next(line for line in html.splitlines() if "<td>strong" in line)


def test_the_page_says_what_the_numbers_mean(client, models, settings) -> None:
    from leaderboard.ratings import expected_score

    strong, weak, _idle = models
    make_battle(strong, weak, "a")
    html = client.get("/leaderboard/").content.decode()
    # The figures the text gives are the rating model's own.
    assert f"about {expected_score(1100, 1000):.0%}" in html and f"400 points, {expected_score(1400, 1000):.0%}" in html
    assert "95 times out of 100" in html
    assert f"fewer\nthan {settings.LEADERBOARD_PROVISIONAL_VOTES} votes is <strong>provisional</strong>" in html
    # Next to each category: the fixing board (its figure is its model's own: 400 points, ten
    # times the odds) and the preference after correction.
    from leaderboard.fixing import _TO_RATING

    fixing = client.get("/leaderboard/", {"category": "fixing"}).content.decode()
    assert math.exp(400 / _TO_RATING) == pytest.approx(10.0)
    assert "ten times its odds" in fixing and "95 times out of 100" in fixing
    assert f"fewer than\n{settings.LEADERBOARD_PROVISIONAL_VOTES} episodes is <strong>provisional</strong>" in fixing
    after = client.get("/leaderboard/", {"category": "after_correction"}).content.decode()
    assert "a preference, not a measure of fixing" in after and "95 times out of" in after
    assert f"fewer than {settings.LEADERBOARD_PROVISIONAL_VOTES} votes is <strong>provisional</strong>" in after


def test_the_page_says_when_votes_appear_and_that_elo_is_secondary(client, models, settings) -> None:
    settings.LEADERBOARD_REFRESH_SECONDS = 300
    settings.LEADERBOARD_REFRESH_VOTES = 50
    strong, weak, _idle = models
    make_battle(strong, weak, "a")
    html = client.get("/leaderboard/").content.decode()
    assert "A vote counts once its battle has ended" in html
    assert "every 5 minutes, or\nas soon as 50 new votes" in html
    assert '<th class="more secondary">Online Elo (secondary)</th>' in html
    assert "Go by the <strong>rating</strong>" in html
    # How fragile the order is: the top row's votes to swap with the one below, the last row none.
    snapshot = services.refresh_leaderboard(rounds=10).snapshots.get(category="overall")
    top, last = snapshot.rows
    assert top["swap_votes"] >= 1 and last["swap_votes"] is None
    html = client.get("/leaderboard/").content.decode()
    votes = "votes" if top["swap_votes"] > 1 else "vote"
    assert f"{top['swap_votes']} <small>{votes} from swapping with {last['model']}</small>" in html
    assert "<strong>votes to swap</strong>" in html
    # Phones: each row also carries its other columns, one tap away.
    assert html.count('<details class="row-more">') == 2
    assert "it ends by itself 15 minutes after the voter's last action" in html
    # The board's one primary figure, its leader's rating with its interval, in words.
    assert '<p class="headline"><strong>In plain words:</strong> ' in html


def row(model: str, rank: int, rating: float, lower: float, upper: float, provisional: bool = False) -> dict:
    return {"model": model, "rank": rank, "rating": rating, "lower": lower, "upper": upper, "provisional": provisional}


def test_the_headline_says_who_leads_and_how_sure_that_is() -> None:
    clear = [row("gemma", 1, 1100.4, 1060, 1140), row("llama", 2, 950, 910, 990)]
    assert wording.headline(clear, measure="rating", evidence="votes") == (
        "gemma leads with a rating of 1100 (95% interval 1060 to 1140): the votes so far put it clearly above "
        "every other model."
    )
    shared = [row("gemma", 1, 1010, 950, 1070), row("llama", 1, 990, 930, 1050, True), row("x", 3, 800, 760, 840)]
    assert wording.headline(shared, measure="fix-ability", evidence="fix episodes") == (
        "gemma and llama share first place: their intervals overlap, so the fix episodes so far cannot tell them "
        "apart. The highest fix-ability is gemma's, 1010 (95% interval 950 to 1070)."
    )
    alone = [row("gemma", 1, 1000, 1000, 1000, True)]
    assert wording.headline(alone, measure="rating", evidence="votes") == (
        "Only gemma is rated so far: its rating is 1000 (too few votes for an interval yet). gemma is still "
        "provisional: too few votes for its rank to be settled."
    )
    assert wording.headline([], measure="rating", evidence="votes") == ""


def test_the_refresh_raises_work_mem_for_its_own_transaction(models, settings) -> None:
    from django.db import connection

    strong, weak, _idle = models
    make_battle(strong, weak, "a")
    settings.LEADERBOARD_WORK_MEM = "48MB"
    with connection.cursor() as cursor:
        cursor.execute("SHOW work_mem")
        before = cursor.fetchone()[0]
        services.refresh_leaderboard(rounds=20)
        cursor.execute("SHOW work_mem")  # Still inside the test's transaction: SET LOCAL holds.
        assert cursor.fetchone()[0] == "48MB" != before


def test_an_interval_without_width_says_there_is_too_little_to_tell() -> None:
    assert board.interval(row("gemma", 1, 1000, 990.04, 1010.26)) == "990.0 – 1010.3"
    # One vote between two models: every bootstrap round agrees; that is no evidence of precision.
    assert board.interval(row("gemma", 1, 1000, 1000, 1000)) == "too few to tell"


def test_open_ended_and_unrated_fix_ability_rows_are_said_so() -> None:
    """Fix-ability of a model that fixed every correction has no upper bound, of one that fixed
    none no lower bound, and one with nothing to compare has no rating (leaderboard.fixing): the
    interval, the chart and the headline say so, as the vote boards' open ends, instead of
    inventing a number."""
    from leaderboard.fixing import NO_COMPARISON, NO_FAILURE, NO_FIX, FixAbility

    def fix_row(model: str, rank: int | None, rating, lower, upper, open_ended: str) -> dict:
        return FixAbility(model, rating, lower, upper, rank, 0.5, 0.3, 0.7, 10, 5, open_ended).as_dict()

    always = fix_row("fixer", 1, 1190.8, 981.1, None, NO_FAILURE)
    never = fix_row("stubborn", 1, 852.8, None, 1172.0, NO_FIX)
    lone = fix_row("lone", None, None, None, None, NO_COMPARISON)
    assert (always["upper_open"], never["lower_open"], lone["lower_open"]) == (True, True, False)
    assert board.interval(always) == "≥ 981, no failure observed"
    assert board.interval(never) == "≤ 1172, no fix observed"
    assert board.interval(lone) == "unrated: no comparable episode"
    assert (board.rating(always), board.rating(lone)) == ("≥ 1190.8", "—")
    chart = charts.interval_chart([always, never, lone])
    assert [bar["model"] for bar in chart["bars"]] == ["fixer", "stubborn"]
    assert (
        chart["bars"][0]["label"] == "≥ 981 (no upper bound)" and chart["bars"][1]["label"] == "≤ 1172 (no lower bound)"
    )
    assert chart["bars"][0]["x2"] == max(tick["x"] for tick in chart["ticks"])  # To the edge.
    assert chart["bars"][1]["x1"] == min(tick["x"] for tick in chart["ticks"])
    headline = wording.headline([always, never, lone], measure="fix-ability", evidence="fix episodes")
    assert headline.startswith("fixer and stubborn share first place")
    assert "at least 981 (no failure observed: the fix episodes so far put no upper bound on it)" in headline


def test_every_stage_of_the_refresh_keeps_blas_to_one_thread(models, monkeypatch) -> None:
    """BLAS is pinned to one thread for the whole refresh (issue 38: its thread pool on a busy core
    made one product 50 times slower), and its own setting comes back after."""
    from threadpoolctl import threadpool_info

    from leaderboard import board as board_module
    from leaderboard import fixing

    def blas_threads() -> set[int]:
        return {info["num_threads"] for info in threadpool_info() if info["user_api"] == "blas"}

    seen: list[set[int]] = []
    for module, name in (
        (board_module, "compute_board"),
        (fixing, "rate_fixes"),
        (services.anomaly, "suspicious_voters"),
    ):
        original = getattr(module, name)

        def recorded(*args, _original=original, **kwargs):
            seen.append(blas_threads())
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, recorded)
    strong, weak, _idle = models
    make_battle(strong, weak, "a")
    before = blas_threads()
    services.refresh_leaderboard(rounds=10)
    assert len(seen) >= 3 and all(threads == {1} for threads in seen)
    assert blas_threads() == before
