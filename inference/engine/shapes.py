"""The shapes an engine compiles for: prefill buckets (padded prompt lengths) and decode
windows (cache positions a step attends over). No Django, no JAX."""

from __future__ import annotations

from collections.abc import Sequence

from inference.streaming import MIN_BUCKET

# Chunks after a cached prefix are mostly short (a dialog's new turn): up to this many tokens,
# the prefill buckets come every PREFIX_BLOCK tokens (a chunk pads at most 15 tokens: SmolLM2,
# 133 ms for 80 tokens against 150 ms for 96), then two per octave.
FINE_BUCKETS_UP_TO = 128


def default_buckets(context: int, smallest: int = MIN_BUCKET, fine_up_to: int = 0) -> tuple[int, ...]:
    """Prefill lengths: 64, 96, 128, 192, 256, 384, ... (two per octave), capped by the context;
    up to ``fine_up_to`` also every ``smallest`` tokens.

    Prefill cost grows faster than linearly with the padded length (attention), and a prefill
    shape compiles in well under a second, so two buckets per octave (at most a third of a
    prefill wasted on padding) are worth their compilations. The context itself is always one.
    With a prefix cache the chunks after a cached prefix are short: the engine starts them at
    16 and passes ``FINE_BUCKETS_UP_TO`` as ``fine_up_to``.
    """
    coarse = _lengths(context, smallest, three_halves_from=smallest)
    fine = range(smallest, min(fine_up_to, context) + 1, smallest)
    return tuple(sorted({*coarse, *fine}))


# From this window up, a window also between each power of two and the next (384, 768, ...):
# there a step's attention is a sizeable part of it. SmolLM2, 8 slots, a decode step over 256,
# 384 and 512 positions: 67, 76 and 81 ms (scratch timing); a chat's prompt and reply often
# end between 256 and 384 positions.
THREE_HALVES_WINDOWS_FROM = 256


def default_windows(context: int) -> tuple[int, ...]:
    """Decode windows: powers of two from 64, with 1.5 times each from
    ``THREE_HALVES_WINDOWS_FROM`` on, and the context (see ``Engine``)."""
    return _lengths(context, MIN_BUCKET, three_halves_from=THREE_HALVES_WINDOWS_FROM)


# Compact shapes: each compiled program of a real model holds memory of its own on XLA's CPU
# backend (its blocks are unrolled; docs/models.md measures an engine's with and without), so an
# engine on a laptop compiles fewer: powers of two only, and no decode window below
# COMPACT_SMALLEST_WINDOW. A prompt then pads to at most twice its length and a decode step
# attends over at most twice the positions it needs, or COMPACT_SMALLEST_WINDOW.
# A decode step's attention is a small part of it at these windows: Gemma 3's step of 8 slots (the
# slowest model's, which sets the pace) took 105 ms over 256 positions and 112 ms over 512
# (float16 caches; docs/models.md), so the 192 positions a 64-position window would spare a short
# first reply cost it a few milliseconds a step, where each window compiled is a program of tens
# of megabytes.
COMPACT_SMALLEST_WINDOW = 256


def compact_buckets(context: int, smallest: int = MIN_BUCKET) -> tuple[int, ...]:
    """Prefill lengths: powers of two times ``smallest`` below the context, and the context."""
    return _lengths(context, smallest, three_halves_from=context)


def compact_windows(context: int) -> tuple[int, ...]:
    """Decode windows: powers of two from ``COMPACT_SMALLEST_WINDOW`` below the context, and the
    context."""
    return _lengths(context, COMPACT_SMALLEST_WINDOW, three_halves_from=context)


def _lengths(context: int, smallest: int, three_halves_from: int) -> tuple[int, ...]:
    """Powers of two times ``smallest`` below the context, each from ``three_halves_from`` on
    followed by 1.5 times it (when below the context), and the context."""
    lengths = []
    length = smallest
    while length < context:
        lengths.append(length)
        if length >= three_halves_from and length * 3 // 2 < context:
            lengths.append(length * 3 // 2)
        length *= 2
    return (*lengths, context)


def sizes(name: str, sizes: Sequence[int] | None, default: tuple[int, ...], context: int) -> tuple[int, ...]:
    if sizes is None:
        return default
    if any(not isinstance(n, int) or n < 1 or n > context for n in sizes):
        raise ValueError(f"{name} must be integers within 1..{context}, got {list(sizes)}.")
    return tuple(sorted({*sizes, context}))  # The context always: every request fits.


# --- The engine -------------------------------------------------------------------------------
