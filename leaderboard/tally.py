"""The counts a leaderboard refresh keeps for the next one, so that it reads only what changed.
No Django.

Every aggregate the refresh needs from the votes is a sum over battles: each board's votes per
(pair, choice), the votes each board leaves out per reason, the overall board's style cells, the
anomaly detector's votes per (voter, pair, outcome), the fix episodes per model and task
turn, and the judged replies per model. A battle's votes and episodes never change once it has
ended (it takes no vote or rating after that), so a ``Tally`` of the battles counted so far
plus the ``Tally`` of the battles ended since is the ``Tally`` of them all, and a refresh reads a
few new battles instead of a million votes.

One thing besides battles decides where a vote counts: whether its voter is flagged. A tally is
made for one set of flagged voters (``flagged``), whose votes and episodes the boards leave out;
when flags change, the changed voters' own battles are taken out as the old set counted them and
put back as the new one does (``Tally.reflagged``). The detector's table keeps every voter,
flagged or not: it is filtered when read.

Models and tasks are kept by their database ids (a new model does not move anyone's counts),
categories and voters by codes into the tally's own lists.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from leaderboard import anomaly
from votes.feedback import KINDS  # Codes of an episode's correction kind.

CHOICES = ("a", "b", "tie", "both_bad")  # Codes of the boards' choice column.
# Codes of the ballots' and style cells' outcome column: the score of the pair's first model (the
# one with the smaller id), as the anomaly detector and style control read it (a tie and "both
# bad" alike).
OUTCOMES = (0.0, 0.5, 1.0)
LEFT_OUT_REASONS = ("identity leak", "flagged voter", "over daily cap")  # Codes of left_out's reason column.
JUDGED = (None, False, True)  # Codes of a judge's verdict on an episode (None: not judged).
VERSION = 8  # Of the stored layout: a tally stored by another version is rebuilt.


@dataclass(frozen=True)
class CountTable:
    """Rows with unique integer keys and values summed per key (the first value is a count: a
    row whose count reaches zero is dropped)."""

    keys: np.ndarray  # (rows, key columns), int64
    values: np.ndarray  # (rows, value columns), float64

    @classmethod
    def empty(cls, key_columns: int, value_columns: int) -> CountTable:
        return cls(np.zeros((0, key_columns), np.int64), np.zeros((0, value_columns)))

    @classmethod
    def summed(cls, keys: np.ndarray, values: np.ndarray) -> CountTable:
        """Rows (2-D ``keys`` and ``values``) with repeated keys summed into one."""
        keys, values = np.asarray(keys, dtype=np.int64), np.asarray(values, dtype=float)
        if len(keys) == 0:
            return cls(keys, values)
        unique, first, inverse = np.unique(_packed(keys), return_index=True, return_inverse=True)
        sums = np.stack([np.bincount(inverse, column, len(unique)) for column in values.T], axis=1)
        return cls._counted(keys[first], sums)

    @classmethod
    def _counted(cls, keys: np.ndarray, values: np.ndarray) -> CountTable:
        """The rows whose count is not zero."""
        keep = values[:, 0] != 0
        return cls(keys, values) if keep.all() else cls(keys[keep], values[keep])

    def plus(self, other: CountTable, sign: float = 1.0) -> CountTable:
        """Both tables' rows, summed per key (``sign`` -1: ``other``'s taken out). A table is
        kept in key order (``summed`` sorts it), so a few new rows merge into a million by
        binary search instead of a sort."""
        if len(other.keys) == 0:
            return self
        packing = _packing(self.keys, other.keys)
        if packing is None or len(other.keys) * 8 > len(self.keys):  # Not a few rows: one sort.
            return self._summed_with(other, sign)
        mine, theirs = _pack(self.keys, *packing), _pack(other.keys, *packing)
        if not _increasing(mine):  # Recoded: out of order.
            return self._summed_with(other, sign)
        if not _increasing(theirs):  # Recoded into this table's codes (still one row per key).
            order = np.argsort(theirs)
            theirs, other = theirs[order], CountTable(other.keys[order], other.values[order])
        at = np.searchsorted(mine, theirs)
        found = at < len(mine)
        found[found] = mine[at[found]] == theirs[found]
        keys, values = self.keys, self.values.copy()
        values[at[found]] += sign * other.values[found]
        new = ~found
        if new.any():
            keys = _inserted(keys, at[new], other.keys[new])
            values = _inserted(values, at[new], sign * other.values[new])
        return CountTable._counted(keys, values)

    def _summed_with(self, other: CountTable, sign: float) -> CountTable:
        return CountTable.summed(
            np.concatenate([self.keys, other.keys]), np.concatenate([self.values, sign * other.values])
        )

    def recoded(self, column: int, codes: np.ndarray) -> CountTable:
        """The same rows with ``column``'s codes c replaced by ``codes[c]``."""
        keys = self.keys.copy()
        keys[:, column] = codes[keys[:, column]] if len(keys) else keys[:, column]
        return CountTable(keys, self.values)


def _packed(keys: np.ndarray) -> np.ndarray:
    """One int64 per row, ordered (lexicographically, by column) and unique as the rows are:
    the columns' offsets packed into 63 bits where they fit (``_packing``), otherwise the rows'
    ranks."""
    packing = _packing(keys)
    if packing is None:
        return np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)
    return _pack(keys, *packing)


def _packing(*tables: np.ndarray) -> tuple[np.ndarray, list[int]] | None:
    """Each key column's lowest value and width in bits over ``tables``' rows, or None when the
    widths add up to more than 63 bits (any arena fits: a few dozen models, categories and
    choices, steps of -20 to 20, a million voters)."""
    lowest = np.min([table.min(axis=0) for table in tables if len(table)], axis=0)
    highest = np.max([table.max(axis=0) for table in tables if len(table)], axis=0)
    bits = [int(span).bit_length() for span in (highest - lowest).tolist()]
    return (lowest, bits) if sum(bits) <= 63 else None


def _pack(keys: np.ndarray, lowest: np.ndarray, bits: list[int]) -> np.ndarray:
    packed = np.zeros(len(keys), np.int64)
    for column, width in enumerate(bits):
        packed <<= width
        packed |= keys[:, column] - lowest[column]
    return packed


def _inserted(rows: np.ndarray, at: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``rows`` with ``new[k]`` inserted before ``rows[at[k]]`` (``at`` ascending): one
    concatenation of slices, cheaper than ``np.insert``'s masks on a million rows."""
    pieces = np.split(rows, at)
    out = [pieces[0]]
    for k, piece in enumerate(pieces[1:]):
        out += [new[k : k + 1], piece]
    return np.concatenate(out)


def _increasing(packed: np.ndarray) -> bool:
    return bool(np.all(packed[1:] > packed[:-1]))


def _codes(names: Sequence[str], into: list[str]) -> np.ndarray:
    """Each of ``names``' positions in ``into``, appending the missing ones."""
    position = {name: i for i, name in enumerate(into)}
    for name in names:
        if name not in position:
            position[name] = len(into)
            into.append(name)
    return np.array([position[name] for name in names], dtype=np.int64)


@dataclass(frozen=True)
class Tally:
    """The refresh's counts for some battles' votes, as their voters were flagged (``flagged``):

    - ``boards``: keys (category, model A id, model B id, choice), values (votes, votes whose
      battle recorded its pair probability, sum of 1 / that probability): every board's counted
      votes, flagged voters' and leaked battles' left out;
    - ``voter_boards``: keys (voter, class, first model id, second model id, outcome
      (``OUTCOMES``)), values (votes,): the same votes per voter (the boards' intervals are
      clustered by voter), once each: a class (``classes``) is the set of categories a vote
      counts in ("overall|task:Dates"), so the overall board's votes are not stored again for
      their task's board;
    - ``left_out``: keys (category, reason), values (votes,): what each board left out, per
      reason (``LEFT_OUT_REASONS``; the first that applies);
    - ``style``: keys (voter, first model id, second model id, outcome (``OUTCOMES``), and the
      four style differences, first minus second, in ``style.BINS`` steps), values (votes,): the
      overall board's counted votes as style cells, per voter (style control's intervals are
      clustered by voter);
    - ``ballots``: keys (voter, first model id, second model id, outcome), values (votes,): the
      votes of anonymous battles, by every voter, flagged or not, those of battles with an
      identity leak and those over the daily cap included (the anomaly detector's input: no
      exclusion a voter can cause hides a vote from it);
    - ``episodes``: keys (model id, task id or 0 for free chat, script turn, fixed, fixed as the
      voter rated it, as the checker judged it (``JUDGED``), cluster: the battle's id where it
      has more than one episode, else 0, the correction's kind (``KINDS``), the attempt, the voter
      (fix-ability's intervals are clustered by voter)), values
      (episodes,): the counted fix episodes, flagged voters' and leaked battles' left out (under
      ``episode_category`` in ``left_out``);
    - ``replies``: keys (model id, judged wrong), values (replies,): the first tries (replies to
      a prompt both sides got) of the same battles judged by the voter or the checker, and how
      many were judged wrong (the rate at
      which fix episodes start, shown beside fix-ability).
    """

    categories: tuple[str, ...] = ()
    voters: tuple[str, ...] = ()
    flagged: frozenset[str] = frozenset()
    classes: tuple[str, ...] = ()
    boards: CountTable = field(default_factory=lambda: CountTable.empty(4, 3))
    left_out: CountTable = field(default_factory=lambda: CountTable.empty(2, 1))
    style: CountTable = field(default_factory=lambda: CountTable.empty(8, 1))
    ballots: CountTable = field(default_factory=lambda: CountTable.empty(4, 1))
    episodes: CountTable = field(default_factory=lambda: CountTable.empty(10, 1))
    replies: CountTable = field(default_factory=lambda: CountTable.empty(2, 1))
    voter_boards: CountTable = field(default_factory=lambda: CountTable.empty(5, 1))

    def plus(self, other: Tally, sign: float = 1.0) -> Tally:
        """This tally with ``other``'s counts added (``sign`` -1: taken out), in this one's codes.
        Both must count the same flagged voters; ``other``'s set is kept."""
        categories, voters, classes = list(self.categories), list(self.voters), list(self.classes)
        category_codes = _codes(other.categories, categories)
        voter_codes = _codes(other.voters, voters)
        class_codes = _codes(other.classes, classes)
        return Tally(
            categories=tuple(categories),
            voters=tuple(voters),
            flagged=other.flagged,
            classes=tuple(classes),
            boards=self.boards.plus(other.boards.recoded(0, category_codes), sign),
            left_out=self.left_out.plus(other.left_out.recoded(0, category_codes), sign),
            style=self.style.plus(other.style.recoded(0, voter_codes), sign),
            ballots=self.ballots.plus(other.ballots.recoded(0, voter_codes), sign),
            episodes=self.episodes.plus(other.episodes.recoded(9, voter_codes), sign),
            replies=self.replies.plus(other.replies, sign),
            voter_boards=self.voter_boards.plus(
                other.voter_boards.recoded(0, voter_codes).recoded(1, class_codes), sign
            ),
        )

    def reflagged(self, flagged: frozenset[str], old: Tally, new: Tally) -> Tally:
        """Flags changed: ``old`` and ``new`` are the changed voters' own votes counted as this
        tally's set of flags and as ``flagged`` count them."""
        return replace(self.plus(old, -1.0).plus(new), flagged=flagged)

    def detector_table(self) -> anomaly.VoteTable:
        """The anomaly detector's input: the ballots of the voters not flagged, in the order it
        groups them (voter, pair: the model codes follow the ids)."""
        flagged = np.zeros(len(self.voters) + 1, dtype=bool)
        flagged[[code for code, voter in enumerate(self.voters) if voter in self.flagged]] = True
        keep = ~flagged[self.ballots.keys[:, 0]]
        keys, count = self.ballots.keys[keep], self.ballots.values[keep, 0]
        # Models by dense codes in id order (ids are small integers: a lookup table, not a sort).
        present = np.zeros(int(keys[:, 1:3].max(initial=0)) + 1, dtype=bool)
        present[keys[:, 1]] = present[keys[:, 2]] = True
        code = np.cumsum(present) - 1
        return anomaly.VoteTable(
            list(self.voters),
            [str(model) for model in np.flatnonzero(present)],
            keys[:, 0].astype(np.intp),
            code[keys[:, 1]].astype(np.intp),
            code[keys[:, 2]].astype(np.intp),
            np.array(OUTCOMES)[keys[:, 3]],
            count,
        )

    def to_bytes(self) -> bytes:
        """The tally as an uncompressed ``.npz``, each column of each table in its narrowest
        exact dtype (a million ballots: a few bytes a row instead of 40)."""
        buffer = io.BytesIO()
        names = {
            "categories": self.categories,
            "voters": self.voters,
            "flagged": sorted(self.flagged),
            "classes": self.classes,
        }
        tables = {
            f"{name}_{part}_{column}": _narrowed(values)
            for name in TABLES
            for part in ("keys", "values")
            for column, values in enumerate(getattr(getattr(self, name), part).T)
        }
        shapes = {name: [getattr(self, name).keys.shape[1], getattr(self, name).values.shape[1]] for name in TABLES}
        names["shapes"] = shapes
        np.savez(
            buffer,
            version=np.array(VERSION),
            names=np.frombuffer(json.dumps(names).encode(), dtype=np.uint8),
            **tables,
        )
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> Tally | None:
        """The stored tally, or None when it was stored by another version of this layout."""
        with np.load(io.BytesIO(data), allow_pickle=False) as stored:
            if int(stored["version"]) != VERSION:
                return None
            names = json.loads(stored["names"].tobytes())

            def columns(name: str, part: str, count: int, dtype: type) -> np.ndarray:
                first = stored[f"{name}_{part}_0"] if count else np.zeros(0)
                table = np.empty((first.size, count), dtype)
                for column in range(count):
                    table[:, column] = first if column == 0 else stored[f"{name}_{part}_{column}"]
                return table

            tables = {
                name: CountTable(columns(name, "keys", keys, np.int64), columns(name, "values", values, float))
                for name, (keys, values) in names["shapes"].items()
            }
        return cls(
            categories=tuple(names["categories"]),
            voters=tuple(names["voters"]),
            flagged=frozenset(names["flagged"]),
            classes=tuple(names["classes"]),
            **tables,
        )


TABLES = ("boards", "left_out", "style", "ballots", "episodes", "replies", "voter_boards")


def _narrowed(array: np.ndarray) -> np.ndarray:
    """Whole numbers (keys, counts) in the smallest integer dtype that holds them; other floats
    in single precision where that is exact."""
    if array.size == 0:
        return array
    if array.dtype.kind == "f" and not np.array_equal(array, np.round(array)):
        single = array.astype(np.float32)
        return single if np.array_equal(single, array) else array
    if np.abs(array).max() >= 2**53:  # Not every such float is an integer.
        return array
    return array.astype(np.result_type(np.min_scalar_type(int(array.min())), np.min_scalar_type(int(array.max()))))


@dataclass(frozen=True)
class VoteRow:
    """Votes of one kind, as a GROUP BY over the stored votes returns them: everything that
    decides where they count (``categories`` is what ``in_category`` puts them in)."""

    voter: str
    categories: Sequence[str]
    leaked: bool  # The battle named a model (identity leak).
    model_a: int
    model_b: int
    choice: str
    votes: int
    recorded: int  # Of which the battle recorded its pair probability.
    inverse: float  # Sum over them of 1 / pair probability.
    over_cap: bool = False  # Cast past the voter's or network's daily cap (Vote.over_daily_cap).
    # An anonymous battle's: the anomaly detector judges them, leaked or not (a named or direct
    # chat's votes are "leaked" by design and judged by no one).
    anonymous: bool = True


def _first_model_outcome(model_a: int, model_b: int, choice: str) -> tuple[int, int, int]:
    """A vote as (the model with the smaller id, the other, the outcome code for the first)."""
    score_a = anomaly.CHOICE_SCORES[choice]
    if model_a < model_b:
        return model_a, model_b, OUTCOMES.index(score_a)
    return model_b, model_a, OUTCOMES.index(1.0 - score_a)


@dataclass(frozen=True)
class EpisodeRow:
    """Fix episodes of one battle and of one kind, as a GROUP BY over them returns them."""

    battle: int
    voter: str
    leaked: bool
    model: int
    task: int | None
    turn: int | None
    fixed: bool
    voter_fixed: bool | None
    checker_fixed: bool | None
    specificity: str
    attempt: int
    episodes: int


@dataclass(frozen=True)
class ReplyRow:
    """Judged replies of one battle's side, as a GROUP BY over them returns them."""

    voter: str
    leaked: bool
    model: int
    wrong: bool
    replies: int


def tally_of(
    rows: Sequence[VoteRow],
    style_rows: Sequence[tuple[str, int, int, str, int, int, int, int, int]],
    episode_rows: Sequence[EpisodeRow],
    flagged: frozenset[str],
    episode_category: str,
    reply_rows: Sequence[ReplyRow] = (),
) -> Tally:
    """The tally of some battles' votes (``rows``), of their counted overall votes as style
    cells (``style_rows``: voter, model A id, model B id, choice, four steps, votes; flagged voters'
    already left out) and of their fix episodes (``episode_rows``: every episode of each of
    those battles) and judged replies (``reply_rows``), with ``flagged`` voters' votes, episodes
    and replies left out."""
    category_position: dict[str, int] = {}
    voter_position: dict[str, int] = {}
    class_position: dict[str, int] = {}
    board_keys, board_values, left_keys, left_values, ballot_keys, ballot_values = [], [], [], [], [], []
    voter_keys, voter_values = [], []
    choice_code = {choice: i for i, choice in enumerate(CHOICES)}
    for row in rows:
        choice = choice_code[row.choice]
        reason = 0 if row.leaked else 1 if row.voter in flagged else 2 if row.over_cap else None
        if row.anonymous:  # Leaked or over the cap, the detector sees it: no voter hides a vote from it.
            voter = voter_position.setdefault(row.voter, len(voter_position))
            first, second, outcome = _first_model_outcome(row.model_a, row.model_b, row.choice)
            ballot_keys.append((voter, first, second, outcome))
            ballot_values.append((row.votes,))
            if reason is None and row.categories:
                kind = class_position.setdefault("|".join(row.categories), len(class_position))
                voter_keys.append((voter, kind, first, second, outcome))
                voter_values.append((row.votes,))
        for name in row.categories:
            category = category_position.setdefault(name, len(category_position))
            if reason is not None:
                left_keys.append((category, reason))
                left_values.append((row.votes,))
            else:
                board_keys.append((category, row.model_a, row.model_b, choice))
                board_values.append((row.votes, row.recorded, row.inverse))
    per_battle: dict[int, int] = {}
    for episode in episode_rows:
        per_battle[episode.battle] = per_battle.get(episode.battle, 0) + episode.episodes
    episode_keys, episode_values = [], []
    for episode in episode_rows:
        reason = 0 if episode.leaked else 1 if episode.voter in flagged else None
        if reason is not None:
            left_keys.append((category_position.setdefault(episode_category, len(category_position)), reason))
            left_values.append((episode.episodes,))
            continue
        episode_keys.append(
            (
                episode.model,
                episode.task or 0,
                episode.turn or 0,
                int(episode.fixed),
                JUDGED.index(episode.voter_fixed),
                JUDGED.index(episode.checker_fixed),
                episode.battle if per_battle[episode.battle] > 1 else 0,
                KINDS.index(episode.specificity) if episode.specificity in KINDS else 0,
                episode.attempt,
                voter_position.setdefault(episode.voter, len(voter_position)),
            )
        )
        episode_values.append((episode.episodes,))
    counted = [row for row in reply_rows if not row.leaked and row.voter not in flagged]
    reply_keys = [(row.model, int(row.wrong)) for row in counted]
    reply_values = [(row.replies,) for row in counted]
    style_keys = []
    for voter, a, b, choice, *steps, _ in style_rows:
        first, second, outcome = _first_model_outcome(a, b, choice)
        code = voter_position.setdefault(voter, len(voter_position))
        style_keys.append((code, first, second, outcome, *(steps if first == a else (-step for step in steps))))
    return Tally(
        categories=tuple(category_position),
        voters=tuple(voter_position),
        flagged=flagged,
        classes=tuple(class_position),
        voter_boards=CountTable.summed(
            np.array(voter_keys, np.int64).reshape(-1, 5), np.array(voter_values).reshape(-1, 1)
        ),
        boards=CountTable.summed(np.array(board_keys, np.int64).reshape(-1, 4), np.array(board_values).reshape(-1, 3)),
        left_out=CountTable.summed(np.array(left_keys, np.int64).reshape(-1, 2), np.array(left_values).reshape(-1, 1)),
        style=CountTable.summed(
            np.array(style_keys, np.int64).reshape(-1, 8),
            np.array([row[-1] for row in style_rows], float).reshape(-1, 1),
        ),
        ballots=CountTable.summed(
            np.array(ballot_keys, np.int64).reshape(-1, 4), np.array(ballot_values).reshape(-1, 1)
        ),
        episodes=CountTable.summed(
            np.array(episode_keys, np.int64).reshape(-1, 10), np.array(episode_values).reshape(-1, 1)
        ),
        replies=CountTable.summed(
            np.array(reply_keys, np.int64).reshape(-1, 2), np.array(reply_values, float).reshape(-1, 1)
        ),
    )
