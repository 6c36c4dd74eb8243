"""Websocket voters for the load test (manage.py loadtest): plain asyncio, no Django.

Each voter plays a whole battle the way the page does: it opens the arena page for a session
cookie, connects the battle websocket, sends a prompt to both sides, reads both streams, votes,
corrects one side only, reads its new reply, votes again and ends the battle. It records every
delta it receives, checks that each reply's deltas arrive numbered 0, 1, 2, … with no gap or
repeat, and measures how long each frame took from the worker's publish (its ``sent_at``, which
workers add when ``ARENA_TRACE_FRAMES`` is on) to arriving here: the web tier's share (Redis
channel layer, daphne, websocket) of a token's way to the voter.
"""

import asyncio
import json
import math
import random
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any

import websockets

PROMPT = "Add a meeting with Fred on Nov 11 at 5PM."
CORRECTION = "That is wrong: the meeting is at 6PM, not 5PM."
FRAME_TIMEOUT_S = 120.0


@dataclass
class ReplyRecord:
    side: str
    turn: int
    delivered: str = ""
    next_seq: int = 0
    status: str = ""
    saved: str = ""  # the reply as saved, from the revealed state


@dataclass
class VoterResult:
    replies: dict[tuple[int, str], ReplyRecord] = field(default_factory=dict)
    # The web tier's added latency of each frame: from leaving the worker (read by its frame
    # relay) to arriving here; and its two parts, the Redis channel layer (to daphne's relaying
    # it) and daphne to this voter.
    latencies_s: list[float] = field(default_factory=list)
    layer_latencies_s: list[float] = field(default_factory=list)
    socket_latencies_s: list[float] = field(default_factory=list)
    # Before that, the worker's hand-off: from its publish call to its relay reading the frame;
    # and the whole way, publish call to arrival.
    handoff_latencies_s: list[float] = field(default_factory=list)
    end_to_end_latencies_s: list[float] = field(default_factory=list)
    order_violations: int = 0
    votes: int = 0
    errors: list[str] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)
    finished: bool = False


class ErrorFrame(RuntimeError):
    """The arena answered a frame with an error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"error frame {code}: {message}")
        self.code = code


def session_cookie(base_url: str) -> str:
    """GET the arena page, as a browser does first (it creates the session): the Cookie header."""
    with urllib.request.urlopen(base_url.rstrip("/") + "/", timeout=60) as response:
        cookie = SimpleCookie()
        for header in response.headers.get_all("Set-Cookie") or []:
            cookie.load(header)
    return "; ".join(f"{name}={morsel.value}" for name, morsel in cookie.items())


class Voter:
    frame_timeout_s = FRAME_TIMEOUT_S  # Longer than this without a frame: the voter gives up.

    def __init__(self, base_url: str, index: int, rng: random.Random) -> None:
        self.base_url = base_url.rstrip("/")
        self.index = index
        self.rng = rng
        self.result = VoterResult()
        self.socket: Any = None
        # What the voter is doing, its battle and the last frame it got: a timeout names them.
        self.step = "connecting"
        self.battle_id: str | None = None
        self.last_frame = "none"

    async def play(self) -> VoterResult:
        try:
            cookie = await asyncio.to_thread(session_cookie, self.base_url)
            ws_url = self.base_url.replace("http", "ws", 1) + "/ws/battle/"
            headers = {"Cookie": cookie, "Origin": self.base_url}
            async with websockets.connect(ws_url, additional_headers=headers, max_size=2**22) as socket:
                self.socket = socket
                await self.battle()
            self.result.finished = True
        except TimeoutError:
            self.result.errors.append(
                f"voter {self.index}: no frame for {self.frame_timeout_s:.0f} s while {self.step} "
                f"(battle {self.battle_id}, last frame {self.last_frame})"
            )
        except Exception as error:  # Reported, never raised: one voter's failure is a finding.
            self.result.errors.append(f"voter {self.index}: {type(error).__name__}: {error} (while {self.step})")
        return self.result

    async def battle(self) -> None:
        self.step = "sending the prompt"
        await self.send({"type": "prompt", "text": PROMPT})
        await self.read_until(lambda f: f["type"] == "prompt")
        await self.read_replies(turn=0, sides={"a", "b"})
        self.step = "voting after turn 0"
        await self.vote()
        side = self.rng.choice("ab")
        self.step = f"correcting side {side}"
        await self.send({"type": "prompt", "text": CORRECTION, "side": side})
        await self.read_until(lambda f: f["type"] == "prompt")
        await self.read_replies(turn=1, sides={side})
        self.step = "voting after turn 1"
        await self.vote()
        self.step = "ending the battle"
        await self.send({"type": "end"})
        revealed = (await self.read_until(lambda f: f["type"] == "revealed"))[-1]
        self.result.models = dict(revealed.get("models") or {})
        for turn in revealed["turns"]:
            for reply_side, reply in turn["replies"].items():
                record = self.result.replies.get((turn["turn"], reply_side))
                if record is not None:
                    record.saved = reply["text"]

    async def vote(self) -> None:
        await self.send({"type": "vote", "choice": self.rng.choice(["a", "b", "tie", "both_bad"])})
        await self.read_until(lambda f: f["type"] == "voted")
        self.result.votes += 1

    async def send(self, frame: dict[str, Any]) -> None:
        await self.socket.send(json.dumps(frame))

    async def read_replies(self, turn: int, sides: set[str]) -> None:
        for side in sides:
            self.result.replies[(turn, side)] = ReplyRecord(side=side, turn=turn)
        ended: set[str] = set()
        while ended != sides:
            self.step = f"reading turn {turn} replies (ended: {', '.join(sorted(ended)) or 'none'})"
            frame = await self.read()
            if frame["type"] == "end" and frame["turn"] == turn:
                self.result.replies[(turn, frame["side"])].status = frame["status"]
                ended.add(frame["side"])

    async def read_until(self, predicate: Any) -> list[dict[str, Any]]:
        frames = []
        while True:
            frame = await self.read()
            frames.append(frame)
            if predicate(frame):
                return frames

    async def read(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.socket.recv(), self.frame_timeout_s)
        arrived = time.time()
        frame = json.loads(raw)
        self.last_frame = " ".join(f"{key}={frame[key]}" for key in ("type", "side", "turn", "seq") if key in frame)
        if frame["type"] == "battle":
            self.battle_id = frame["battle"]
        if "sent_at" in frame:
            # A worker without a relay (embedded mode) hands frames over in its publish call.
            left_worker_at = frame.get("left_worker_at", frame["sent_at"])
            self.result.end_to_end_latencies_s.append(arrived - frame["sent_at"])
            self.result.handoff_latencies_s.append(left_worker_at - frame["sent_at"])
            self.result.latencies_s.append(arrived - left_worker_at)
            if "relayed_at" in frame:
                self.result.layer_latencies_s.append(frame["relayed_at"] - left_worker_at)
                self.result.socket_latencies_s.append(arrived - frame["relayed_at"])
        if frame["type"] == "error":
            raise ErrorFrame(frame["code"], frame["message"])
        if frame["type"] == "delta":
            record = self.result.replies.get((frame["turn"], frame["side"]))
            if record is None or frame["seq"] != record.next_seq:
                self.result.order_violations += 1
            if record is not None:
                record.delivered += frame["text"]
                record.next_seq = frame["seq"] + 1
        elif frame["type"] in ("restart", "regenerating"):
            self.result.errors.append(f"voter {self.index}: unexpected {frame['type']} frame")
        return frame


async def run_voters(base_url: str, count: int, seed: int = 0) -> tuple[list[VoterResult], float]:
    """All voters at once; returns their results and the wall time of the whole run."""
    voters = [Voter(base_url, index, random.Random(seed * 100_003 + index)) for index in range(count)]
    started = time.monotonic()
    results = await asyncio.gather(*(voter.play() for voter in voters))
    return list(results), time.monotonic() - started


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass(frozen=True)
class Report:
    battles: int
    battles_finished: int
    replies: int
    tokens_delivered: int
    tokens_produced: int
    replies_not_as_saved: int
    order_violations: int
    latency_p50_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    layer_p50_ms: float
    layer_p99_ms: float
    socket_p50_ms: float
    socket_p99_ms: float
    handoff_p50_ms: float
    handoff_p99_ms: float
    end_to_end_p50_ms: float
    end_to_end_p99_ms: float
    frames_timed: int
    votes: int
    duration_s: float
    errors: list[str]

    @property
    def delivered_ratio(self) -> float:
        return self.tokens_delivered / self.tokens_produced if self.tokens_produced else float("nan")

    @property
    def votes_per_s(self) -> float:
        return self.votes / self.duration_s if self.duration_s else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {
            **{name: getattr(self, name) for name in self.__dataclass_fields__},
            "delivered_ratio": self.delivered_ratio,
            "votes_per_s": self.votes_per_s,
        }


# Report field prefix -> the VoterResult list it pools.
TIMED_PARTS = {
    "latency": "latencies_s",
    "layer": "layer_latencies_s",
    "socket": "socket_latencies_s",
    "handoff": "handoff_latencies_s",
    "end_to_end": "end_to_end_latencies_s",
}


def summarize(results: list[VoterResult], duration_s: float, count_tokens: Callable[[str, str], int]) -> Report:
    """The run's figures. Tokens are counted with each reply's own model tokenizer
    (``count_tokens(model_name, text)``): those of the text the voter received in deltas, and
    those of the reply as the worker saved it."""
    latencies = [latency for result in results for latency in result.latencies_s]
    percentiles: dict[str, float] = {}
    for part, attribute in TIMED_PARTS.items():  # each part's p50 and p99, over every voter's frames
        pooled = [latency for result in results for latency in getattr(result, attribute)]
        percentiles |= {f"{part}_p{q}_ms": percentile(pooled, q) * 1000 for q in (50, 99)}
    delivered = produced = not_as_saved = replies = 0
    for result in results:
        for record in result.replies.values():
            replies += 1
            model = result.models.get(record.side, "")
            delivered += count_tokens(model, record.delivered) if model else 0
            produced += count_tokens(model, record.saved) if model else 0
            not_as_saved += record.delivered != record.saved
    return Report(
        battles=len(results),
        battles_finished=sum(result.finished for result in results),
        replies=replies,
        tokens_delivered=delivered,
        tokens_produced=produced,
        replies_not_as_saved=not_as_saved,
        order_violations=sum(result.order_violations for result in results),
        latency_max_ms=max(latencies, default=float("nan")) * 1000,
        **percentiles,
        frames_timed=len(latencies),
        votes=sum(result.votes for result in results),
        duration_s=duration_s,
        errors=[error for result in results for error in result.errors],
    )
