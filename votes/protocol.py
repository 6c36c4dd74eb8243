"""The battle websocket protocol: parsing client frames and building server frames.

Plain Python, no Django: the consumer feeds raw text in and sends the dicts built here out.
docs/protocol.md documents every frame; keep the two in step.
"""

import json
from dataclasses import dataclass
from typing import Any

VOTE_CHOICES = ("a", "b", "tie", "both_bad")


class ArenaError(Exception):
    """A refused request. `code` is stable for clients; `message` is shown to the voter.

    Messages never name a model: they reach the browser before the vote.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class PromptFrame:
    text: str


@dataclass(frozen=True)
class VoteFrame:
    choice: str


@dataclass(frozen=True)
class StopFrame:
    """Stop the replies being generated: one side's, or both when side is None."""

    side: str | None


@dataclass(frozen=True)
class SyncFrame:
    """The client lost track (a gap in delta numbers): it asks for the full state again."""


ClientFrame = PromptFrame | VoteFrame | StopFrame | SyncFrame


def parse_client_frame(raw: str | None, *, max_bytes: int, max_prompt_chars: int) -> ClientFrame:
    """Validate one text frame from the browser, or raise ArenaError saying what is wrong."""
    if raw is None:
        raise ArenaError("bad_frame", "Frames must be JSON text, not binary.")
    if len(raw.encode("utf-8")) > max_bytes:
        raise ArenaError("frame_too_large", f"Frames are limited to {max_bytes} bytes.")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        raise ArenaError("bad_json", "The frame is not valid JSON.") from None
    if not isinstance(data, dict):
        raise ArenaError("bad_frame", 'A frame must be a JSON object with a "type" field.')
    frame_type = data.get("type")
    if frame_type == "prompt":
        text = data.get("text")
        if not isinstance(text, str):
            raise ArenaError("bad_frame", 'A prompt frame needs a "text" string.')
        text = text.strip()
        if not text:
            raise ArenaError("empty_prompt", "The prompt is empty.")
        if len(text) > max_prompt_chars:
            raise ArenaError(
                "prompt_too_long", f"The prompt is {len(text)} characters; the limit is {max_prompt_chars}."
            )
        return PromptFrame(text=text)
    if frame_type == "vote":
        choice = data.get("choice")
        if choice not in VOTE_CHOICES:
            raise ArenaError("bad_frame", f'A vote frame needs "choice", one of {", ".join(VOTE_CHOICES)}.')
        return VoteFrame(choice=choice)
    if frame_type == "stop":
        side = data.get("side")
        if side not in ("a", "b", None):
            raise ArenaError("bad_frame", 'A stop frame\'s "side" is "a", "b", or absent for both.')
        return StopFrame(side=side)
    if frame_type == "sync":
        return SyncFrame()
    if not isinstance(frame_type, str):
        raise ArenaError("bad_frame", 'A frame needs a "type" string.')
    raise ArenaError("unknown_type", f"Unknown frame type {frame_type[:40]!r}.")


def error_frame(error: ArenaError) -> dict[str, Any]:
    return {"type": "error", "code": error.code, "message": error.message}


def delta_frame(side: str, turn: int, seq: int, text: str) -> dict[str, Any]:
    return {"type": "delta", "side": side, "turn": turn, "seq": seq, "text": text}


def end_frame(
    side: str,
    turn: int,
    *,
    seq: int,
    status: str,
    text: str,
    stats: dict[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "end",
        "side": side,
        "turn": turn,
        "seq": seq,
        "status": status,
        "text": text,
        "stats": stats or {},
    }
    if error:
        frame["error"] = error
    return frame
