"""Seeded synthetic data for the calendar-assistant scenario (shared/scenario.md).

The bundled demo models are trained from scratch on this data, and evaluated on a held-out part
of it, so that the arena has real contestants that are right, wrong, or fix their mistakes
for the reasons the scenario describes. Pure Python (no keras): the tests and the evaluation
import it cheaply.

What is generated, every example carrying the scenario's exact system prompt:

* single requests: add or cancel an entry, in varied phrasings of dates ("Nov 11", "11/11",
  "the 11th of November", with or without a year), times ("5PM", "8am", "17:00", "at noon")
  and durations ("1/2h", "3 hours", "for 45 minutes", none: the default 30). A request without a
  year gets ``DEFAULT_YEAR``, the year the scenario's expected output 1 assumes; no request is
  relative to an unknown "today", so every expected call is well defined.
* dialogs in the scenario's style: the year correction ("The current year is 2024."), then
  follow-ups that depend on earlier turns ("Set the duration to 3 hours.", "Add a meeting with
  Paul on the next day at 8am. 1/2h.", "Cancel the meeting with Fred.").
* correction dialogs: an earlier assistant turn carries a realistic mistake (wrong year, chatter,
  wrong time, date format, missing duration, wrong API, extra parenthesis...), the user points
  it out in one short sentence from the scenario's list, and the next reply fixes it. Mistaken
  turns are never trained on (``Example.trained``): the model learns the fix, not the mistake.

A ``Persona`` gives a weaker model consistent, learnable quirks (chatter on polite requests,
12-hour times, the year spelled "20 24" after a correction, forgetting a corrected year):
realistic mistakes that greedy decoding reproduces, unlike random label noise.

Held-out split: every example is keyed by its first entry (title, date, time); one key in
``HELD_OUT_MODULUS`` belongs to evaluation only and is never generated for training, and the
evaluation sets are drawn from their own seed stream. So a held-out request never appears in
training, whatever the seeds.
"""

from __future__ import annotations

import datetime as dt
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from votes.checkers import CheckResult, check

SYSTEM_PROMPT = (
    "You are a helpful vocal assistant on a mobile device. Your job is to translate user "
    "requests into API calls using this Python API:\n"
    'action.add_calendar_entry(title, date="YYYY-MM-DD", time="HH:MM", duration=m) '
    "# duration in minutes\n"
    "action.remove_calendar_entry(title, date, time)\n"
    "You can use 30 minutes as the default duration for new events. Respond to every request "
    "with a single line of executable code."
)

# How a reply is judged (votes.checkers' python_call checker), in training and evaluation: the
# calendar API; titles differing only in case are equal; mistakes counted by kind, the labels
# the evaluation reports; a date or time in another format is a mistake of its own; calls of
# functions that look like no calendar API (``print(...)``) are looked into, not judged.
CHECKER_OPTIONS: dict[str, object] = {
    "signature": [
        "action.add_calendar_entry(title, date, time, duration)",
        "action.remove_calendar_entry(title, date, time)",
    ],
    "case_insensitive": ["title"],
    "labels": True,
    "formats": {"date": "date", "time": "time"},
    "api_like": "(?i)calendar|entry|event|appointment",
}


def judge_reply(reply: str, expected: str) -> CheckResult:
    """``reply`` judged against the ``expected`` call by the arena's checker, with ``CHECKER_OPTIONS``."""
    return check("python_call", expected, reply, CHECKER_OPTIONS)


DEFAULT_YEAR = 2023  # The year a request without one gets (the scenario's expected output 1).
CURRENT_YEARS = (2024, 2025, 2026)  # Years users correct to or state explicitly.
DEFAULT_DURATION = 30
SHARE_FIRST = 0.45  # training mixture: single requests,
SHARE_FOLLOWUP = 0.25  # dialogs with follow-ups, and the rest correction dialogs
MAX_FOLLOWUPS = 3  # follow-ups per dialog (1 to this): bounds the context length
MAX_FOLLOWUPS_BEFORE_FIX = 2  # turns in a correction dialog besides the fix (0 to this)
HELD_OUT_MODULUS = 10  # One (title, date, time) key in 10 is reserved for evaluation.

Kind = Literal["first", "followup", "correction"]

NAMES = (
    "Fred", "Paul", "Anna", "Maria", "John", "Li", "Sofia", "Omar", "Emma", "Noah", "Yuki", "Lucas",
    "Chloe", "Ravi", "Ines", "Tom", "Sara", "Hugo", "Mia", "Karim", "Alice", "Ben", "Clara", "David",
    "Elena", "Felix", "Grace", "Hana", "Igor", "Julia", "Kevin", "Laura", "Marco", "Nina", "Oscar",
    "Priya", "Quentin", "Rosa", "Sam", "Tariq",
)  # fmt: skip
# (how a request says it, the title): people-events take "with <name>".
PERSON_EVENTS = (
    ("a meeting", "Meeting"), ("a call", "Call"), ("lunch", "Lunch"), ("dinner", "Dinner"),
    ("coffee", "Coffee"),
)  # fmt: skip
EVENTS = (
    ("a rock concert", "Rock Concert"), ("the dentist", "Dentist"),
    ("a dentist appointment", "Dentist Appointment"), ("a yoga class", "Yoga Class"),
    ("a team lunch", "Team Lunch"), ("a football match", "Football Match"),
    ("a piano lesson", "Piano Lesson"), ("a job interview", "Job Interview"),
    ("a birthday party", "Birthday Party"), ("a doctor visit", "Doctor Visit"),
    ("the book club", "Book Club"), ("a haircut", "Haircut"), ("a flight to Paris", "Flight to Paris"),
    ("a tennis lesson", "Tennis Lesson"), ("a school play", "School Play"),
    ("a parent meeting", "Parent Meeting"), ("a project review", "Project Review"),
    ("a gym session", "Gym Session"), ("a jazz concert", "Jazz Concert"),
    ("a car service", "Car Service"), ("the vet", "Vet"), ("a movie night", "Movie Night"),
)  # fmt: skip
MONTHS = (
    ("Jan", "January"), ("Feb", "February"), ("Mar", "March"), ("Apr", "April"), ("May", "May"),
    ("Jun", "June"), ("Jul", "July"), ("Aug", "August"), ("Sep", "September"),
    ("Oct", "October"), ("Nov", "November"), ("Dec", "December"),
)  # fmt: skip

CHATTER_PREFIXES = (
    "Sure, here is the API call: ", "Sure! ", "Here you go: ", "Sure, here is the updated code: ",
    "Okay, adding it now. ", "Of course! Here is the code:\n",
)  # fmt: skip
CHATTER_SUFFIXES = (
    "\nThis adds the event to your calendar.", " # Done!", "\nLet me know if you need anything else.",
)  # fmt: skip


# --- Entries and calls ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One calendar entry as the conversation knows it.

    ``duration_code`` is how the reply writes the duration (``60*3`` for "3 hours", as the
    scenario's expected output 4 does; minutes as given otherwise). ``lower_pm`` remembers that
    the user wrote the time as "5pm", which one persona misreads.
    """

    title: str
    date: dt.date
    hour: int
    minute: int
    duration_code: str = str(DEFAULT_DURATION)
    lower_pm: bool = False

    @property
    def time(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}"

    @property
    def key(self) -> str:
        return f"{self.title}|{self.date.isoformat()}|{self.time}"


def held_out(entry: Entry) -> bool:
    """Whether ``entry`` (as the first entry of an example) belongs to the evaluation split."""
    return zlib.crc32(entry.key.encode()) % HELD_OUT_MODULUS == 0


def add_call(entry: Entry, *, date: str | None = None, time: str | None = None, duration: str | None = None) -> str:
    """The add call for ``entry``; the keyword overrides write a deliberately different value."""
    return (
        f'action.add_calendar_entry("{entry.title}", date="{date or entry.date.isoformat()}", '
        f'time="{time or entry.time}", duration={duration or entry.duration_code})'
    )


def remove_call(entry: Entry, *, date: str | None = None, time: str | None = None) -> str:
    return f'action.remove_calendar_entry("{entry.title}", "{date or entry.date.isoformat()}", "{time or entry.time}")'


# --- Personas: the consistent quirks of a weaker model ------------------------------------------


@dataclass(frozen=True)
class Persona:
    """Systematic mistakes a model is trained to make (all False: the correct assistant).

    Each quirk depends on something visible in the conversation, so that a small model learns
    it and reproduces it under greedy decoding, as real models repeat their habits.
    """

    name: str = "correct"
    chatty_when_polite: bool = False  # wraps the call in chatter when the request says please
    pm_lowercase_as_am: bool = False  # "5pm"/"5:30pm" becomes "05:00"/"05:30"
    spaced_year_after_correction: bool = False  # writes "20 24-11-11" after "The current year is 2024."
    forgets_corrected_year: bool = False  # new entries after a year correction fall back to 2023


CORRECT = Persona()


@dataclass
class _Turn:
    """What a reply is about, for rendering it the correct or the persona's way."""

    entry: Entry
    api: Literal["add", "remove"]
    polite: bool = False
    year_correction: bool = False


def render_reply(persona: Persona, turn: _Turn) -> str:
    """The reply ``persona`` gives: the correct call, or the call with the persona's quirks."""
    entry = turn.entry
    date = entry.date.isoformat()
    time = entry.time
    if persona.spaced_year_after_correction and turn.year_correction:
        date = f"{date[:2]} {date[2:]}"
    if persona.pm_lowercase_as_am and entry.lower_pm and entry.hour > 12:
        time = f"{entry.hour - 12:02d}:{entry.minute:02d}"
    call = add_call(entry, date=date, time=time) if turn.api == "add" else remove_call(entry, date=date, time=time)
    if persona.chatty_when_polite and turn.polite:
        call = f"Sure, here is the API call: {call}"
    return call


# --- Spoken forms --------------------------------------------------------------------------------


def ordinal(day: int) -> str:
    suffix = "th" if 10 <= day % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{day}{suffix}"


def spoken_date(rng: random.Random, date: dt.date, with_year: bool) -> str:
    short, long = MONTHS[date.month - 1]
    if with_year:
        return rng.choice(
            (
                f"{short} {date.day}, {date.year}",
                f"{long} {date.day}, {date.year}",
                f"{date.month}/{date.day}/{date.year}",
                f"{long} {ordinal(date.day)} {date.year}",
            )
        )
    return rng.choice(
        (
            f"{short} {date.day}",
            f"{long} {date.day}",
            f"{date.month}/{date.day}",
            f"the {ordinal(date.day)} of {long}",
            f"{long} {ordinal(date.day)}",
        )
    )


def spoken_time(rng: random.Random, hour: int, minute: int) -> tuple[str, bool]:
    """("at 5PM" or similar, whether it used a lower-case "pm")."""
    if hour == 12 and minute == 0 and rng.random() < 0.4:
        return "at noon", False
    style = rng.random()
    if style < 0.25:
        return f"at {hour:02d}:{minute:02d}" if hour < 10 and rng.random() < 0.5 else f"at {hour}:{minute:02d}", False
    half = "am" if hour < 12 else "pm"
    upper = rng.random() < 0.5
    if upper:
        half = half.upper()
    space = " " if rng.random() < 0.25 else ""
    hour12 = hour % 12 or 12
    clock = str(hour12) if minute == 0 else f"{hour12}:{minute:02d}"
    return f"at {clock}{space}{half}", half == "pm"


def _pick_duration(rng: random.Random) -> tuple[str, str, str]:
    """(as a separate sentence, as a "for ..." phrase, code); ("", "", "30") for the default."""
    r = rng.random()
    if r < 0.45:
        return "", "", str(DEFAULT_DURATION)
    if r < 0.55:
        return "1/2h.", "for half an hour", "30"
    if r < 0.8:
        hours = rng.randrange(1, 6)
        if hours == 1:
            return rng.choice(("1 hour.", "1h.", "One hour.")), rng.choice(("for an hour", "for 1 hour")), "60"
        unit = rng.choice((" hours", "h"))
        return f"{hours}{unit}.", f"for {hours} hours", f"60*{hours}"
    minutes = rng.choice((15, 20, 45, 90, 120))
    return f"{minutes} minutes.", f"for {minutes} minutes", str(minutes)


def _pick_subject(rng: random.Random, avoid: set[str] | None = None) -> tuple[str, str]:
    """(how the request says the event, its title), avoiding titles already in the dialog."""
    while True:
        if rng.random() < 0.55:
            name = rng.choice(NAMES)
            spoken, title = rng.choice(PERSON_EVENTS) if rng.random() < 0.4 else PERSON_EVENTS[0]
            spoken, title = f"{spoken} with {name}", f"{title} with {name}"
        else:
            spoken, title = rng.choice(EVENTS)
        if not avoid or title not in avoid:
            return spoken, title


def definite(spoken: str) -> str:
    """ "a meeting with Fred" -> "the meeting with Fred", for cancelling it."""
    for article in ("a ", "an "):
        if spoken.startswith(article):
            return "the " + spoken[len(article) :]
    return spoken if spoken.startswith("the ") else "the " + spoken


def _random_date(rng: random.Random, year: int) -> dt.date:
    month = rng.randrange(1, 13)
    day = rng.randrange(1, 29) if rng.random() < 0.9 else rng.randrange(29, 32)
    while True:
        try:
            return dt.date(year, month, day)
        except ValueError:
            day -= 1


def _random_time(rng: random.Random) -> tuple[int, int]:
    hour = rng.choice((7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22))
    minute = rng.choice((0, 0, 0, 0, 15, 30, 30, 45))
    return hour, minute


# --- Dialog state and turn builders --------------------------------------------------------------


@dataclass
class _Dialog:
    rng: random.Random
    persona: Persona
    year: int = DEFAULT_YEAR
    year_known: bool = False
    entries: dict[str, Entry] = field(default_factory=dict)  # title -> entry, live entries
    spoken: dict[str, str] = field(default_factory=dict)  # title -> how the user said it
    turns: list[ChatTurn] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    last: _Turn | None = None
    corrected_year: bool = False  # a year correction happened (for forgets_corrected_year)

    def say(self, user: str, turn: _Turn, *, reply: str | None = None, train: bool = True) -> str:
        """Append a user turn and the reply to it (the persona's, unless ``reply`` is given)."""
        text = render_reply(self.persona, turn) if reply is None else reply
        self.turns += [ChatTurn("user", user), ChatTurn("assistant", text)]
        self.trained.append(train)
        self.last = turn
        if turn.api == "add":
            self.entries[turn.entry.title] = turn.entry
        else:
            self.entries.pop(turn.entry.title, None)
        return text


def _new_request(d: _Dialog, *, cancel: bool = False, allow_year: bool = True) -> tuple[str, _Turn]:
    """A self-contained add (or cancel) request with its own date; updates nothing."""
    rng = d.rng
    spoken, title = _pick_subject(rng, set(d.entries))
    with_year = allow_year and rng.random() < 0.25
    year = rng.choice(CURRENT_YEARS) if with_year else d.year
    if d.persona.forgets_corrected_year and d.corrected_year and not with_year:
        year = DEFAULT_YEAR
    date = _random_date(rng, year)
    hour, minute = _random_time(rng)
    when, lower_pm = spoken_time(rng, hour, minute)
    on_date = spoken_date(rng, date, with_year)
    polite = rng.random() < 0.3
    if cancel:
        entry = Entry(title, date, hour, minute, lower_pm=lower_pm)
        target = definite(spoken)
        if polite:
            text = rng.choice(
                (
                    f"Please cancel {target} on {on_date} {when}.",
                    f"Can you remove {target} on {on_date} {when} from my calendar?",
                )
            )
        else:
            text = rng.choice(
                (
                    f"Cancel {target} on {on_date} {when}.",
                    f"Remove {target} on {on_date} {when} from my calendar.",
                    f"Delete {target} on {on_date} {when}.",
                    f"I can't make it to {target} on {on_date} {when}. Cancel it.",
                )
            )
        return text, _Turn(entry, "remove", polite=polite)
    sentence, phrase, code = _pick_duration(rng)
    entry = Entry(title, date, hour, minute, duration_code=code, lower_pm=lower_pm)
    subject = spoken[0].upper() + spoken[1:]
    if polite:
        text = rng.choice(
            (
                f"Please add {spoken} on {on_date} {when}{' ' + phrase if phrase else ''}.",
                f"Can you add {spoken} on {on_date} {when}{' ' + phrase if phrase else ''}?",
                f"Could you schedule {spoken} on {on_date} {when}{' ' + phrase if phrase else ''}, please?",
            )
        )
    else:
        text = rng.choice(
            (
                f"Add {spoken} on {on_date} {when}{'. ' + sentence if sentence else ''}",
                f"Add {spoken} on {on_date} {when}{' ' + phrase if phrase else ''}.",
                f"Schedule {spoken} on {on_date} {when}{' ' + phrase if phrase else ''}.",
                f"Put {spoken} in my calendar on {on_date} {when}.{' ' + sentence if sentence else ''}",
                f"I have {spoken} on {on_date} {when}{' ' + phrase if phrase else ''}. Add it to my calendar.",
                f"{subject} on {on_date} {when}.{' ' + sentence if sentence else ''}",
            )
        )
    return text, _Turn(entry, "add", polite=polite)


def _year_correction(d: _Dialog) -> tuple[str, _Turn]:
    """ "The current year is 2024.": the last call again, every entry moved to that year."""
    assert d.last is not None
    year = d.rng.choice(CURRENT_YEARS)
    text = d.rng.choice(
        (
            f"The current year is {year}.",
            f"The current year is {year}.",
            f"Fix the year in the API call. It's {year}.",
            f"We are in {year}.",
            f"It's {year}, not {DEFAULT_YEAR}.",
        )
    )
    d.year, d.year_known, d.corrected_year = year, True, True

    def moved(entry: Entry) -> Entry:
        return replace(entry, date=_with_year(entry.date, year)) if entry.date.year == DEFAULT_YEAR else entry

    d.entries = {title: moved(entry) for title, entry in d.entries.items()}
    return text, _Turn(moved(d.last.entry), d.last.api, year_correction=True)


def _with_year(date: dt.date, year: int) -> dt.date:
    try:
        return date.replace(year=year)
    except ValueError:  # Feb 29
        return date.replace(year=year, day=28)


def _relative_event(d: _Dialog, next_day: bool) -> tuple[str, _Turn]:
    """A new event on the same day or the next day as the last one."""
    assert d.last is not None
    rng = d.rng
    spoken, title = _pick_subject(rng, set(d.entries) | {d.last.entry.title})
    base = d.last.entry.date
    if d.persona.forgets_corrected_year and d.corrected_year:
        base = _with_year(base, DEFAULT_YEAR)
    date = base + dt.timedelta(days=1) if next_day else base
    hour, minute = _random_time(rng)
    when, lower_pm = spoken_time(rng, hour, minute)
    sentence, phrase, code = _pick_duration(rng)
    entry = Entry(title, date, hour, minute, duration_code=code, lower_pm=lower_pm)
    day = "the next day" if next_day else "the same day"
    part = "morning" if hour < 12 else "afternoon" if hour < 18 else "evening"
    options = [
        f"Add {spoken} on {day} {when}.{' ' + sentence if sentence else ''}",
        f"Also add {spoken} {day} {when}{' ' + phrase if phrase else ''}.",
    ]
    if spoken.startswith(("a ", "the ")) and not next_day:
        options.append(
            f"I'm going to {spoken} in the {part} of the same day {when}.{' ' + sentence if sentence else ''} "
            "Add a calendar entry for that."
        )
    if next_day:
        options.append(f"On the next day, {spoken} {when}.{' ' + sentence if sentence else ''}")
    return rng.choice(options), _Turn(entry, "add")


def _set_duration(d: _Dialog) -> tuple[str, _Turn]:
    assert d.last is not None and d.last.api == "add"
    rng = d.rng
    while True:
        _, phrase, code = _pick_duration(rng)
        if phrase and code != d.last.entry.duration_code:
            break
    amount = phrase.removeprefix("for ")
    text = rng.choice(
        (
            f"Set the duration to {amount}.",
            f"Make it {amount}.",
            f"Change the duration to {amount}.",
            f"It lasts {amount}.",
        )
    )
    return text, _Turn(replace(d.last.entry, duration_code=code), "add")


def _change_time(d: _Dialog) -> tuple[str, _Turn]:
    assert d.last is not None and d.last.api == "add"
    rng = d.rng
    entry = d.last.entry
    while True:
        hour, minute = _random_time(rng)
        if (hour, minute) != (entry.hour, entry.minute):
            break
    when, lower_pm = spoken_time(rng, hour, minute)
    text = rng.choice((f"Change the time to {when.removeprefix('at ')}.", f"Move it to {when.removeprefix('at ')}."))
    return text, _Turn(replace(entry, hour=hour, minute=minute, lower_pm=lower_pm), "add")


def _cancel_earlier(d: _Dialog) -> tuple[str, _Turn]:
    """ "Cancel the meeting with Fred.": a remove call for an entry added earlier in the dialog."""
    rng = d.rng
    title = rng.choice(sorted(d.entries))
    entry = d.entries[title]
    target = definite(d.spoken.get(title, title.lower()))
    text = rng.choice((f"Cancel {target}.", f"Remove {target}.", f"Delete {target} from my calendar."))
    return text, _Turn(entry, "remove")


def _followup(d: _Dialog) -> tuple[str, _Turn]:
    """One follow-up that is valid in the dialog's current state."""
    assert d.last is not None
    options: list[tuple[float, Callable[[], tuple[str, _Turn]]]] = [
        (1.0, lambda: _relative_event(d, next_day=False)),
        (1.0, lambda: _relative_event(d, next_day=True)),
        (0.5, lambda: _new_request(d)),
    ]
    if not d.year_known and d.last.entry.date.year == DEFAULT_YEAR:
        options.append((2.5, lambda: _year_correction(d)))
    if d.last.api == "add":
        options += [(1.0, lambda: _set_duration(d)), (0.5, lambda: _change_time(d))]
    if d.entries:
        options.append((1.0, lambda: _cancel_earlier(d)))
    weights, makers = zip(*options, strict=True)
    return d.rng.choices(makers, weights=weights)[0]()


# --- Mistakes and the corrections users send ------------------------------------------------------


def _shift_hour(entry: Entry, rng: random.Random) -> str:
    if entry.hour > 12 and rng.random() < 0.6:
        return f"{entry.hour - 12:02d}:{entry.minute:02d}"  # the classic 12-hour slip
    hour = (entry.hour + rng.choice((-2, -1, 1, 2, 3))) % 24
    return f"{hour:02d}:{entry.minute:02d}"


def make_mistake(rng: random.Random, turn: _Turn, others: list[Entry]) -> tuple[str, str, str]:
    """A realistic wrong reply for ``turn`` and the user's short correction: (label, reply, correction)."""
    entry = turn.entry
    call = add_call(entry) if turn.api == "add" else remove_call(entry)
    kinds = ["chatter", "time", "date_format", "date", "extra_parenthesis", "time_format"]
    if entry.date.year != DEFAULT_YEAR:
        kinds += ["year", "year"]
    if turn.api == "add":
        kinds += ["missing_duration", "duration", "wrong_api_remove"]
    else:
        kinds += ["wrong_api_add", "two_parameters"]
        if others:
            kinds.append("wrong_event")
    kind = rng.choice(kinds)
    iso = entry.date.isoformat()
    spoken = spoken_time(rng, entry.hour, entry.minute)[0]
    if kind == "chatter":
        reply = rng.choice((rng.choice(CHATTER_PREFIXES) + call, call + rng.choice(CHATTER_SUFFIXES)))
        correction = rng.choice(
            ("Just the API call, please.", "You don't need that info.", "Only the code, please.", "No chatter.")
        )
    elif kind == "time":
        wrong = _shift_hour(entry, rng)
        reply = add_call(entry, time=wrong) if turn.api == "add" else remove_call(entry, time=wrong)
        correction = rng.choice(("The time is wrong.", f"The time is wrong. It's {spoken}.", "Wrong time."))
    elif kind == "time_format":
        hour12 = entry.hour % 12 or 12
        wrong = f"{hour12}:{entry.minute:02d} {'AM' if entry.hour < 12 else 'PM'}"
        reply = add_call(entry, time=wrong) if turn.api == "add" else remove_call(entry, time=wrong)
        correction = rng.choice(("Time in 24h format.", "Use the 24h time format."))
    elif kind == "date_format":
        wrong = rng.choice((f"{entry.date.month}/{entry.date.day}/{entry.date.year}", entry.date.strftime("%d.%m.%Y")))
        reply = add_call(entry, date=wrong) if turn.api == "add" else remove_call(entry, date=wrong)
        correction = rng.choice(("Respect the date format.", "The date format is wrong."))
    elif kind == "date":
        delta = rng.choice((-2, -1, 1, 2, 7))
        wrong = (entry.date + dt.timedelta(days=delta)).isoformat()
        reply = add_call(entry, date=wrong) if turn.api == "add" else remove_call(entry, date=wrong)
        long = MONTHS[entry.date.month - 1][1]
        correction = rng.choice(("The date is wrong.", f"Wrong date. It's {long} {entry.date.day}."))
    elif kind == "year":
        wrong = _with_year(entry.date, DEFAULT_YEAR if rng.random() < 0.7 else entry.date.year - 1).isoformat()
        reply = add_call(entry, date=wrong) if turn.api == "add" else remove_call(entry, date=wrong)
        correction = rng.choice(
            ("Fix the year in the API call.", f"The current year is {entry.date.year}.", "Wrong year.")
        )
    elif kind == "extra_parenthesis":
        reply = call + ")"
        correction = "Extra parenthesis."
    elif kind == "missing_duration":
        reply = f'action.add_calendar_entry("{entry.title}", date="{iso}", time="{entry.time}")'
        correction = rng.choice(("Duration is required.", "You forgot the duration."))
    elif kind == "duration":
        if entry.duration_code == str(DEFAULT_DURATION):
            reply = add_call(entry, duration=rng.choice(("60", "60*2", "15")))
            correction = rng.choice(("Use the default duration.", "The duration is wrong."))
        else:
            reply = add_call(entry, duration=str(DEFAULT_DURATION))
            correction = "The duration is wrong."
    elif kind == "wrong_api_remove":
        reply = remove_call(entry)
        correction = rng.choice(("Wrong API. I want to add it.", "That cancels it. Add it instead."))
    elif kind == "wrong_api_add":
        reply = add_call(entry)
        correction = rng.choice(("Wrong API.", "I asked to cancel it, not to add it."))
    elif kind == "two_parameters":
        reply = f'action.remove_calendar_entry("{entry.title}", "{iso}")'
        correction = "The API requires three parameters."
    else:  # wrong_event
        reply = remove_call(rng.choice(others))
        correction = rng.choice(("It's the wrong event now.", "Wrong event."))
    return kind, reply, correction


# --- Examples -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """A training conversation: it ends with an assistant turn; ``trained`` has one flag per
    assistant turn saying whether its tokens carry loss (mistaken turns do not)."""

    turns: tuple[ChatTurn, ...]
    trained: tuple[bool, ...]
    kind: Kind
    label: str = ""


@dataclass(frozen=True)
class EvalItem:
    """A held-out prompt (ending with a user turn) and the reply a correct model gives."""

    turns: tuple[ChatTurn, ...]
    expected: str
    kind: Kind
    label: str = ""


def _first_turn(d: _Dialog, split: Literal["train", "eval"]) -> tuple[str, _Turn]:
    """A first request whose entry lies in ``split``."""
    while True:
        text, turn = _new_request(d, cancel=d.rng.random() < 0.2)
        if held_out(turn.entry) == (split == "eval"):
            return text, turn


def _spoken_subject(title: str) -> str:
    """How the user named the event, to refer back to it ("the meeting with Fred")."""
    lowered = title.lower()
    for spoken, known in (*EVENTS, *((s, t) for s, t in PERSON_EVENTS)):
        if title == known or title.startswith(known + " with "):
            return spoken + title[len(known) :] if title != known else spoken
    return lowered


def _dialog(
    rng: random.Random, persona: Persona, split: Literal["train", "eval"], followups: int, mistake_at: int | None
) -> tuple[_Dialog, tuple[str, str, str] | None]:
    """Build a dialog of 1 + ``followups`` user turns; ``mistake_at`` (a user-turn index) gets a
    wrong reply followed by a correction turn. Returns the dialog and the mistake, if any."""
    d = _Dialog(rng, persona)
    mistake: tuple[str, str, str] | None = None
    for index in range(1 + followups):
        text, turn = _first_turn(d, split) if index == 0 else _followup(d)
        if turn.api == "add":
            d.spoken[turn.entry.title] = _spoken_subject(turn.entry.title)
        if index == mistake_at:
            others = [e for t, e in d.entries.items() if t != turn.entry.title]
            mistake = make_mistake(rng, turn, others)
            d.say(text, turn, reply=mistake[1], train=False)  # the state is as if it were right
            fix = _Turn(turn.entry, turn.api, year_correction=mistake[0] == "year" and "year is" in mistake[2])
            d.say(mistake[2], fix)
        else:
            d.say(text, turn)
    return d, mistake


@dataclass(frozen=True)
class Mixture:
    """Proportions and lengths of the training conversations (the rest are correction dialogs)."""

    share_first: float = SHARE_FIRST
    share_followup: float = SHARE_FOLLOWUP
    max_followups: int = MAX_FOLLOWUPS
    max_followups_before_fix: int = MAX_FOLLOWUPS_BEFORE_FIX


DEFAULT_MIXTURE = Mixture()


def training_examples(
    seed: int, count: int, persona: Persona = CORRECT, mixture: Mixture = DEFAULT_MIXTURE
) -> list[Example]:
    """``count`` training conversations: single requests, dialogs, correction dialogs.

    Single first requests (the reliability measurement; short, so cheap to train on, and the
    skill everything else builds on), scripted dialogs with follow-ups (the complete chat) and
    dialogs in which a reply was wrong and the user's correction is followed by the fix (more
    mistake fixing), in the proportions of ``mixture``.
    """
    rng = random.Random(f"calendar-train-{seed}")
    examples = []
    for _ in range(count):
        r = rng.random()
        if r < mixture.share_first:
            d, _ = _dialog(rng, persona, "train", 0, None)
            examples.append(Example(tuple(d.turns), tuple(d.trained), "first"))
        elif r < mixture.share_first + mixture.share_followup:
            d, _ = _dialog(rng, persona, "train", rng.randrange(1, mixture.max_followups + 1), None)
            examples.append(Example(tuple(d.turns), tuple(d.trained), "followup"))
        else:
            followups = rng.randrange(0, mixture.max_followups_before_fix + 1)
            d, mistake = _dialog(rng, persona, "train", followups, rng.randrange(0, followups + 1))
            assert mistake is not None
            examples.append(Example(tuple(d.turns), tuple(d.trained), "correction", mistake[0]))
    return examples


def eval_first_requests(seed: int, count: int) -> list[EvalItem]:
    """Held-out single requests (add or cancel) and the correct call for each."""
    rng = random.Random(f"calendar-eval-first-{seed}")
    items = []
    for _ in range(count):
        d, _ = _dialog(rng, CORRECT, "eval", 0, None)
        items.append(EvalItem(tuple(d.turns[:-1]), d.turns[-1].content, "first"))
    return items


def eval_corrections(seed: int, count: int) -> list[EvalItem]:
    """Held-out correction dialogs: a wrong reply, the user's correction; expected: the fix.

    Half of them are the scenario's own correction: the first reply assumed 2023 and the user
    says "The current year is 2024." (the fix every contestant is tested on); the others carry
    one of ``make_mistake``'s mistakes, made by "another model" as in measurement 3.
    """
    rng = random.Random(f"calendar-eval-corrections-{seed}")
    items = []
    while len(items) < count:
        if len(items) % 2 == 0:
            d = _Dialog(rng, CORRECT)
            while True:
                text, turn = _first_turn(d, "eval")
                if turn.entry.date.year == DEFAULT_YEAR:
                    break
            d.say(text, turn)
            correction, fix = _year_correction(d)
            prompt = (*d.turns, ChatTurn("user", correction))
            items.append(EvalItem(prompt, render_reply(CORRECT, fix), "correction", "year"))
            continue
        followups = rng.randrange(0, MAX_FOLLOWUPS_BEFORE_FIX + 1)
        mistake_at = rng.randrange(0, followups + 1)
        d, mistake = _dialog(rng, CORRECT, "eval", followups, mistake_at)
        assert mistake is not None
        end = 2 * mistake_at + 2  # the correction turn; the fix after it is the expected reply
        items.append(EvalItem(tuple(d.turns[: end + 1]), d.turns[end + 1].content, "correction", mistake[0]))
    return items


def eval_followups(seed: int, count: int) -> list[EvalItem]:
    """Held-out scenario-style dialogs with correct history; expected: the last follow-up's call."""
    rng = random.Random(f"calendar-eval-followups-{seed}")
    items = []
    for _ in range(count):
        d, _ = _dialog(rng, CORRECT, "eval", rng.randrange(1, MAX_FOLLOWUPS + 1), None)
        items.append(EvalItem(tuple(d.turns[:-1]), d.turns[-1].content, "followup"))
    return items


# --- Rendering for training ----------------------------------------------------------------------


def render_segments(family: str, example: Example) -> list[tuple[str, bool]]:
    """The conversation as template text, cut into (text, trained) segments.

    Concatenated, the segments are exactly ``render_prompt`` of the conversation plus its last
    reply and the family's end-of-turn marker, i.e. what the model reads at inference time. A
    trained segment is one assistant reply plus its end marker: the loss covers the reply tokens
    and teaches the model to stop. Segment edges fall on template markers (single tokens), so
    tokenizing segments separately gives the same ids as tokenizing the whole text.
    """
    stop = stop_strings(family)[0]
    segments: list[tuple[str, bool]] = []
    done = ""
    assistant_index = 0
    for index, turn in enumerate(example.turns):
        if turn.role != "assistant":
            continue
        prompt = render_prompt(family, SYSTEM_PROMPT, example.turns[:index])
        if not prompt.startswith(done):
            raise AssertionError(f"{family} template is not prefix-stable at turn {index}")
        segments.append((prompt[len(done) :], False))
        # Mistral's template puts a space between [/INST] and the reply; render_prompt ends at
        # [/INST], so the model writes that space as part of its reply.
        reply = (" " if family == "mistral" else "") + turn.content + stop
        segments.append((reply, example.trained[assistant_index]))
        done = prompt + reply
        assistant_index += 1
    return segments


def eval_prompt(family: str, item: EvalItem) -> str:
    """The prompt string for a held-out item, as the arena renders it."""
    return render_prompt(family, SYSTEM_PROMPT, list(item.turns))
