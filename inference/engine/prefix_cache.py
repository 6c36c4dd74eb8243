"""Which cached prompt prefix a new prompt can start from: the engine's host-side bookkeeping.

Prompts in an arena share long beginnings: the chat template and the task's system prompt in
every battle of a task, and in a dialog each new turn's prompt starts with the whole previous
prompt and reply. The engine keeps the keys and values of recent prompt prefixes on the device
(a pool of ``entries`` rows of ``capacity`` positions) and prefills only what follows the
longest cached one, as JetStream's and vLLM's prefix caches do. This module only decides: which
row holds the longest usable prefix of a prompt, and which row a newly prefilled prompt goes
into. Plain Python, no JAX.

Prefixes are matched in whole blocks of ``block`` tokens (a prefix of 70 tokens is reused as 64
when the block is 16), so that one dictionary lookup per block length finds the longest match.
Rows are replaced least recently used first; a prompt that extends the prefix it started from
replaces that row (the longer prefix holds the shorter one). An engine serving LoRA adapters
(``inference.forward.adapters``) keeps each row for one adapter: the same prompt's keys and
values differ from one adapter to another.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixMatch:
    """``length`` leading tokens of a prompt are cached in row ``entry`` (0 tokens: no match)."""

    entry: int
    length: int


NO_MATCH = PrefixMatch(entry=0, length=0)


class PrefixCache:
    """Block-aligned prompt prefixes held in ``entries`` device rows of ``capacity`` tokens."""

    def __init__(self, entries: int, capacity: int, block: int = 16) -> None:
        if entries < 0 or capacity < 0 or block < 1:
            raise ValueError(f"Invalid prefix cache: {entries} entries, capacity {capacity}, block {block}.")
        self.entries = entries
        self.block = block
        self.capacity = capacity - capacity % block  # Whole blocks only.
        # The adapter and the ids each row holds.
        self._rows: list[tuple[int, tuple[int, ...]]] = [(0, ()) for _ in range(entries)]
        # (adapter, block-aligned prefix) -> rows holding it.
        self._owners: dict[tuple[int, tuple[int, ...]], set[int]] = {}
        self._last_used = [0] * entries
        self._clock = 0
        self.hits = 0  # Lookups that found a prefix (for stats and tests).
        self.reused_tokens = 0

    def lookup(self, token_ids: Sequence[int], limit: int, adapter: int = 0) -> PrefixMatch:
        """The longest cached prefix of ``token_ids`` no longer than ``limit`` tokens, computed by
        ``adapter`` (0: the base)."""
        longest = min(limit, len(token_ids), self.capacity) // self.block * self.block
        for length in range(longest, 0, -self.block):
            rows = self._owners.get((adapter, tuple(token_ids[:length])))
            if rows:
                entry = min(rows)
                self._touch(entry)
                self.hits += 1
                self.reused_tokens += length
                return PrefixMatch(entry=entry, length=length)
        return NO_MATCH

    def store(self, token_ids: Sequence[int], started_from: PrefixMatch, adapter: int = 0) -> int | None:
        """The row to write the keys and values of ``token_ids``' prefix into (computed by
        ``adapter``), or None.

        None when the prefix (whole blocks, at most ``capacity``) is already cached or too short
        to be worth a row. The caller must write the row: from then on ``lookup`` returns it.
        """
        length = min(len(token_ids), self.capacity) // self.block * self.block
        if self.entries == 0 or length == 0 or length <= started_from.length:
            return None
        prefix = tuple(token_ids[:length])
        if self._owners.get((adapter, prefix)):
            self._touch(min(self._owners[adapter, prefix]))
            return None
        # Extending the row it started from keeps one row per conversation, not one per turn.
        if started_from.length and self._rows[started_from.entry] == (adapter, prefix[: started_from.length]):
            entry = started_from.entry
        else:
            entry = min(range(self.entries), key=lambda row: self._last_used[row])
        self._forget(entry)
        self._rows[entry] = (adapter, prefix)
        for end in range(self.block, length + 1, self.block):
            self._owners.setdefault((adapter, prefix[:end]), set()).add(entry)
        self._touch(entry)
        return entry

    def clear(self) -> None:
        """Forget every row (the device pool was reset)."""
        for entry in range(self.entries):
            self._forget(entry)

    def _forget(self, entry: int) -> None:
        adapter, held = self._rows[entry]
        for end in range(self.block, len(held) + 1, self.block):
            owners = self._owners.get((adapter, held[:end]))
            if owners is not None:
                owners.discard(entry)
                if not owners:
                    del self._owners[adapter, held[:end]]
        self._rows[entry] = (0, ())
        self._last_used[entry] = 0

    def _touch(self, entry: int) -> None:
        self._clock += 1
        self._last_used[entry] = self._clock
