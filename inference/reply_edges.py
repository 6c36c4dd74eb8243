"""A reply's edges carry no tell: leading and trailing whitespace is dropped as it streams.

A model that starts every reply with a space (one did, in 82 of 82 replies) is named by it before
the vote. The text is normalised where it is generated, so the stream, the stored reply and the
exports all agree. Streaming cannot know whether whitespace is trailing until more text comes,
so a whitespace run at the end of what has arrived is held back until text follows it, and never
sent if none does. Whitespace inside the reply is kept as written. Plain Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def without_edge_whitespace(deltas: Iterable[str]) -> Iterator[str]:
    """``deltas`` with the reply's leading and trailing whitespace removed. An empty delta (the
    engine's "no text this interval" tick) passes through as it is; a delta that becomes empty
    also comes out empty, and counts as such a tick."""
    started = False
    held = ""
    for delta in deltas:
        if not delta:
            yield delta
            continue
        if not started:
            delta = delta.lstrip()
            if not delta:
                yield ""
                continue
            started = True
        text = held + delta
        body = text.rstrip()
        held = text[len(body) :]
        yield body
