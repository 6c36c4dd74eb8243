"""Automatic judging of a model reply against the expected calendar API call.

The arena's seed task (shared/scenario.md) asks a model to turn a request into ONE line of
executable Python calling::

    action.add_calendar_entry(title, date="YYYY-MM-DD", time="HH:MM", duration=m)
    action.remove_calendar_entry(title, date, time)

Humans rate each reply ✓ (correct), 🍄 (one mistake), 🔥 (garbage). This module produces the
same judgement automatically, for evaluating the bundled demo models and for pre-filling
ratings, so it must agree with the scenario's rules of equivalence:

* ``duration=60*3`` equals ``duration=180`` (integer arithmetic is evaluated, safely, on the
  syntax tree: the reply is never executed or ``eval``-ed);
* single or double quotes, spacing, keyword or positional arguments (bound by the API
  signature) do not matter;
* a title differing only in case is configurable (``case_sensitive_title``);
* anything around the call, even a polite "Sure, here it is:" or a Markdown code fence, is the
  mistake "chatter around the call": the system prompt asks for a single line of code.

A verdict is ``"correct"`` (no mistake), ``"mistake"`` (one or two) or ``"garbage"`` (no
recognisable API call, or three or more mistakes at once, as the scenario's 🔥 says).

Pure Python on purpose (no Django, no keras): the training script, the tests and the web
process all import it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from votes.checkers import matching_paren

Verdict = Literal["correct", "mistake", "garbage"]

# Mistake labels: fixed strings so that callers can count and compare them.
WRONG_API = "wrong API"
WRONG_TITLE = "wrong title"
WRONG_DATE = "wrong date"
WRONG_DATE_FORMAT = "wrong date format"
WRONG_TIME = "wrong time"
WRONG_TIME_FORMAT = "wrong time format"
WRONG_DURATION = "wrong duration"
MISSING_ARGUMENT = "missing argument"
EXTRA_ARGUMENT = "extra argument"
CHATTER = "chatter around the call"
EXTRA_PARENTHESIS = "extra parenthesis"
EXTRA_CALL = "extra call"
NO_CALL = "no recognisable API call"

MISTAKE_LABELS: tuple[str, ...] = (
    WRONG_API,
    WRONG_TITLE,
    WRONG_DATE,
    WRONG_DATE_FORMAT,
    WRONG_TIME,
    WRONG_TIME_FORMAT,
    WRONG_DURATION,
    MISSING_ARGUMENT,
    EXTRA_ARGUMENT,
    CHATTER,
    EXTRA_PARENTHESIS,
    EXTRA_CALL,
    NO_CALL,
)

GARBAGE_THRESHOLD = 3  # "three or more mistakes at once" is garbage (🔥), per the scenario.

# The API's signatures: positional arguments bind in this order.
SIGNATURES: dict[str, tuple[str, ...]] = {
    "add_calendar_entry": ("title", "date", "time", "duration"),
    "remove_calendar_entry": ("title", "date", "time"),
}
RECEIVER = "action"

# A call "looks like" the API when its (possibly dotted) name mentions the calendar or an entry,
# or is a method of ``action``: "action.create_event(...)" is a wrong API, not garbage.
_CALL_START = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\s*\.\s*)*[A-Za-z_]\w*)\s*\(")
_API_LIKE = re.compile(r"calendar|entry|event|appointment", re.IGNORECASE)

_MONTH_NAMES = (
    ("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",),
    ("jun", "june"), ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"),
    ("oct", "october"), ("nov", "november"), ("dec", "december"),
)  # fmt: skip
_MONTHS = {name: number for number, names in enumerate(_MONTH_NAMES, start=1) for name in names}


@dataclass(frozen=True)
class ParsedCall:
    """One API call found in a reply, with its arguments bound to the signature's names.

    ``title``, ``date`` and ``time`` are the string literals as written; ``duration`` is the
    integer value of the duration expression (``60*3`` gives 180). A field is None when the
    argument is absent or not a literal the checker can read (a variable, an f-string...);
    ``missing`` and ``unreadable`` say which. ``start``/``end`` locate the call in the reply so
    that chatter around it can be found.
    """

    api: str  # function name, e.g. "add_calendar_entry"
    receiver: str | None  # "action" for action.add_calendar_entry(...), None for a bare call
    title: str | None
    date: str | None
    time: str | None
    duration: int | None
    missing: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # unknown keywords, surplus positional arguments, duplicates
    unreadable: tuple[str, ...] = ()
    source: str = ""
    start: int = 0
    end: int = 0
    extra_parenthesis: bool = False

    @property
    def known_api(self) -> bool:
        """Whether this is one of the two API functions, called on ``action``."""
        return self.api in SIGNATURES and self.receiver == RECEIVER


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one reply, the mistake labels behind it and a readable explanation each."""

    verdict: Verdict
    mistakes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    call: ParsedCall | None = None

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"


# --- Parsing ---------------------------------------------------------------------------------


class _Unreadable(Exception):
    """An argument that is not a literal the checker can evaluate without running code."""


def _int_value(node: ast.AST) -> int:
    """Evaluate integer arithmetic (``60*3``, ``90``, ``(1+2)*60``) on the syntax tree only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        value = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _int_value(node.operand)
        value = -operand if isinstance(node.op, ast.USub) else operand
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.FloorDiv):
        left, right = _int_value(node.left), _int_value(node.right)
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        elif isinstance(node.op, ast.Mult):
            if abs(left) > 10**6 or abs(right) > 10**6:  # no giant numbers from hostile input
                raise _Unreadable
            value = left * right
        elif right == 0:
            raise _Unreadable
        elif isinstance(node.op, ast.Div):
            value = left / right
        else:
            value = left // right
    else:
        raise _Unreadable
    if isinstance(value, float):
        if not value.is_integer():
            raise _Unreadable
        value = int(value)
    return value


def _str_value(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise _Unreadable


def _dotted_name(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _bind(call: ast.Call, api: str) -> tuple[dict[str, ast.AST], tuple[str, ...], tuple[str, ...]]:
    """Bind positional and keyword arguments to the API's parameter names.

    An unknown function (a wrong API such as ``action.create_event``) binds like
    ``add_calendar_entry``, so that its arguments can still be compared; only title, date and
    time are then required. Returns (bound, missing, extra).
    """
    params = SIGNATURES.get(api, SIGNATURES["add_calendar_entry"])
    bound: dict[str, ast.AST] = {}
    extra: list[str] = []
    for index, arg in enumerate(call.args):
        if index < len(params) and not isinstance(arg, ast.Starred):
            bound[params[index]] = arg
        else:
            extra.append(f"positional argument {index + 1}")
    for keyword in call.keywords:
        name = keyword.arg
        if name is None:
            extra.append("**kwargs")
        elif name in bound:
            extra.append(f"{name} given twice")
        elif name not in params:
            extra.append(name)
        else:
            bound[name] = keyword.value
    wanted = params if api in SIGNATURES else ("title", "date", "time")
    missing = tuple(name for name in wanted if name not in bound)
    return bound, missing, tuple(extra)


def _parse_at(text: str, match: re.Match[str]) -> ParsedCall | None:
    """Parse the call whose name ``match`` found, or None if it is not a readable call."""
    open_index = match.end() - 1
    close_index = matching_paren(text, open_index)
    if close_index is None:
        return None
    source = text[match.start() : close_index + 1]
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError:
        return None
    call = tree.body
    if not isinstance(call, ast.Call):
        return None
    name = _dotted_name(call.func)
    if not name:
        return None
    api = name[-1]
    receiver = ".".join(name[:-1]) or None
    if not (api in SIGNATURES or receiver == RECEIVER or _API_LIKE.search(api)):
        return None
    bound, missing, extra = _bind(call, api)
    values: dict[str, str | int | None] = {}
    unreadable: list[str] = []
    for param in ("title", "date", "time", "duration"):
        node = bound.get(param)
        if node is None:
            values[param] = None
            continue
        try:
            values[param] = _int_value(node) if param == "duration" else _str_value(node)
        except (_Unreadable, RecursionError):
            values[param] = None
            unreadable.append(param)
    end = close_index + 1
    rest = text[end:]
    # A ")" right after the call is extra, unless it closes a "(" opened before the call
    # (as in "print(action.add_calendar_entry(...))", which is chatter, not a typo).
    closing = re.match(r"[\s)]*", rest).group(0)  # type: ignore[union-attr]
    before = text[: match.start()]
    surplus = closing.count(")") - max(before.count("(") - before.count(")"), 0)
    extra_parenthesis = surplus > 0
    if extra_parenthesis:
        end += closing.rindex(")") + 1
    return ParsedCall(
        api=api,
        receiver=receiver,
        title=values["title"],  # type: ignore[arg-type]
        date=values["date"],  # type: ignore[arg-type]
        time=values["time"],  # type: ignore[arg-type]
        duration=values["duration"],  # type: ignore[arg-type]
        missing=missing,
        extra=extra,
        unreadable=tuple(unreadable),
        source=source,
        start=match.start(),
        end=end,
        extra_parenthesis=extra_parenthesis,
    )


def find_calls(text: str) -> list[ParsedCall]:
    """Every recognisable API call in ``text``, in order, without overlaps."""
    calls: list[ParsedCall] = []
    position = 0
    while True:
        match = _CALL_START.search(text, position)
        if match is None:
            return calls
        parsed = _parse_at(text, match)
        if parsed is None:
            position = match.end()  # e.g. "print(" wrapping a call: look inside it
        else:
            calls.append(parsed)
            position = parsed.end


def parse_call(text: str) -> ParsedCall | None:
    """The first recognisable API call in ``text``, with normalised fields; None if there is none."""
    calls = find_calls(text)
    return calls[0] if calls else None


# --- Comparing -------------------------------------------------------------------------------


def parse_date(value: str) -> tuple[int, int, int] | None:
    """(year, month, day) of a date written in a common format, or None.

    Used to tell a right date in the wrong format ("11/11/2024") from a wrong date.
    """
    value = value.strip()
    patterns: Sequence[tuple[str, str]] = (
        (r"(\d{4})-(\d{1,2})-(\d{1,2})", "ymd"),
        (r"(\d{4})/(\d{1,2})/(\d{1,2})", "ymd"),
        (r"(\d{1,2})/(\d{1,2})/(\d{4})", "mdy"),
        (r"(\d{1,2})-(\d{1,2})-(\d{4})", "mdy"),
        (r"([A-Za-z]+)\.? (\d{1,2}),? (\d{4})", "Mdy"),
        (r"(\d{1,2}) ([A-Za-z]+)\.?,? (\d{4})", "dMy"),
    )
    for pattern, order in patterns:
        found = re.fullmatch(pattern, value)
        if not found:
            continue
        a, b, c = found.groups()
        try:
            if order == "ymd":
                return int(a), int(b), int(c)
            if order == "mdy":
                return int(c), int(a), int(b)
            if order == "Mdy":
                return int(c), _MONTHS[a.lower()], int(b)
            return int(c), _MONTHS[b.lower()], int(a)
        except KeyError:
            return None
    return None


def parse_time(value: str) -> tuple[int, int] | None:
    """(hour, minute) on a 24-hour clock of "17:00", "5PM", "5:30 pm", "17:00:00", or None."""
    value = value.strip().lower()
    if value == "noon":
        return 12, 0
    found = re.fullmatch(r"(\d{1,2})(?::(\d{2}))?(?::\d{2})?\s*(am|pm|a\.m\.|p\.m\.)?", value)
    if not found:
        return None
    hour, minute, half = int(found.group(1)), int(found.group(2) or 0), found.group(3)
    if found.group(2) is None and half is None:
        return None  # a bare number is not a time
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half.startswith("p") else 0)
    if hour > 23 or minute > 59:
        return None
    return hour, minute


def _same_title(a: str, b: str, case_sensitive: bool) -> bool:
    return a == b if case_sensitive else a.casefold() == b.casefold()


def _compare(reply: ParsedCall, expected: ParsedCall, case_sensitive_title: bool) -> list[tuple[str, str]]:
    """Mistakes of one call against the expected one, as (label, detail) pairs."""
    found: list[tuple[str, str]] = []
    if reply.api != expected.api or reply.receiver != expected.receiver:
        called = f"{reply.receiver}.{reply.api}" if reply.receiver else reply.api
        found.append((WRONG_API, f"called {called}(), expected {expected.receiver}.{expected.api}()"))
    if reply.missing:
        found.append((MISSING_ARGUMENT, f"missing {', '.join(reply.missing)}"))
    if reply.extra:
        found.append((EXTRA_ARGUMENT, f"unexpected {', '.join(reply.extra)}"))
    if "title" not in reply.missing and not (
        reply.title is not None
        and expected.title is not None
        and _same_title(reply.title, expected.title, case_sensitive_title)
    ):
        found.append((WRONG_TITLE, f"title {reply.title!r}, expected {expected.title!r}"))
    if "date" not in reply.missing and reply.date != expected.date:
        got = parse_date(reply.date) if reply.date is not None else None
        want = parse_date(expected.date) if expected.date is not None else None
        if got is not None and got == want:
            found.append((WRONG_DATE_FORMAT, f"date {reply.date!r}, expected {expected.date!r} (YYYY-MM-DD)"))
        else:
            part = ""
            if got and want:
                part = " (year)" if got[1:] == want[1:] else " (month/day)" if got[0] == want[0] else ""
            found.append((WRONG_DATE, f"date {reply.date!r}, expected {expected.date!r}{part}"))
    if "time" not in reply.missing and reply.time != expected.time:
        got_time = parse_time(reply.time) if reply.time is not None else None
        want_time = parse_time(expected.time) if expected.time is not None else None
        if got_time is not None and got_time == want_time:
            found.append((WRONG_TIME_FORMAT, f"time {reply.time!r}, expected {expected.time!r} (HH:MM)"))
        else:
            found.append((WRONG_TIME, f"time {reply.time!r}, expected {expected.time!r}"))
    # The duration only matters for a new entry; "missing" already covers its absence.
    if (
        expected.api == "add_calendar_entry"
        and "duration" not in reply.missing
        and reply.api == expected.api
        and reply.duration != expected.duration
    ):
        found.append((WRONG_DURATION, f"duration {reply.duration!r}, expected {expected.duration!r}"))
    return found


def _chatter(reply: str, calls: Sequence[ParsedCall]) -> str:
    """The reply's text outside the calls, whitespace and a trailing semicolon aside."""
    pieces = []
    position = 0
    for call in calls:
        pieces.append(reply[position : call.start])
        position = call.end
    pieces.append(reply[position:])
    outside = " ".join(piece.strip() for piece in pieces).strip()
    return outside.removesuffix(";").strip()


def check_reply(reply: str, expected: str, *, case_sensitive_title: bool = False) -> CheckResult:
    """Judge ``reply`` against the ``expected`` API call (itself a reply that would be correct).

    The call compared is the first one calling the expected function, else the first
    recognisable one; any further call is the mistake "extra call". Raises ValueError if
    ``expected`` is not a readable API call: that is a bug in the task, not in the reply.
    """
    wanted = parse_call(expected)
    if wanted is None or not wanted.known_api or wanted.missing or wanted.unreadable or wanted.extra:
        raise ValueError(f"The expected output is not a complete API call: {expected!r}")
    calls = find_calls(reply)
    if not calls:
        return CheckResult("garbage", [NO_CALL], ["the reply contains no calendar API call"])
    main = next((c for c in calls if c.api == wanted.api and c.receiver == wanted.receiver), calls[0])
    found = _compare(main, wanted, case_sensitive_title)
    if len(calls) > 1:
        found.append((EXTRA_CALL, f"{len(calls)} calls, expected one"))
    if any(call.extra_parenthesis for call in calls):
        found.append((EXTRA_PARENTHESIS, "an extra ')' after the call"))
    outside = _chatter(reply, calls)
    if outside:
        shown = outside if len(outside) <= 60 else outside[:57] + "..."
        found.append((CHATTER, f"text around the call: {shown!r}"))
    mistakes = [label for label, _ in found]
    details = [detail for _, detail in found]
    if not mistakes:
        verdict: Verdict = "correct"
    elif len(mistakes) >= GARBAGE_THRESHOLD:
        verdict = "garbage"
    else:
        verdict = "mistake"
    return CheckResult(verdict, mistakes, details, main)
