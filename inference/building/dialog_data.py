"""Whole dialogs shaped like the seed scenario's, for training and measuring models that fix.

The seed's dialog (shared/scenario.md) is a first request without a year, the year stated in
the next turn, an event later the same day, a duration change, an event the next day and a
cancellation of the first entry: every reply depends on earlier turns. This module generates
such dialogs, seeded, with varied names, dates, 12-hour and 24-hour times ("5PM", "8:15 pm",
"noon"), durations ("1/2h", "3 hours") and phrasing, and with what makes a model fix:

* **mistakes where a model makes them**: at some turns the assistant's reply is wrong in one of
  the ways small models are (``MISTAKES``: a 12-hour time, chatter around the call or instead
  of it, the wrong call, a year not updated, the wrong day, a duration not changed, the wrong
  event, a date or time in another format, a parameter missing);
* **a correction** of one of three kinds (``FEEDBACK_KINDS``), the same three the evaluation
  measures: generic ("That's not right. Please fix it."), the scenario's human sentence for
  that mistake ("The time is wrong."), or the checker's reason ("Time is 08:00, expected
  20:00.");
* **the fix**, and sometimes a second wrong reply and a second correction before it;
* **decoys**: after a right reply, a false correction ("The time is wrong." when it is right),
  answered by keeping the right call.

The loss counts only the replies to imitate (``Example.trained``): right replies, fixes and
kept calls; never a mistaken reply.

Held-out items are disjoint from training by construction, not by chance: names, event titles,
dates (by week of the month: ``date_split``) and the templates of every request belong to one
split only (``SPLITS``, ``TEMPLATES``), so a held-out dialog has no person, date or sentence
template training ever showed. The seed's own six prompts use only held-out names, dates and
templates (``SEED_PROMPTS``; a test checks that training never produces one). Corrections are
the exception: the scenario's short sentences are the feedback being measured, so both splits
use them.

Pure Python (no Keras, no Django), like ``calendar_data``, whose checker, calls and templates
this shares.
"""

from __future__ import annotations

import datetime as dt
import random
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from inference.building.calendar_data import (
    DEFAULT_DURATION,
    DEFAULT_YEAR,
    MONTHS,
    PERSON_EVENTS,
    Entry,
    Example,
    add_call,
    definite,
    ordinal,
    remove_call,
)
from inference.chat_templates import ChatTurn
from votes.checkers import CheckResult, check
from votes.evaluation import DECOYS, GENERIC_CORRECTION, correction_for, human_correction

Split = Literal["train", "eval"]
FeedbackKind = Literal["generic", "human", "checker"]
FEEDBACK_KINDS: tuple[FeedbackKind, ...] = ("generic", "human", "checker")

# The checker of the seed task's scripted turns (votes/fixtures/tasks.json): the checker's
# reasons in training are the ones `evaluate --task calendar` sends as corrections.
TASK_CHECKER_OPTIONS: dict[str, object] = {
    "signature": [
        "action.add_calendar_entry(title, date, time, duration)",
        "action.remove_calendar_entry(title, date, time)",
    ],
    "case_insensitive": ["title"],
}

SEED_PROMPTS = (
    "Add a meeting with Fred on Nov 11 at 5PM",
    "The current year is 2024.",
    "I'm going to a rock concert in the evening of the same day at 8pm. Add a calendar entry for that.",
    "Set the duration to 3 hours.",
    "Add a meeting with Paul on the next day at 8am. 1/2h.",
    "Cancel the meeting with Fred.",
)


def judge(reply: str, expected: str) -> CheckResult:
    """``reply`` judged as the seed task's turns judge it."""
    return check("python_call", expected, reply, TASK_CHECKER_OPTIONS)


# --- What each split may use ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pools:
    """The names, events and request phrasings of one split (its dates: ``date_split``)."""

    split: Split
    names: tuple[str, ...]
    events: tuple[tuple[str, str], ...]  # (how a request says it, its title)
    phrasing: int  # 0: the training templates of every request kind, 1: the held-out ones


SPLITS: dict[Split, Pools] = {
    "train": Pools(
        split="train",
        names=(
            "Anna",
            "Maria",
            "John",
            "Li",
            "Sofia",
            "Emma",
            "Noah",
            "Lucas",
            "Chloe",
            "Ravi",
            "Tom",
            "Sara",
            "Mia",
            "Karim",
            "Alice",
            "Ben",
            "David",
            "Elena",
            "Felix",
            "Grace",
            "Igor",
            "Julia",
            "Kevin",
            "Laura",
            "Marco",
            "Nina",
            "Oscar",
            "Rosa",
            "Sam",
            "Victor",
            "Wendy",
            "Zoe",
        ),
        events=(
            ("the dentist", "Dentist"),
            ("a dentist appointment", "Dentist Appointment"),
            ("a team lunch", "Team Lunch"),
            ("a football match", "Football Match"),
            ("a piano lesson", "Piano Lesson"),
            ("a birthday party", "Birthday Party"),
            ("a doctor visit", "Doctor Visit"),
            ("the book club", "Book Club"),
            ("a haircut", "Haircut"),
            ("a flight to Paris", "Flight to Paris"),
            ("a tennis lesson", "Tennis Lesson"),
            ("a school play", "School Play"),
            ("a project review", "Project Review"),
            ("a gym session", "Gym Session"),
            ("a car service", "Car Service"),
            ("a movie night", "Movie Night"),
            ("a pop concert", "Pop Concert"),
            ("a swimming lesson", "Swimming Lesson"),
            ("a board meeting", "Board Meeting"),
            ("a wine tasting", "Wine Tasting"),
        ),
        phrasing=0,
    ),
    "eval": Pools(
        split="eval",
        names=("Fred", "Paul", "Omar", "Yuki", "Clara", "Hugo", "Priya", "Tariq", "Ines", "Hana", "Quentin", "Ugo"),
        events=(
            ("a rock concert", "Rock Concert"),
            ("a yoga class", "Yoga Class"),
            ("a job interview", "Job Interview"),
            ("a parent meeting", "Parent Meeting"),
            ("a jazz concert", "Jazz Concert"),
            ("the vet", "Vet"),
            ("a chess club", "Chess Club"),
            ("a guitar lesson", "Guitar Lesson"),
        ),
        phrasing=1,
    ),
}

# Dates: a held-out date is one whose week of its month (days 1-7, 8-14, 15-21, 22-27) is held
# out: about one week in four, and the seed's (November 8-14). Every month and every day of the
# month appears in training, only never on a held-out date.
SEED_WEEK = (11, 1)


def date_split(date: dt.date) -> Split:
    week = (date.month, (date.day - 1) // 7)
    return "eval" if week == SEED_WEEK or zlib.crc32(f"{week}".encode()) % 4 == 0 else "train"


# Request templates by kind: (training templates, held-out templates). Fields: {subject} (how
# the request names the event), {date}, {when} ("at 5PM"), {phrase} (" for 3 hours" or ""),
# {sentence} (" 3 hours." or ""), {amount} ("3 hours"), {target} ("the meeting with Fred"),
# {year}, {part} ("evening").
TEMPLATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "first": (
        (
            "Schedule {subject} on {date} {when}{phrase}.",
            "Put {subject} in my calendar on {date} {when}.{sentence}",
            "I have {subject} on {date} {when}{phrase}. Add it to my calendar.",
            "New entry: {subject}, {date}, {when}.{sentence}",
            "Please add {subject} on {date} {when}{phrase}.",
            "Can you add {subject} for {date} {when}?{sentence}",
            "{Subject} on {date} {when}{phrase}, please.",
            "Book {subject} on {date} {when}{phrase}.",
        ),
        (
            "Add {subject} on {date} {when}{phrase}",
            "Add {subject} on {date} {when}.{sentence}",
            "Could you schedule {subject} on {date} {when}{phrase}, please?",
        ),
    ),
    "cancel_first": (
        (
            "Please cancel {target} on {date} {when}.",
            "I need to cancel {target} on {date} {when}.",
            "Remove {target} on {date} {when} from my calendar.",
            "Delete {target} on {date} {when}.",
            "Please drop {target} on {date} {when}.",
        ),
        ("Cancel {target} on {date} {when}.", "I can't make it to {target} on {date} {when}. Cancel it."),
    ),
    "year": (
        (
            "We are in {year}.",
            "It's {year}, not 2023.",
            "The year is {year}.",
            "Use {year} as the year.",
            "It's {year} now.",
        ),
        ("The current year is {year}.", "This year is {year}."),
    ),
    "same_day": (
        (
            "Also add {subject} the same day {when}{phrase}.",
            "Same day, {subject} {when}.{sentence}",
            "I also have {subject} that day {when}{phrase}. Put it in.",
            "That day I have {subject} {when}. Add it.{sentence}",
            "In the {part} of that day I'm going to {subject} {when}. Put it in my calendar.{sentence}",
        ),
        (
            "I'm going to {subject} in the {part} of the same day {when}. Add a calendar entry for that.{sentence}",
            "Add {subject} on the same day {when}.{sentence}",
        ),
    ),
    "next_day": (
        (
            "The day after, {subject} {when}.{sentence}",
            "On the following day, {subject} {when}{phrase}.",
            "Also {subject} the next day {when}{phrase}.",
            "Add to my calendar: {subject} the day after, {when}.{sentence}",
            "Put {subject} on the day after {when}.{sentence}",
        ),
        ("Add {subject} on the next day {when}.{sentence}", "On the next day, {subject} {when}.{sentence}"),
    ),
    "duration": (
        (
            "Make it {amount}.",
            "Change the duration to {amount}.",
            "It lasts {amount}.",
            "Make that {amount} long.",
            "Set it to {amount}.",
        ),
        ("Set the duration to {amount}.", "It takes {amount}."),
    ),
    "time": (
        ("Move it to {clock}.", "Change the time to {clock}.", "Make it start {when}."),
        ("Reschedule it to {clock}.",),
    ),
    "cancel": (
        (
            "Please cancel {target}.",
            "I want to cancel {target}.",
            "{Target} is cancelled.",
            "Remove {target}.",
            "Delete {target} from my calendar.",
            "Drop {target}.",
            "Please remove {target}.",
        ),
        ("Cancel {target}.", "Call off {target}."),
    ),
}


# --- Spoken forms ----------------------------------------------------------------------------------


def spoken_date(rng: random.Random, date: dt.date, with_year: bool) -> str:
    short, long = MONTHS[date.month - 1]
    forms = [
        f"{short} {date.day}",
        f"{long} {date.day}",
        f"the {ordinal(date.day)} of {long}",
        f"{long} {ordinal(date.day)}",
    ]
    if with_year:
        forms = [
            f"{short} {date.day}, {date.year}",
            f"{long} {date.day}, {date.year}",
            f"{long} {ordinal(date.day)} {date.year}",
        ]
    return rng.choice(forms)


def spoken_time(rng: random.Random, hour: int, minute: int) -> str:
    """ "at 5PM", "at 8:15 pm", "at noon", "at 17:00"..., with the 12-hour forms most often: they
    are what small models get wrong."""
    if hour == 12 and minute == 0 and rng.random() < 0.5:
        return rng.choice(("at noon", "at midday"))
    if rng.random() < 0.2:
        return f"at {hour}:{minute:02d}" if hour >= 10 or rng.random() < 0.5 else f"at {hour:02d}:{minute:02d}"
    hour12 = hour % 12 or 12
    clock = str(hour12) if minute == 0 else f"{hour12}:{minute:02d}"
    half = "am" if hour < 12 else "pm"
    half = half.upper() if rng.random() < 0.5 else half
    return f"at {clock}{' ' if rng.random() < 0.3 else ''}{half}"


def pick_duration(rng: random.Random) -> tuple[str, str]:
    """(how the request says it, "3 hours"; its code in the call, "60*3"); ("", "30") for none."""
    r = rng.random()
    if r < 0.4:
        return "", str(DEFAULT_DURATION)
    if r < 0.52:
        return rng.choice(("1/2h", "half an hour", "30 minutes")), "30"
    if r < 0.8:
        hours = rng.randrange(1, 6)
        if hours == 1:
            return rng.choice(("1 hour", "one hour", "1h", "an hour")), "60"
        return rng.choice((f"{hours} hours", f"{hours}h")), f"60*{hours}"
    if r < 0.88:
        return rng.choice(("an hour and a half", "1.5 hours", "90 minutes")), "90"
    minutes = rng.choice((15, 20, 45, 120))
    return f"{minutes} minutes", str(minutes)


def _random_time(rng: random.Random) -> tuple[int, int]:
    # Afternoon and evening hours are over-represented: "5PM" -> "17:00" is the arithmetic
    # small models fail at.
    hour = rng.choice((7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 17, 18, 19, 19, 20, 20, 21, 22))
    return hour, rng.choice((0, 0, 0, 0, 15, 30, 30, 45))


# --- Dialog state --------------------------------------------------------------------------------


@dataclass
class _Request:
    """What a user turn asks for: the call a right reply makes."""

    text: str
    entry: Entry
    api: Literal["add", "remove"]

    @property
    def call(self) -> str:
        return add_call(self.entry) if self.api == "add" else remove_call(self.entry)


@dataclass
class _Dialog:
    rng: random.Random
    pools: Pools
    year: int = DEFAULT_YEAR
    year_stated: bool = False
    entries: dict[str, tuple[Entry, str]] = field(default_factory=dict)  # title -> (entry, how it was said)
    last: _Request | None = None
    turns: list[ChatTurn] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)

    def template(self, kind: str, **values: str) -> str:
        text = self.rng.choice(TEMPLATES[kind][self.pools.phrasing]).format(**values)
        return text.replace("  ", " ").strip()

    def exchange(self, user: str, reply: str, *, train: bool) -> None:
        self.turns += [ChatTurn("user", user), ChatTurn("assistant", reply)]
        self.trained.append(train)

    def commit(self, request: _Request) -> None:
        """The state after ``request`` was carried out (the right call, whatever was replied)."""
        if request.api == "add":
            self.entries[request.entry.title] = (request.entry, self.entries.get(request.entry.title, (None, ""))[1])
        else:
            self.entries.pop(request.entry.title, None)
        self.last = request

    def subject(self) -> tuple[str, str]:
        """(how a request names a new event, its title), not one already in the dialog."""
        while True:
            if self.rng.random() < 0.55:
                name = self.rng.choice(self.pools.names)
                spoken, title = self.rng.choice(PERSON_EVENTS) if self.rng.random() < 0.4 else PERSON_EVENTS[0]
                spoken, title = f"{spoken} with {name}", f"{title} with {name}"
            else:
                spoken, title = self.rng.choice(self.pools.events)
            if title not in self.entries:
                return spoken, title

    def date(self, year: int) -> dt.date:
        """A date of this split; days up to 27 (so "the next day" stays in the month), a held-out
        one early in its week (so the next days stay held out)."""
        while True:
            date = dt.date(year, self.rng.randrange(1, 13), self.rng.randrange(1, 28))
            if date_split(date) == self.pools.split and (self.pools.split == "train" or (date.day - 1) % 7 < 3):
                return date


def _new_event(d: _Dialog, kind: str, date: dt.date, *, with_year: bool = False) -> _Request:
    spoken, title = d.subject()
    hour, minute = _random_time(d.rng)
    amount, code = pick_duration(d.rng)
    when = spoken_time(d.rng, hour, minute)
    part = "morning" if hour < 12 else "afternoon" if hour < 18 else "evening"
    text = d.template(
        kind,
        subject=spoken,
        Subject=spoken[0].upper() + spoken[1:],
        date=spoken_date(d.rng, date, with_year),
        when=when,
        part=part,
        phrase=f" for {amount}" if amount else "",
        sentence=f" {amount[0].upper() + amount[1:]}." if amount else "",
    )
    entry = Entry(title, date, hour, minute, duration_code=code)
    d.entries[title] = (entry, spoken)
    return _Request(text, entry, "add")


def _first(d: _Dialog) -> _Request:
    with_year = d.rng.random() < 0.25
    year = d.rng.choice((2024, 2025, 2026)) if with_year else DEFAULT_YEAR
    if with_year:
        d.year, d.year_stated = year, True
    if d.rng.random() < 0.12:  # a first request that cancels
        spoken, title = d.subject()
        hour, minute = _random_time(d.rng)
        date = d.date(year)
        text = d.template(
            "cancel_first",
            target=definite(spoken),
            date=spoken_date(d.rng, date, with_year),
            when=spoken_time(d.rng, hour, minute),
        )
        return _Request(text, Entry(title, date, hour, minute), "remove")
    return _new_event(d, "first", d.date(year), with_year=with_year)


def _moved(entry: Entry, year: int) -> Entry:
    return replace(entry, date=entry.date.replace(year=year)) if entry.date.year == DEFAULT_YEAR else entry


def _year(d: _Dialog) -> _Request:
    """The seed's second prompt: the year stated; the last call again, in that year."""
    assert d.last is not None
    year = d.rng.choice((2024, 2025, 2026))
    d.year, d.year_stated = year, True
    d.entries = {title: (_moved(entry, year), spoken) for title, (entry, spoken) in d.entries.items()}
    return _Request(d.template("year", year=str(year)), _moved(d.last.entry, year), d.last.api)


def _duration(d: _Dialog) -> _Request:
    assert d.last is not None
    while True:
        amount, code = pick_duration(d.rng)
        if amount and code != d.last.entry.duration_code:
            break
    entry = replace(d.last.entry, duration_code=code)
    d.entries[entry.title] = (entry, d.entries[entry.title][1])
    return _Request(d.template("duration", amount=amount), entry, "add")


def _time(d: _Dialog) -> _Request:
    assert d.last is not None
    while True:
        hour, minute = _random_time(d.rng)
        if (hour, minute) != (d.last.entry.hour, d.last.entry.minute):
            break
    when = spoken_time(d.rng, hour, minute)
    entry = replace(d.last.entry, hour=hour, minute=minute)
    d.entries[entry.title] = (entry, d.entries[entry.title][1])
    return _Request(d.template("time", when=when, clock=when.removeprefix("at ")), entry, "add")


def _cancel(d: _Dialog) -> _Request:
    title = d.rng.choice(sorted(d.entries))
    entry, spoken = d.entries[title]
    target = definite(spoken or title.lower())
    return _Request(d.template("cancel", target=target, Target=target[0].upper() + target[1:]), entry, "remove")


def _followup(d: _Dialog) -> _Request:
    assert d.last is not None
    options: list[tuple[float, Callable[[], _Request]]] = [
        (1.2, lambda: _new_event(d, "same_day", d.last.entry.date)),  # type: ignore[union-attr]
        (1.2, lambda: _new_event(d, "next_day", d.last.entry.date + dt.timedelta(days=1))),  # type: ignore[union-attr]
        (0.4, lambda: _new_event(d, "first", d.date(d.year), with_year=False)),
    ]
    if not d.year_stated and d.last.entry.date.year == DEFAULT_YEAR:
        options.append((3.0, lambda: _year(d)))
    if d.last.api == "add":
        options += [(1.0, lambda: _duration(d)), (0.4, lambda: _time(d))]
    if d.entries:
        options.append((1.0, lambda: _cancel(d)))
    weights, makers = zip(*options, strict=True)
    return d.rng.choices(makers, weights=weights)[0]()


# --- Mistakes and corrections --------------------------------------------------------------------

CHATTER = (
    "Sure, here is the API call: {call}",
    "Sure! {call}",
    "Here you go:\n{call}",
    "{call}\nThis adds the event to your calendar.",
    "Of course! Here is the updated code: {call}",
    "{call} # Let me know if you need anything else.",
)
NO_CALL = (
    "Sure! I have added it to your calendar.",
    "I'm sorry, I can't access your calendar.",
    "Done! The event is in your calendar.",
    "Okay, I will remind you.",
)
MISTAKES = (
    "twelve_hour",
    "hour_off",
    "twelve_hour_text",
    "chatter",
    "no_call",
    "wrong_call",
    "year",
    "day",
    "duration",
    "date_format",
    "wrong_event",
    "missing_parameter",
    "title",
)


def mistaken_reply(rng: random.Random, d: _Dialog, request: _Request, *, avoid: str = "") -> tuple[str, str] | None:
    """(kind, reply): a wrong reply to ``request`` a small model would write, or None when no
    kind of mistake applies. ``avoid`` is a reply it must differ from (a second try)."""
    entry, right = request.entry, request.call
    kinds: list[tuple[str, float]] = [
        ("chatter", 1.0),
        ("no_call", 0.4),
        ("wrong_call", 0.6),
        ("date_format", 0.3),
        ("missing_parameter", 0.5),
        ("title", 0.4),
    ]
    if entry.hour > 12:
        kinds += [("twelve_hour", 3.0), ("twelve_hour_text", 0.6)]
    kinds.append(("hour_off", 1.0))
    if d.year_stated and d.year != DEFAULT_YEAR:
        kinds.append(("year", 1.5))
    kinds.append(("day", 0.8))
    if request.api == "add":
        kinds.append(("duration", 0.8))
    others = [e for title, (e, _) in d.entries.items() if title != entry.title]
    if request.api == "remove" and others:
        kinds.append(("wrong_event", 1.0))
    names, weights = zip(*kinds, strict=True)
    for _ in range(8):
        kind = rng.choices(names, weights=weights)[0]
        reply = _wrong(rng, kind, request, others)
        if reply != right and reply != avoid and judge(reply, right).verdict != "correct":
            return kind, reply
    return None


def _wrong(rng: random.Random, kind: str, request: _Request, others: list[Entry]) -> str:
    entry, api = request.entry, request.api

    def call(e: Entry = entry, **override: str) -> str:
        return add_call(e, **override) if api == "add" else remove_call(e, **override)

    if kind == "twelve_hour":
        return call(time=f"{entry.hour - 12:02d}:{entry.minute:02d}")
    if kind == "hour_off":
        return call(time=f"{(entry.hour + rng.choice((-2, -1, 1, 2))) % 24:02d}:{entry.minute:02d}")
    if kind == "twelve_hour_text":
        return call(time=f"{entry.hour - 12}:{entry.minute:02d} PM")
    if kind == "chatter":
        return rng.choice(CHATTER).format(call=request.call)
    if kind == "no_call":
        return rng.choice(NO_CALL)
    if kind == "wrong_call":
        return remove_call(entry) if api == "add" else add_call(entry)
    if kind == "year":
        return call(date=entry.date.replace(year=DEFAULT_YEAR).isoformat())
    if kind == "day":
        return call(date=(entry.date + dt.timedelta(days=rng.choice((-1, 1, 2)))).isoformat())
    if kind == "duration":
        wrong = str(DEFAULT_DURATION) if entry.duration_code != str(DEFAULT_DURATION) else rng.choice(("60", "60*2"))
        if "*" in entry.duration_code and rng.random() < 0.5:
            wrong = entry.duration_code.split("*")[1]  # "3 hours" written as 3
        return add_call(entry, duration=wrong)
    if kind == "date_format":
        return call(date=f"{entry.date.month}/{entry.date.day}/{entry.date.year}")
    if kind == "wrong_event":
        return remove_call(rng.choice(others))
    if kind == "missing_parameter":
        iso = entry.date.isoformat()
        if api == "add":
            return f'action.add_calendar_entry("{entry.title}", date="{iso}", time="{entry.time}")'
        return f'action.remove_calendar_entry("{entry.title}", "{iso}")'
    # title: the event named differently
    title = entry.title.split(" with ")[-1] if " with " in entry.title else entry.title.split()[0]
    return call(replace(entry, title=title))


def correction(kind: FeedbackKind, wrong: str, right: str) -> str:
    """The user's sentence pointing out what is wrong with ``wrong``: generic, the scenario's
    human sentence for it, or the checker's reason."""
    if kind == "generic":
        return GENERIC_CORRECTION
    result = judge(wrong, right)
    return human_correction(result.reason or "") if kind == "human" else correction_for(result)


# --- Examples and held-out items -------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """How often each thing happens in a generated dialog (the ablations change these)."""

    requests: tuple[int, int] = (1, 6)  # user requests per dialog, inclusive range
    mistake_rate: float = 0.35  # a reply is wrong (then corrected) at this rate per request
    second_mistake_rate: float = 0.2  # the first fix is wrong too
    decoy_rate: float = 0.12  # after a right reply, a false correction
    corrections: bool = True  # False: no mistakes or corrections at all (an ablation)
    decoys: bool = True  # False: no false corrections (an ablation)


DEFAULT_RECIPE = Recipe()


def _dialog(rng: random.Random, split: Split, recipe: Recipe, requests: int) -> Example:
    d = _Dialog(rng, SPLITS[split])
    label = ""
    for index in range(requests):
        request = _first(d) if index == 0 else _followup(d)
        right = request.call
        mistake = mistaken_reply(rng, d, request) if recipe.corrections and rng.random() < recipe.mistake_rate else None
        d.commit(request)
        if mistake is None:
            d.exchange(request.text, right, train=True)
            if recipe.decoys and rng.random() < recipe.decoy_rate:
                d.exchange(rng.choice(DECOYS), right, train=True)
                label = label or "decoy"
            continue
        label = label or mistake[0]
        d.exchange(request.text, mistake[1], train=False)
        wrong = mistake[1]
        if rng.random() < recipe.second_mistake_rate:
            second = mistaken_reply(rng, d, request, avoid=wrong)
            if second is not None:
                d.exchange(correction(rng.choice(FEEDBACK_KINDS), wrong, right), second[1], train=False)
                wrong = second[1]
        d.exchange(correction(rng.choice(FEEDBACK_KINDS), wrong, right), right, train=True)
    kind = "correction" if any(not t for t in d.trained) else ("followup" if requests > 1 else "first")
    return Example(tuple(d.turns), tuple(d.trained), kind, label)


_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")


def within(turns: tuple[ChatTurn, ...], split: Split) -> bool:
    """Whether every date the conversation's calls write belongs to ``split`` (a chain of "next
    day"s, or a reply a day off, can step out of it)."""
    for turn in turns:
        for year, month, day in _ISO_DATE.findall(turn.content):
            if date_split(dt.date(int(year), int(month), min(int(day), 28))) != split:
                return False
    return True


def training_dialogs(
    seed: int, count: int, recipe: Recipe = DEFAULT_RECIPE, share_single: float = 0.3
) -> list[Example]:
    """``count`` training conversations: ``share_single`` of them single first requests (cheap,
    and the skill everything builds on), the rest whole dialogs. None contains a seed prompt."""
    rng = random.Random(f"dialogs-train-{seed}")
    low, high = recipe.requests
    examples = []
    while len(examples) < count:
        requests = 1 if rng.random() < share_single else rng.randint(max(2, low), high)
        example = _dialog(rng, "train", recipe, requests)
        seed_prompt = any(turn.role == "user" and turn.content in SEED_PROMPTS for turn in example.turns)
        if within(example.turns, "train") and not seed_prompt:
            examples.append(example)
    return examples


@dataclass(frozen=True)
class HeldOut:
    """A held-out prompt (ending with a user turn) and the call a right reply makes.

    ``kind`` is "first" (a first request), a feedback kind (the conversation ends with a
    mistaken reply and that kind of correction: the fix is expected), or "decoy" (it ends with
    a right reply and a false correction: the same call is expected)."""

    turns: tuple[ChatTurn, ...]
    expected: str
    kind: str
    mistake: str = ""


def held_out_first(seed: int, count: int) -> list[HeldOut]:
    rng = random.Random(f"dialogs-eval-first-{seed}")
    items = []
    for _ in range(count):
        d = _Dialog(rng, SPLITS["eval"])
        request = _first(d)
        items.append(HeldOut((ChatTurn("user", request.text),), request.call, "first"))
        assert within((ChatTurn("assistant", request.call),), "eval")
    return items


def _held_out_prefix(rng: random.Random) -> tuple[_Dialog, _Request]:
    """A held-out dialog of right replies, 0 to 3 requests long, and the request that follows."""
    d = _Dialog(rng, SPLITS["eval"])
    for index in range(rng.randint(0, 3)):
        request = _first(d) if index == 0 else _followup(d)
        d.commit(request)
        d.exchange(request.text, request.call, train=True)
    request = _first(d) if not d.turns else _followup(d)
    return d, request


def held_out_corrections(seed: int, count: int) -> list[HeldOut]:
    """``count`` held-out mistakes, each corrected three ways from the same point (generic,
    human, checker): 3 × ``count`` items, the fix expected."""
    rng = random.Random(f"dialogs-eval-corrections-{seed}")
    items = []
    while len(items) < 3 * count:
        d, request = _held_out_prefix(rng)
        d.commit(request)
        mistake = mistaken_reply(rng, d, request)
        if mistake is None or not within((*d.turns, ChatTurn("assistant", request.call + mistake[1])), "eval"):
            continue
        before = (*d.turns, ChatTurn("user", request.text), ChatTurn("assistant", mistake[1]))
        for kind in FEEDBACK_KINDS:
            turns = (*before, ChatTurn("user", correction(kind, mistake[1], request.call)))
            items.append(HeldOut(turns, request.call, kind, mistake[0]))
    return items


def held_out_decoys(seed: int, count: int) -> list[HeldOut]:
    """Held-out right replies followed by a false correction: keeping the call is right."""
    rng = random.Random(f"dialogs-eval-decoys-{seed}")
    items: list[HeldOut] = []
    while len(items) < count:
        d, request = _held_out_prefix(rng)
        d.commit(request)
        if not within((*d.turns, ChatTurn("assistant", request.call)), "eval"):
            continue
        turns = (
            *d.turns,
            ChatTurn("user", request.text),
            ChatTurn("assistant", request.call),
            ChatTurn("user", DECOYS[len(items) % len(DECOYS)]),
        )
        items.append(HeldOut(turns, request.call, "decoy"))
    return items
