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


# A family's habitual prefix: the chat template's own markers or role line, which a model of that
# family may echo at the start of its reply (inference.chat_templates shows each template). Only
# template artefacts: never words a reply may mean ("Sure!"), which are the model's answer. Each
# is dropped wherever it opens the reply (after whitespace), again while one follows another.
FAMILY_PREFIXES: dict[str, tuple[str, ...]] = {
    "gemma": ("<start_of_turn>", "model\n"),  # The prompt ends "<start_of_turn>model\n".
    "llama3": ("<|start_header_id|>", "assistant<|end_header_id|>", "assistant\n"),
    "chatml": ("<|im_start|>", "assistant\n"),  # The prompt ends "<|im_start|>assistant\n".
    "mistral": ("[/INST]",),
    "vicuna": ("ASSISTANT:",),
    "completion": ("Assistant:",),  # A base model repeating its transcript's speaker label.
}


def without_family_prefix(family: str, deltas: Iterable[str]) -> Iterator[str]:
    """``deltas`` without ``family``'s habitual prefix (FAMILY_PREFIXES) at the reply's start.

    The start is held back (as empty deltas, the engine's ticks) while it could still become a
    prefix, and released as soon as it cannot; one delta comes out per delta in, plus one at the
    end if the reply ended while held. Whitespace is left to ``without_edge_whitespace``, which
    runs after this. Raises ValueError for an unknown family.
    """
    if family not in FAMILY_PREFIXES:
        raise ValueError(f"Unknown model family {family!r}; expected one of {', '.join(FAMILY_PREFIXES)}.")
    prefixes = FAMILY_PREFIXES[family]
    held: str | None = ""  # None once the start is decided.
    for delta in deltas:
        if held is None:
            yield delta
            continue
        held += delta
        start = held.lstrip()
        while matched := next((p for p in prefixes if start.startswith(p)), None):
            start = start[len(matched) :].lstrip()
            held = start
        if any(p.startswith(start) for p in prefixes):  # Could still be one (or is empty).
            yield ""
            continue
        yield held
        held = None
    if held:
        yield held


def without_family_prefix_text(family: str, text: str) -> str:
    """A whole reply without ``family``'s habitual prefix (see ``without_family_prefix``)."""
    return "".join(without_family_prefix(family, [text]))
