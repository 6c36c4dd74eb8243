"""The refresh's running counts (leaderboard/tally.py): what a refresh keeps for the next one, so
that it reads the battles ended since instead of every vote, and why they always equal the votes
counted from scratch."""

import random
from typing import Any

import numpy as np
import pytest
from django.db.models import Q
from django.utils import timezone

from inference.models import LLM
from leaderboard import fixing, selectors, services
from leaderboard.models import LeaderboardSnapshot, VoteTallyState
from leaderboard.tally import CountTable, Tally
from votes.models import Battle, FixEpisode, FlaggedVoter, Message, Task, Vote


def test_count_tables_sum_repeated_keys_and_drop_rows_counted_out() -> None:
    table = CountTable.summed(np.array([[1, 2], [0, 5], [1, 2]]), np.array([[1.0, 0.5], [2.0, 1.0], [3.0, 0.25]]))
    assert table.keys.tolist() == [[0, 5], [1, 2]]
    assert table.values.tolist() == [[2.0, 1.0], [4.0, 0.75]]
    less = table.plus(CountTable.summed(np.array([[0, 5], [7, -3]]), np.array([[2.0, 1.0], [1.0, 1.0]])), -1.0)
    assert less.keys.tolist() == [[1, 2], [7, -3]]  # (0, 5) counted out; a negative count is kept.
    assert less.values.tolist() == [[4.0, 0.75], [-1.0, -1.0]]


def test_merging_a_few_rows_into_a_large_table_sums_as_a_sort_would() -> None:
    """CountTable.plus merges by binary search into a table kept in key order; it gives what
    summing every row together gives, rows counted out dropped, recoded rows re-ordered."""
    rng = np.random.default_rng(1)
    large = CountTable.summed(rng.integers(0, 30, (5_000, 4)), rng.integers(1, 4, (5_000, 2)).astype(float))
    taken = large.keys[rng.choice(len(large.keys), 50, replace=False)]
    few = CountTable.summed(np.concatenate([taken, rng.integers(0, 40, (50, 4))]), rng.integers(1, 4, (100, 2)))
    shuffled = few.recoded(0, rng.permutation(40))
    for other in (few, shuffled):
        for sign in (1.0, -1.0):
            merged = large.plus(other, sign)
            reference = CountTable.summed(
                np.concatenate([large.keys, other.keys]), np.concatenate([large.values, sign * other.values])
            )
            assert merged.keys.tolist() == reference.keys.tolist()
            np.testing.assert_array_equal(merged.values, reference.values)
    exact = large.plus(large, -1.0)
    assert len(exact.keys) == 0


def test_count_tables_with_keys_too_wide_to_pack_sum_the_same() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 4, (200, 3))
    values = rng.random((200, 1))
    narrow = CountTable.summed(keys, values)
    wide = CountTable.summed(keys * np.array([2**40, 2**30, 1]), values)  # 2 + 42 + 32 + 2 bits.
    assert wide.keys.tolist() == (narrow.keys * np.array([2**40, 2**30, 1])).tolist()
    np.testing.assert_allclose(wide.values, narrow.values)


def test_a_tally_survives_storage_and_adds_up_in_its_own_codes() -> None:
    first = Tally(
        categories=("overall",),
        voters=("v1",),
        boards=CountTable.summed(np.array([[0, 1, 2, 0]]), np.array([[3.0, 3.0, 9.0]])),
        ballots=CountTable.summed(np.array([[0, 1, 2, 0]]), np.array([[3.0]])),
    )
    second = Tally(
        categories=("task:API calls", "overall"),
        voters=("v2", "v1"),
        boards=CountTable.summed(np.array([[1, 1, 2, 0], [0, 1, 2, 1]]), np.array([[1.0, 0.0, 0.0], [2.0, 2.0, 6.0]])),
        ballots=CountTable.summed(np.array([[1, 1, 2, 0], [0, 1, 2, 1]]), np.array([[1.0], [2.0]])),
    )
    both = Tally.from_bytes(first.plus(second).to_bytes())
    assert both is not None
    assert both.categories == ("overall", "task:API calls") and both.voters == ("v1", "v2")
    assert both.boards.keys.tolist() == [[0, 1, 2, 0], [1, 1, 2, 1]]
    assert both.boards.values.tolist() == [[4.0, 3.0, 9.0], [2.0, 2.0, 6.0]]
    assert both.ballots.keys.tolist() == [[0, 1, 2, 0], [1, 1, 2, 1]]
    assert both.ballots.values.tolist() == [[4.0], [2.0]]


def canonical(tally: Tally) -> dict[str, Any]:
    """A tally by names instead of codes, rows sorted: equal for equal counts."""

    def rows(table: CountTable, *names: tuple[str, ...]) -> list[tuple]:
        """Rows with their first key columns decoded by ``names``, one list per column."""
        decoded = [
            ((*(n[k] for n, k in zip(names, key, strict=False)), *key[len(names) :]), tuple(round(v, 9) for v in value))
            for key, value in zip(table.keys.tolist(), table.values.tolist(), strict=True)
        ]
        return sorted(decoded)

    return {
        "flagged": sorted(tally.flagged),
        "boards": rows(tally.boards, tally.categories),
        "left_out": rows(tally.left_out, tally.categories),
        "style": rows(tally.style, tally.voters),
        "ballots": rows(tally.ballots, tally.voters),
        # The episodes' last key column is the voter: by name too.
        "episodes": sorted(
            ((*key[:-1], tally.voters[key[-1]]), tuple(round(v, 9) for v in value))
            for key, value in zip(tally.episodes.keys.tolist(), tally.episodes.values.tolist(), strict=True)
        ),
        "replies": rows(tally.replies),
        "voter_boards": rows(tally.voter_boards, tally.voters, tally.classes),
    }


def stored_tally() -> Tally:
    tally = selectors.stored_tally()
    assert tally is not None
    return tally


class Arena:
    """Battles as the arena stores them, with first-try votes, corrections and after-fix votes."""

    def __init__(self) -> None:
        self.rng = random.Random(7)
        self.models = [
            LLM.objects.create(name=f"m{i}", family="gemma", preset=f"/p/m{i}", context_tokens=2048) for i in range(4)
        ]
        self.tasks = [None, *(Task.objects.create(slug=f"t{c}", title=c, category=c) for c in ("API calls", "Dates"))]

    def battle(self, voter: str, *, ended: bool = True, leaked: bool = False, winner: int | None = None) -> Battle:
        a, b = self.rng.sample(range(4), 2) if winner is None else (winner, self.rng.choice([1, 2, 3]))
        battle = Battle.objects.create(
            model_a=self.models[a],
            model_b=self.models[b],
            task=self.rng.choice(self.tasks),
            voter_key=voter,
            excluded=leaked,
            pair_probability=None if self.rng.random() < 0.1 else 1 / 6,
        )
        corrected = self.rng.random() < 0.4
        for side in "ab":
            Message.objects.create(battle=battle, side=side, turn=0, role="user", content="Add a meeting")
            rating = "mistake" if corrected and side == "a" else ""
            Message.objects.create(battle=battle, side=side, turn=0, role="assistant", content="x", rating=rating)
        seen = {f"seen_{f}_{s}": float(self.rng.randrange(0, 40)) for f in ("length", "headers") for s in "ab"}
        choice = "a" if winner is not None else self.rng.choice(["a", "b", "tie", "both_bad"])
        Vote.objects.create(battle=battle, stage="first_try", after_turn=0, choice=choice, **seen)
        if corrected:
            Message.objects.create(battle=battle, side="a", turn=1, role="user", content="The time is wrong.")
            rating = self.rng.choice(["fixed", "mistake"])
            Message.objects.create(battle=battle, side="a", turn=1, role="assistant", content="y", rating=rating)
            if rating == "mistake" and self.rng.random() < 0.5:  # Corrected again: one battle, two episodes.
                Message.objects.create(battle=battle, side="a", turn=2, role="user", content="Still wrong.")
                rating = self.rng.choice(["fixed", "mistake"])
                Message.objects.create(battle=battle, side="a", turn=2, role="assistant", content="z", rating=rating)
            Vote.objects.create(battle=battle, stage="after_fix", after_turn=1, choice=self.rng.choice("ab"), **seen)
        if ended:
            Battle.objects.filter(pk=battle.pk).update(state=Battle.State.ENDED, ended=timezone.now())
        return battle

    def battles(self, count: int, voters: int = 12) -> list[Battle]:
        return [self.battle(f"v{self.rng.randrange(voters)}") for _ in range(count)]


@pytest.mark.django_db
def test_each_refresh_counts_only_what_changed_and_equals_a_count_from_scratch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Battles end between refreshes, an admin flags and clears voters, the detector flags a
    stuffer, a counted vote is edited and a task changes: after every refresh the running counts
    equal every ended battle's votes counted from scratch with the flags of that moment, and the
    refreshes in between read the new battles and the re-flagged voters' votes only."""
    read: list[int] = []
    count_battles = selectors.battles_tally

    def spy(battles: Any, flagged: frozenset[str]) -> Tally:
        read.append(Vote.objects.filter(battles).count())
        return count_battles(battles, flagged)

    monkeypatch.setattr(selectors, "battles_tally", spy)
    arena = Arena()

    def refresh() -> None:
        read.clear()
        services.refresh_leaderboard(rounds=5)
        from_scratch = count_battles(Q(battle__state=Battle.State.ENDED), selectors.flagged_voters())
        assert canonical(stored_tally()) == canonical(from_scratch)
        # Fix-ability from the counted episodes equals fix-ability over the episodes one by one.
        listed = [
            fixing.Episode(model, task or fixing.FREE_CHAT, turn or 0, fixed, battle, kind, attempt, voter)
            for model, task, turn, fixed, battle, kind, attempt, voter in FixEpisode.objects.filter(
                battle__state=Battle.State.ENDED, battle__excluded=False
            )
            .exclude(battle__voter_key__in=selectors.flagged_voters())
            .values_list(
                "model__name",
                "task__slug",
                "script_turn",
                "fixed",
                "battle__public_id",
                "specificity",
                "attempt",
                "battle__voter_key",
            )
        ]
        assert fixing.rate_fixes(selectors.fix_episode_counts(stored_tally())) == fixing.rate_fixes(listed)

    arena.battles(30)
    arena.battle("v-active", ended=False)
    arena.battle("v0", leaked=True)
    refresh()
    assert read == [Vote.objects.filter(battle__state=Battle.State.ENDED).count()]  # The first: every vote.
    assert stored_tally().left_out.values.sum() > 0  # The leak is left out (the active battle is not counted).

    new = arena.battles(10)
    FlaggedVoter.objects.create(voter_key="v1", reason="flagged by an admin")
    refresh()
    theirs = Vote.objects.filter(battle__voter_key="v1", battle__state=Battle.State.ENDED).count()
    assert read == [Vote.objects.filter(battle__in=new).count(), theirs, theirs]
    assert "v1" in stored_tally().flagged

    FlaggedVoter.objects.filter(voter_key="v1").update(cleared=True)
    FlaggedVoter.objects.create(voter_key="v2", reason="flagged by an admin")
    stuffer = [arena.battle("stuffer", winner=0) for _ in range(60)]  # Always for m0.
    refresh()
    assert FlaggedVoter.objects.filter(voter_key="stuffer", source=FlaggedVoter.Source.AUTOMATIC).exists()
    assert stored_tally().flagged == {"v2", "stuffer"}
    everything = Vote.objects.filter(battle__state=Battle.State.ENDED).count()
    assert read[0] == Vote.objects.filter(battle__in=stuffer).count() and max(read) < everything

    overall = LeaderboardSnapshot.objects.filter(category="overall").latest("refresh__created")
    assert overall.excluded == selectors.excluded_votes("overall")
    assert overall.excluded["flagged voter"] > 0 and overall.excluded["unfinished battle"] == 1

    vote = Vote.objects.filter(battle__in=new).first()
    vote.choice = "tie" if vote.choice != "tie" else "a"
    vote.save()  # An admin edits a counted vote: the counts are stale, and the next refresh recounts.
    assert VoteTallyState.objects.get().stale
    refresh()
    assert read[0] == everything
    assert not VoteTallyState.objects.get().stale

    arena.battles(5)
    refresh()
    assert max(read) < everything

    Task.objects.filter(pk=arena.tasks[1].pk).update(category="Calendar")
    Task.objects.get(pk=arena.tasks[1].pk).save()  # A task changed: episodes and votes are counted again.
    refresh()
    assert read[0] > everything
    assert "task:Calendar" in stored_tally().categories


@pytest.mark.django_db
def test_a_battle_loaded_before_a_refresh_counted_it_is_not_counted_twice() -> None:
    """An admin opens an ended battle, a refresh counts it, the admin saves it: the save does not
    write "not counted" back (or the next refresh would count it again), and since the battle is
    counted, the change makes the counts stale. Its votes and replies alike."""
    arena = Arena()
    arena.battles(6)
    opened = Battle.objects.filter(state=Battle.State.ENDED).first()
    vote = Vote.objects.select_related("battle").filter(battle=opened).first()
    services.refresh_leaderboard(rounds=5)
    assert not opened.tallied and Battle.objects.get(pk=opened.pk).tallied
    opened.excluded_reason = "looked at by an admin"
    opened.save()
    assert Battle.objects.get(pk=opened.pk).tallied
    assert VoteTallyState.objects.get().stale
    services.refresh_leaderboard(rounds=5)
    assert not VoteTallyState.objects.get().stale
    vote.save()  # Its battle at hand, loaded before the refresh that counted it.
    assert VoteTallyState.objects.get().stale
    services.refresh_leaderboard(rounds=5)
    from_scratch = selectors.battles_tally(Q(battle__state=Battle.State.ENDED), selectors.flagged_voters())
    assert canonical(stored_tally()) == canonical(from_scratch)
    Battle.objects.get(pk=opened.pk).delete()
    assert VoteTallyState.objects.get().stale
