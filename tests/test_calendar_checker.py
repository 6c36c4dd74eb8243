"""inference.calendar_checker against every equivalence and mistake kind of shared/scenario.md."""

import subprocess
import sys
from pathlib import Path

import pytest

from inference.calendar_checker import (
    CHATTER,
    EXTRA_ARGUMENT,
    EXTRA_CALL,
    EXTRA_PARENTHESIS,
    MISSING_ARGUMENT,
    NO_CALL,
    WRONG_API,
    WRONG_DATE,
    WRONG_DATE_FORMAT,
    WRONG_DURATION,
    WRONG_TIME,
    WRONG_TIME_FORMAT,
    WRONG_TITLE,
    check_reply,
    parse_call,
    parse_date,
    parse_time,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
FRED = 'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)'
CONCERT_3H = 'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration=60*3)'
CANCEL_FRED = 'action.remove_calendar_entry("Meeting with Fred", "2024-11-11", "17:00")'


# --- Equivalent outputs are equal --------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        FRED,
        "action.add_calendar_entry('Meeting with Fred', date='2024-11-11', time='17:00', duration=30)",
        'action.add_calendar_entry( "Meeting with Fred",date="2024-11-11" ,time = "17:00",duration=30 )',
        'action.add_calendar_entry("Meeting with Fred", "2024-11-11", "17:00", 30)',
        'action.add_calendar_entry(title="Meeting with Fred", date="2024-11-11", time="17:00", duration=30)',
        'action.add_calendar_entry(duration=30, time="17:00", date="2024-11-11", title="Meeting with Fred")',
        'action.add_calendar_entry("Meeting with Fred", "2024-11-11", time="17:00", duration=60/2)',
        f"  {FRED}  \n",
        f"{FRED};",
    ],
)
def test_equivalent_add_calls_are_correct(reply: str) -> None:
    result = check_reply(reply, FRED)
    assert result.verdict == "correct", result
    assert result.mistakes == []


@pytest.mark.parametrize("duration", ["60*3", "180", "3*60", "(2+1)*60", "180.0", "60 * 3"])
def test_duration_arithmetic_is_evaluated(duration: str) -> None:
    reply = f'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration={duration})'
    assert check_reply(reply, CONCERT_3H).correct


@pytest.mark.parametrize(
    "reply",
    [
        CANCEL_FRED,
        "action.remove_calendar_entry('Meeting with Fred', '2024-11-11', '17:00')",
        'action.remove_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00")',
        'action.remove_calendar_entry(title="Meeting with Fred", time="17:00", date="2024-11-11")',
    ],
)
def test_equivalent_remove_calls_are_correct(reply: str) -> None:
    assert check_reply(reply, CANCEL_FRED).correct


def test_title_case_is_configurable() -> None:
    reply = 'action.add_calendar_entry("Rock concert", date="2024-11-11", time="20:00", duration=180)'
    assert check_reply(reply, CONCERT_3H).correct
    strict = check_reply(reply, CONCERT_3H, case_sensitive_title=True)
    assert strict.verdict == "mistake"
    assert strict.mistakes == [WRONG_TITLE]


# --- One mistake each ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "mistake"),
    [
        ('action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)', WRONG_DATE),
        ('action.add_calendar_entry("Meeting with Fred", date="20 24-11-11", time="17:00", duration=30)', WRONG_DATE),
        ('action.add_calendar_entry("Meeting with Fred", date="2024-11-12", time="17:00", duration=30)', WRONG_DATE),
        (
            'action.add_calendar_entry("Meeting with Fred", date="11/11/2024", time="17:00", duration=30)',
            WRONG_DATE_FORMAT,
        ),
        (
            'action.add_calendar_entry("Meeting with Fred", date="Nov 11, 2024", time="17:00", duration=30)',
            WRONG_DATE_FORMAT,
        ),
        ('action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="05:00", duration=30)', WRONG_TIME),
        (
            'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="5PM", duration=30)',
            WRONG_TIME_FORMAT,
        ),
        (
            'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00:00", duration=30)',
            WRONG_TIME_FORMAT,
        ),
        (
            'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=60)',
            WRONG_DURATION,
        ),
        ('action.add_calendar_entry("Meeting with Paul", date="2024-11-11", time="17:00", duration=30)', WRONG_TITLE),
        ('action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00")', MISSING_ARGUMENT),
        (
            'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30, place="x")',
            EXTRA_ARGUMENT,
        ),
        ('action.remove_calendar_entry("Meeting with Fred", "2024-11-11", "17:00")', WRONG_API),
        ('action.create_event("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)', WRONG_API),
        ('add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)', WRONG_API),
        (f"Sure, here is the updated code: {FRED}", CHATTER),
        (f"{FRED}\nThis adds the meeting to your calendar.", CHATTER),
        (f"```python\n{FRED}\n```", CHATTER),
        (f"{FRED} # duration in minutes", CHATTER),
        (f"{FRED})", EXTRA_PARENTHESIS),
        (f"{FRED}\n{FRED}", EXTRA_CALL),
    ],
)
def test_one_mistake(reply: str, mistake: str) -> None:
    result = check_reply(reply, FRED)
    assert result.verdict == "mistake", result
    assert result.mistakes == [mistake], result.details
    assert len(result.details) == 1


def test_wrong_year_detail_names_the_year() -> None:
    reply = 'action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)'
    assert "(year)" in check_reply(reply, FRED).details[0]


def test_remove_needs_three_parameters() -> None:
    result = check_reply('action.remove_calendar_entry("Meeting with Fred", "2024-11-11")', CANCEL_FRED)
    assert result.verdict == "mistake"
    assert result.mistakes == [MISSING_ARGUMENT]


def test_add_instead_of_remove_is_the_wrong_api() -> None:
    assert check_reply(FRED, CANCEL_FRED).mistakes == [WRONG_API]


def test_wrong_event_in_a_cancel() -> None:
    reply = 'action.remove_calendar_entry("Rock Concert", "2024-11-11", "20:00")'
    assert check_reply(reply, CANCEL_FRED).mistakes == [WRONG_TITLE, WRONG_TIME]


def test_two_mistakes_are_still_a_mistake() -> None:
    reply = 'Here you go: action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)'
    result = check_reply(reply, FRED)
    assert result.verdict == "mistake"
    assert result.mistakes == [WRONG_DATE, CHATTER]


def test_call_wrapped_in_print_is_chatter_not_extra_parenthesis() -> None:
    assert check_reply(f"print({FRED})", FRED).mistakes == [CHATTER]


# --- Garbage -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "I have added the meeting with Fred to your calendar.",
        "action.add_calendar_entry(",
        'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30',
        "Meeting with Fred 2024-11-11 17:00",
        "<unk><unk> with with with",
        'print("hello")',
    ],
)
def test_no_recognisable_call_is_garbage(reply: str) -> None:
    result = check_reply(reply, FRED)
    assert result.verdict == "garbage"
    assert result.mistakes == [NO_CALL]


def test_three_mistakes_at_once_are_garbage() -> None:
    reply = 'Sure! action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="5:00", duration=30)'
    result = check_reply(reply, FRED)
    assert result.verdict == "garbage"
    assert result.mistakes == [WRONG_DATE, WRONG_TIME, CHATTER]


# --- Safety and parsing ------------------------------------------------------------------------


def test_reply_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    reply = (
        f'action.add_calendar_entry(__import__("pathlib").Path("{marker}").write_text("x"), '
        'date="2024-11-11", time="17:00", duration=30)'
    )
    result = check_reply(reply, FRED)
    assert not marker.exists()
    assert result.mistakes == [WRONG_TITLE]


def test_huge_arithmetic_is_unreadable_not_computed() -> None:
    reply = FRED.replace("duration=30", "duration=10**10**10")
    assert check_reply(reply, FRED).mistakes == [WRONG_DURATION]
    reply = FRED.replace("duration=30", "duration=999999999*999999999*999999999")
    assert check_reply(reply, FRED).mistakes == [WRONG_DURATION]


def test_parse_call_normalises_fields() -> None:
    call = parse_call("Sure: action.add_calendar_entry('Rock Concert', '2024-11-11', time='20:00', duration=60*3)")
    assert call is not None
    assert (call.receiver, call.api) == ("action", "add_calendar_entry")
    assert (call.title, call.date, call.time, call.duration) == ("Rock Concert", "2024-11-11", "20:00", 180)
    assert call.known_api and not call.missing and not call.extra
    assert call.source.startswith("action.add_calendar_entry(")
    remove = parse_call(CANCEL_FRED)
    assert remove is not None
    assert (remove.api, remove.title, remove.date, remove.time, remove.duration) == (
        "remove_calendar_entry", "Meeting with Fred", "2024-11-11", "17:00", None,
    )  # fmt: skip
    assert parse_call("no call here") is None


def test_parse_date_and_time_helpers() -> None:
    assert parse_date("2024-11-11") == parse_date("11/11/2024") == parse_date("November 11, 2024") == (2024, 11, 11)
    assert parse_date("20 24-11-11") is None
    assert parse_time("17:00") == parse_time("5PM") == parse_time("5 pm") == parse_time("17:00:00") == (17, 0)
    assert parse_time("12am") == (0, 0)
    assert parse_time("noon") == (12, 0)
    assert parse_time("17") is None


def test_expected_must_be_a_complete_call() -> None:
    with pytest.raises(ValueError, match="not a complete API call"):
        check_reply(FRED, 'action.add_calendar_entry("Meeting with Fred", date="2024-11-11")')


def test_scenario_dialog_expected_outputs_judge_themselves_correct() -> None:
    expected = [
        'action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)',
        FRED,
        'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration=30)',
        CONCERT_3H,
        'action.add_calendar_entry("Meeting with Paul", date="2024-11-12", time="08:00", duration=30)',
        CANCEL_FRED,
    ]
    for call in expected:
        assert check_reply(call, call).correct


def test_module_imports_without_django() -> None:
    code = "import sys, inference.calendar_checker; sys.exit('django' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
