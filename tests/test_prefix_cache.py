"""The engine's prefix bookkeeping (inference.engine.prefix_cache): which cached row a prompt starts from."""

import pytest

from inference.engine.prefix_cache import NO_MATCH, PrefixCache, PrefixMatch

SYSTEM = list(range(100, 140))  # A 40-token shared beginning: two whole blocks of 16.


def test_nothing_cached_is_no_match() -> None:
    cache = PrefixCache(entries=4, capacity=64, block=16)
    assert cache.lookup([*SYSTEM, 1, 2, 3], limit=42) == NO_MATCH
    assert cache.hits == 0


def test_a_stored_prompt_is_found_by_the_next_one_in_whole_blocks() -> None:
    cache = PrefixCache(entries=4, capacity=64, block=16)
    first = [*SYSTEM, 1, 2, 3]
    row = cache.store(first, NO_MATCH)
    assert row is not None
    # The next prompt shares the 40-token beginning: 32 of them (two blocks) are reusable.
    match = cache.lookup([*SYSTEM, 7, 8, 9, 10], limit=43)
    assert match == PrefixMatch(entry=row, length=32)
    assert (cache.hits, cache.reused_tokens) == (1, 32)


def test_the_limit_leaves_tokens_to_run() -> None:
    cache = PrefixCache(entries=4, capacity=64, block=16)
    prompt = list(range(48))
    cache.store(prompt, NO_MATCH)
    # The engine always runs at least the last prompt token: limit = length - 1.
    assert cache.lookup(prompt, limit=47).length == 32
    assert cache.lookup([*prompt, 99], limit=48).length == 48


def test_prefixes_longer_than_the_capacity_are_cut_to_it() -> None:
    cache = PrefixCache(entries=2, capacity=40, block=16)  # Whole blocks: 32.
    assert cache.capacity == 32
    row = cache.store(list(range(100)), NO_MATCH)
    assert cache.lookup(list(range(100)), limit=99) == PrefixMatch(entry=row, length=32)


def test_a_dialog_extends_its_own_row() -> None:
    cache = PrefixCache(entries=4, capacity=128, block=16)
    turn_one = SYSTEM + list(range(10))  # 50 tokens: 48 cached.
    row = cache.store(turn_one, NO_MATCH)
    turn_two = turn_one + list(range(200, 230))  # The reply and a correction follow.
    match = cache.lookup(turn_two, limit=len(turn_two) - 1)
    assert match == PrefixMatch(entry=row, length=48)
    assert cache.store(turn_two, match) == row  # The longer prefix replaces the shorter one.
    assert cache.lookup([*turn_two, 1], limit=len(turn_two)) == PrefixMatch(entry=row, length=80)


def test_an_already_cached_prefix_takes_no_new_row() -> None:
    cache = PrefixCache(entries=4, capacity=64, block=16)
    prompt = [*SYSTEM, 1]
    row = cache.store(prompt, NO_MATCH)
    match = cache.lookup(prompt, limit=len(prompt) - 1)
    assert match.entry == row
    # Same 32-token prefix (only the part after the blocks differs): nothing to write.
    assert cache.store([*SYSTEM, 2], match) is None


def test_the_least_recently_used_row_is_replaced() -> None:
    cache = PrefixCache(entries=2, capacity=32, block=16)
    a, b, c = ([n] * 20 for n in (1, 2, 3))
    row_a, row_b = cache.store(a, NO_MATCH), cache.store(b, NO_MATCH)
    assert {row_a, row_b} == {0, 1}
    cache.lookup(a, limit=19)  # a is used again: b is now the oldest.
    row_c = cache.store(c, NO_MATCH)
    assert row_c == row_b
    assert cache.lookup(b, limit=19) == NO_MATCH
    assert cache.lookup(a, limit=19).entry == row_a
    assert cache.lookup(c, limit=19).entry == row_c


def test_rows_sharing_a_beginning_keep_it_findable_when_one_goes() -> None:
    cache = PrefixCache(entries=2, capacity=64, block=16)
    row_x = cache.store(SYSTEM + [1] * 10, NO_MATCH)
    row_y = cache.store(SYSTEM + [2] * 10, NO_MATCH)
    assert row_x != row_y
    cache.store([5] * 50, NO_MATCH)  # Replaces the older row, x.
    match = cache.lookup(SYSTEM + [3] * 10, limit=49)
    assert match == PrefixMatch(entry=row_y, length=32)  # y still holds the shared 32 tokens.


def test_clear_forgets_everything() -> None:
    cache = PrefixCache(entries=2, capacity=64, block=16)
    cache.store(SYSTEM, NO_MATCH)
    cache.clear()
    assert cache.lookup([*SYSTEM, 1], limit=40) == NO_MATCH


def test_no_rows_caches_nothing() -> None:
    cache = PrefixCache(entries=0, capacity=64, block=16)
    assert cache.store(SYSTEM, NO_MATCH) is None
    assert cache.lookup(SYSTEM, limit=39) == NO_MATCH


def test_short_prompts_are_not_stored() -> None:
    cache = PrefixCache(entries=2, capacity=64, block=16)
    assert cache.store(list(range(15)), NO_MATCH) is None


@pytest.mark.parametrize("kwargs", [{"entries": -1, "capacity": 64}, {"entries": 1, "capacity": 64, "block": 0}])
def test_invalid_configuration(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="Invalid prefix cache"):
        PrefixCache(**kwargs)
