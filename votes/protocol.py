"""The battle websocket protocol: parsing client frames and building server frames.

Plain Python, no Django: the consumer feeds raw text in and sends the dicts built here out.
docs/protocol.md documents every frame; keep the two in step.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

VOTE_CHOICES = ("a", "b", "tie", "both_bad")
VOTE_STAGES = ("first_try", "after_fix")
RATINGS = ("correct", "mistake", "fixed", "garbage")
SIDES = ("a", "b")
MODES = ("anonymous", "named", "direct")
MAX_TURN_INDEX = 10_000
# What no database column can hold as text: NUL (PostgreSQL refuses it) and a surrogate code
# point on its own (JSON's "\ud800" escape; it has no UTF-8 form, so no database can store it).
NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


class ArenaError(Exception):
    """A refused request. `code` is stable for clients; `message` is shown to the voter.

    Messages never name a model: they reach the browser before the vote.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class StartFrame:
    """Start a battle: on a task (its slug) or, when task is None, as free chat; anonymous (the
    models drawn), named (the voter picks two) or a direct chat (one)."""

    task: str | None
    mode: str = "anonymous"
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptFrame:
    text: str
    side: str | None = None  # One side only (a correction; the other is paused), or both.


@dataclass(frozen=True)
class VoteFrame:
    choice: str
    stage: str | None = None  # first_try or after_fix; None: the next stage.


@dataclass(frozen=True)
class RateFrame:
    side: str
    turn: int
    rating: str | None  # None clears the rating.


@dataclass(frozen=True)
class RegenerateFrame:
    side: str


@dataclass(frozen=True)
class EndFrame:
    """End the battle: the models are revealed."""


@dataclass(frozen=True)
class StopFrame:
    """Stop the replies being generated: one side's, or both when side is None."""

    side: str | None


@dataclass(frozen=True)
class SyncFrame:
    """The client lost track (a gap in delta numbers): it asks for the full state again."""


ClientFrame = StartFrame | PromptFrame | VoteFrame | RateFrame | RegenerateFrame | EndFrame | StopFrame | SyncFrame


def _side(data: dict[str, Any], frame_type: str, *, optional: bool) -> str | None:
    side = data.get("side")
    if side in SIDES or (optional and side is None):
        return side
    allowed = '"a", "b", or absent for both' if optional else '"a" or "b"'
    raise ArenaError("bad_frame", f'A {frame_type} frame\'s "side" is {allowed}.')


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
    except RecursionError:  # The parser recurses per level: [[[[...]]]] within the size limit.
        raise ArenaError("bad_json", "The frame is nested too deeply; frames are flat JSON objects.") from None
    if not isinstance(data, dict):
        raise ArenaError("bad_frame", 'A frame must be a JSON object with a "type" field.')
    frame_type = data.get("type")
    if frame_type == "start":
        task = data.get("task")
        if task is not None and (not isinstance(task, str) or not 0 < len(task) <= 60 or NOT_TEXT.search(task)):
            raise ArenaError("bad_frame", "A start frame's \"task\" is a task's short name, or absent for free chat.")
        mode = data.get("mode", "anonymous")
        if mode not in MODES:
            raise ArenaError("bad_frame", f'A start frame\'s "mode" is one of {", ".join(MODES)}, or absent.')
        models = data.get("models", [])
        if (
            not isinstance(models, list)
            or len(models) > 2
            or not all(isinstance(name, str) and 0 < len(name) <= 100 and not NOT_TEXT.search(name) for name in models)
        ):
            raise ArenaError("bad_frame", 'A start frame\'s "models" is a list of at most two model names.')
        return StartFrame(task=task, mode=mode, models=tuple(models))
    if frame_type == "prompt":
        text = data.get("text")
        if not isinstance(text, str):
            raise ArenaError("bad_frame", 'A prompt frame needs a "text" string.')
        if NOT_TEXT.search(text):
            raise ArenaError(
                "not_text", "The prompt holds a NUL or a lone surrogate, which are not text: remove it and send again."
            )
        text = text.strip()
        if not text:
            raise ArenaError("empty_prompt", "The prompt is empty.")
        if len(text) > max_prompt_chars:
            raise ArenaError(
                "prompt_too_long", f"The prompt is {len(text)} characters; the limit is {max_prompt_chars}."
            )
        return PromptFrame(text=text, side=_side(data, "prompt", optional=True))
    if frame_type == "vote":
        choice = data.get("choice")
        if choice not in VOTE_CHOICES:
            raise ArenaError("bad_frame", f'A vote frame needs "choice", one of {", ".join(VOTE_CHOICES)}.')
        stage = data.get("stage")
        if stage is not None and stage not in VOTE_STAGES:
            raise ArenaError("bad_frame", f'A vote frame\'s "stage" is one of {", ".join(VOTE_STAGES)}, or absent.')
        return VoteFrame(choice=choice, stage=stage)
    if frame_type == "rate":
        turn = data.get("turn")
        if not isinstance(turn, int) or isinstance(turn, bool) or not 0 <= turn <= MAX_TURN_INDEX:
            raise ArenaError("bad_frame", 'A rate frame needs "turn", the reply\'s turn number (from 0).')
        rating = data.get("rating")
        if rating is not None and rating not in RATINGS:
            raise ArenaError("bad_frame", f'A rate frame\'s "rating" is one of {", ".join(RATINGS)}, or null.')
        side = _side(data, "rate", optional=False)
        assert side is not None
        return RateFrame(side=side, turn=turn, rating=rating)
    if frame_type == "regenerate":
        side = _side(data, "regenerate", optional=False)
        assert side is not None
        return RegenerateFrame(side=side)
    if frame_type == "end":
        return EndFrame()
    if frame_type == "stop":
        return StopFrame(side=_side(data, "stop", optional=True))
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
    cut: bool = False,
) -> dict[str, Any]:
    frame: dict[str, Any] = {
        "type": "end",
        "side": side,
        "turn": turn,
        "seq": seq,
        "status": status,
        "text": text,
        "stats": stats or {},
        "cut": cut,
    }
    if error:
        frame["error"] = error
    return frame
