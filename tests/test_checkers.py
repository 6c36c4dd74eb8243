"""votes.checkers: every rule of the four automatic checkers, python_call's labelled rules (those
the calendar models are trained and evaluated by), and the check_reply command."""

import ast
import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inference.building.calendar_data import CHECKER_OPTIONS, eval_corrections, judge_reply
from votes.checkers import (
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
    CheckerConfigError,
    CheckResult,
    check,
    find_calls,
    fold_constant,
    parse_date,
    parse_signature,
    parse_time,
    validate,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
ADD = "action.add_calendar_entry(title, date, time, duration)"
REMOVE = "action.remove_calendar_entry(title, date, time)"
CALENDAR = {"signature": [ADD, REMOVE]}
FRED = 'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=30)'
CONCERT = 'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration=60*3)'
CANCEL = 'action.remove_calendar_entry("Meeting with Fred", "2024-11-11", "17:00")'


def calendar_result(expected: str, reply: str, **options: object) -> CheckResult:
    return check("python_call", expected, reply, {**CALENDAR, **options})


def calendar(expected: str, reply: str, **options: object) -> tuple[str, str]:
    result = calendar_result(expected, reply, **options)
    return result.verdict, result.reason


# --- python_call: the equivalences of shared/scenario.md -----------------------------------------


@pytest.mark.parametrize(
    "reply",
    [
        FRED,
        "action.add_calendar_entry('Meeting with Fred', date='2024-11-11', time='17:00', duration=30)",  # quotes
        'action.add_calendar_entry( "Meeting with Fred",date="2024-11-11" ,time = "17:00",duration=30 )',  # spacing
        'action.add_calendar_entry("Meeting with Fred", "2024-11-11", "17:00", 30)',  # positional
        'action.add_calendar_entry(title="Meeting with Fred", duration=30, time="17:00", date="2024-11-11")',
        'action.add_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00", duration=15*2)',
        f"  {FRED};  ",  # surrounding whitespace and a trailing semicolon are not chatter
    ],
)
def test_equivalent_calls_are_correct(reply: str) -> None:
    assert calendar(FRED, reply) == ("correct", "")


def test_folded_arithmetic_on_both_sides() -> None:
    assert calendar(CONCERT, CONCERT.replace("60*3", "180"))[0] == "correct"
    assert calendar(CONCERT.replace("60*3", "180"), CONCERT)[0] == "correct"
    assert calendar(CONCERT, CONCERT.replace("60*3", "3 * 60"))[0] == "correct"
    assert calendar(CONCERT, CONCERT.replace("60*3", "(2+1)*60"))[0] == "correct"
    assert calendar(CONCERT, CONCERT.replace("60*3", "60*2")) == ("mistake", "duration is 120, expected 180")


def test_positional_call_against_keyword_expectation() -> None:
    assert (
        calendar(CANCEL, 'action.remove_calendar_entry(title="Meeting with Fred", date="2024-11-11", time="17:00")')[0]
        == "correct"
    )


def test_wrong_year_reason_can_be_sent_as_correction() -> None:
    verdict, reason = calendar(FRED, FRED.replace("2024", "2023"))
    assert verdict == "mistake"
    assert reason == "date is 2023-11-11, expected 2024-11-11"


def test_chatter_around_a_correct_call_is_a_mistake() -> None:
    verdict, reason = calendar(FRED, f"Sure, here is the updated code: {FRED}")
    assert verdict == "mistake"
    assert reason == "text around the call: 'Sure, here is the updated code:'"
    assert calendar(FRED, f"```python\n{FRED}\n```")[0] == "mistake"


def test_title_case_is_a_task_setting() -> None:
    reply = CONCERT.replace("Rock Concert", "Rock concert")
    assert calendar(CONCERT, reply) == ("mistake", "title is Rock concert, expected Rock Concert")
    assert calendar(CONCERT, reply, case_insensitive=["title"])[0] == "correct"


def test_patterns_leave_a_value_open() -> None:
    assumed = FRED.replace("2024", "2023")
    assert calendar(FRED, assumed, patterns={"date": r"\d{4}-11-11"})[0] == "correct"
    assert calendar(FRED, FRED.replace("11-11", "11-12"), patterns={"date": r"\d{4}-11-11"}) == (
        "mistake",
        "date is 2024-11-12, expected 2024-11-11",
    )


def test_missing_extra_and_duplicate_arguments() -> None:
    assert calendar(FRED, FRED.replace(", duration=30", "")) == ("mistake", "duration is missing")
    assert calendar(FRED, FRED.replace("duration=30", "duration=30, place='office'"))[1] == (
        "unexpected argument place"
    )
    assert "title is given twice" in calendar(FRED, FRED.replace("(", "('x', title=", 1))[1]


def test_signature_defaults_make_a_parameter_optional() -> None:
    options = {"signature": ["action.add_calendar_entry(title, date, time, duration=30)"]}
    without = FRED.replace(", duration=30", "")
    assert check("python_call", FRED, without, options).verdict == "correct"
    assert check("python_call", without, FRED, options).verdict == "correct"


def test_wrong_function_and_wrong_api() -> None:
    assert calendar(CANCEL, FRED)[1] == "called action.add_calendar_entry(), expected action.remove_calendar_entry()"
    verdict, reason = calendar(FRED, FRED.replace("add_calendar_entry", "create_event"))
    assert (verdict, reason) == ("mistake", "called action.create_event(), expected action.add_calendar_entry()")
    assert calendar(FRED, 'print("done")')[0] == "garbage"


def test_garbage_when_no_call_or_three_mistakes() -> None:
    assert calendar(FRED, "I have added the meeting to your calendar.") == (
        "garbage",
        "the reply contains no function call",
    )
    assert calendar(FRED, "")[0] == "garbage"
    three = 'action.add_calendar_entry("Meeting with Fred", date="2023-11-12", time="5PM", duration=60)'
    assert calendar(FRED, three) == (
        "garbage",
        "date is 2023-11-12, expected 2024-11-11; time is 5PM, expected 17:00; duration is 60, expected 30",
    )


def test_extra_call_and_extra_parenthesis() -> None:
    assert calendar(FRED, f"{FRED}\n{FRED}") == ("mistake", "2 calls, expected one")
    assert calendar(FRED, FRED + ")") == ("mistake", "text around the call: ')'")


def test_unreadable_argument_is_a_mistake_not_executed() -> None:
    verdict, reason = calendar(FRED, FRED.replace("duration=30", "duration=__import__('os').getpid()"))
    assert verdict == "mistake" and reason == "duration is not a literal value"
    # A huge power is not computed (it would hang the worker): it is not a literal either.
    assert calendar(FRED, FRED.replace("duration=30", "duration=9**9**9"))[1] == "duration is not a literal value"
    assert fold_constant(ast.parse("-(7 // 2) + 2**3", mode="eval").body) == 5


def test_without_signature_arguments_compare_by_position_and_name() -> None:
    assert check("python_call", 'convert(3, "km", to="mi")', "convert(3, 'km', to='mi')").verdict == "correct"
    assert check("python_call", 'convert(3, "km", to="mi")', 'convert(3, "km", to="m")').reason == (
        "to is m, expected mi"
    )


def test_find_calls_skips_parentheses_inside_strings() -> None:
    (call,) = find_calls('x action.add_calendar_entry("a (b", "2024-01-01", "10:00", 30) y')
    assert call.name == "action.add_calendar_entry"


# --- python_call with labels: the calendar rules training and evaluation count by -----------------
# (formerly inference.calendar_checker's tests; the options are the ones calendar_data judges with)


def labelled(expected: str, reply: str, *, case_sensitive_title: bool = False) -> CheckResult:
    options = dict(CHECKER_OPTIONS)
    if case_sensitive_title:
        del options["case_insensitive"]
    return check("python_call", expected, reply, options)


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
def test_labelled_equivalent_add_calls_are_correct(reply: str) -> None:
    result = labelled(FRED, reply)
    assert result.verdict == "correct", result
    assert result.labels == () and result.mistakes == ()


@pytest.mark.parametrize("duration", ["60*3", "180", "3*60", "(2+1)*60", "180.0", "60 * 3"])
def test_labelled_duration_arithmetic_is_evaluated(duration: str) -> None:
    reply = f'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration={duration})'
    assert labelled(CONCERT, reply).correct


@pytest.mark.parametrize(
    "reply",
    [
        CANCEL,
        "action.remove_calendar_entry('Meeting with Fred', '2024-11-11', '17:00')",
        'action.remove_calendar_entry("Meeting with Fred", date="2024-11-11", time="17:00")',
        'action.remove_calendar_entry(title="Meeting with Fred", time="17:00", date="2024-11-11")',
    ],
)
def test_labelled_equivalent_remove_calls_are_correct(reply: str) -> None:
    assert labelled(CANCEL, reply).correct


def test_labelled_title_case_is_an_option() -> None:
    reply = 'action.add_calendar_entry("Rock concert", date="2024-11-11", time="20:00", duration=180)'
    assert labelled(CONCERT, reply).correct
    strict = labelled(CONCERT, reply, case_sensitive_title=True)
    assert strict.verdict == "mistake"
    assert strict.labels == (WRONG_TITLE,)


@pytest.mark.parametrize(
    ("reply", "label"),
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
def test_labelled_one_mistake(reply: str, label: str) -> None:
    result = labelled(FRED, reply)
    assert result.verdict == "mistake", result
    assert result.labels == (label,), result.mistakes
    assert len(result.mistakes) == 1


def test_labelled_wrong_year_names_the_year() -> None:
    result = labelled(FRED, FRED.replace("2024", "2023"))
    assert result.reason == "date is 2023-11-11, expected 2024-11-11 (year)"
    assert result.parts["date year = 2024"] is False and result.parts["time = 17:00"] is True


def test_labelled_remove_needs_three_parameters() -> None:
    result = labelled(CANCEL, 'action.remove_calendar_entry("Meeting with Fred", "2024-11-11")')
    assert result.verdict == "mistake"
    assert result.labels == (MISSING_ARGUMENT,)
    assert result.wrong_parts == {"time", "time = 17:00"}


def test_labelled_add_instead_of_remove_is_the_wrong_api() -> None:
    assert labelled(CANCEL, FRED).labels == (WRONG_API,)


def test_labelled_wrong_event_in_a_cancel() -> None:
    reply = 'action.remove_calendar_entry("Rock Concert", "2024-11-11", "20:00")'
    assert labelled(CANCEL, reply).labels == (WRONG_TITLE, WRONG_TIME)


def test_labelled_two_mistakes_are_still_a_mistake() -> None:
    reply = 'Here you go: action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)'
    result = labelled(FRED, reply)
    assert result.verdict == "mistake"
    assert result.labels == (WRONG_DATE, CHATTER)


def test_labelled_kinds_count_once() -> None:
    """Two missing arguments are one mistake, so a mistake rather than garbage with chatter."""
    result = labelled(FRED, 'Sure: action.add_calendar_entry("Meeting with Fred", date="2024-11-11")')
    assert result.verdict == "mistake"
    assert result.labels == (MISSING_ARGUMENT, CHATTER)
    assert result.mistakes[0] == "missing time, duration"
    assert check("python_call", FRED, 'action.add_calendar_entry("Meeting with Fred", date="2024-11-11")', CALENDAR)
    assert calendar(FRED, 'Sure: action.add_calendar_entry("Meeting with Fred", date="2024-11-11")')[0] == "garbage"


def test_labelled_call_wrapped_in_print_is_chatter_not_extra_parenthesis() -> None:
    assert labelled(FRED, f"print({FRED})").labels == (CHATTER,)
    # Without api_like, print() is the call judged: of a function outside the API.
    assert calendar(FRED, f"print({FRED})")[0] == "garbage"


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
def test_labelled_no_recognisable_call_is_garbage(reply: str) -> None:
    result = labelled(FRED, reply)
    assert result.verdict == "garbage"
    assert result.labels == (NO_CALL,)
    assert result.parts == {}


def test_labelled_three_mistakes_at_once_are_garbage() -> None:
    reply = 'Sure! action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="5:00", duration=30)'
    result = labelled(FRED, reply)
    assert result.verdict == "garbage"
    assert result.labels == (WRONG_DATE, WRONG_TIME, CHATTER)


def test_labelled_reply_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    reply = (
        f'action.add_calendar_entry(__import__("pathlib").Path("{marker}").write_text("x"), '
        'date="2024-11-11", time="17:00", duration=30)'
    )
    result = labelled(FRED, reply)
    assert not marker.exists()
    assert result.labels == (WRONG_TITLE,)


def test_labelled_huge_arithmetic_is_unreadable_not_computed() -> None:
    reply = FRED.replace("duration=30", "duration=10**10**10")
    assert labelled(FRED, reply).labels == (WRONG_DURATION,)
    reply = FRED.replace("duration=30", "duration=999999999*999999999*999999999")
    assert labelled(FRED, reply).labels == (WRONG_DURATION,)
    # A string argument must be a literal, an integer one integer arithmetic at every step.
    assert labelled(FRED, FRED.replace('"Meeting with Fred"', '"Meeting " + "with Fred"')).labels == (WRONG_TITLE,)
    assert labelled(FRED, FRED.replace("duration=30", "duration=7/2*2*15")).labels == (WRONG_DURATION,)


def test_parse_date_and_time_helpers() -> None:
    assert parse_date("2024-11-11") == parse_date("11/11/2024") == parse_date("November 11, 2024") == (2024, 11, 11)
    assert parse_date("20 24-11-11") is None
    assert parse_time("17:00") == parse_time("5PM") == parse_time("5 pm") == parse_time("17:00:00") == (17, 0)
    assert parse_time("12am") == (0, 0)
    assert parse_time("noon") == (12, 0)
    assert parse_time("17") is None


def test_labelled_expected_must_be_a_complete_call() -> None:
    with pytest.raises(ValueError, match="duration is missing"):
        labelled('action.add_calendar_entry("Meeting with Fred", date="2024-11-11")', FRED)


def test_labelled_options_are_checked() -> None:
    with pytest.raises(CheckerConfigError, match="needs the option 'labels'"):
        validate("python_call", FRED, {**CALENDAR, "formats": {"date": "date"}})
    with pytest.raises(CheckerConfigError, match="'formats' must map"):
        validate("python_call", FRED, {**CALENDAR, "labels": True, "formats": {"date": "weekday"}})
    with pytest.raises(CheckerConfigError, match="Invalid regular expression"):
        validate("python_call", FRED, {**CALENDAR, "api_like": "("})
    validate("python_call", FRED, CHECKER_OPTIONS)


def test_labelled_result_as_dict_lists_the_labels() -> None:
    assert labelled(FRED, f"{FRED})").as_dict()["labels"] == [EXTRA_PARENTHESIS]
    assert "labels" not in calendar_result(FRED, f"{FRED})").as_dict()


def test_labelled_data_mistakes_get_their_labels() -> None:
    """Each kind of wrong reply in the calendar data is judged a mistake of that kind (a date
    written "11.11.2024" is no date format the checker reads: a wrong date)."""
    kinds = {
        "chatter": {CHATTER},
        "time": {WRONG_TIME},
        "time_format": {WRONG_TIME_FORMAT},
        "date_format": {WRONG_DATE_FORMAT, WRONG_DATE},
        "date": {WRONG_DATE},
        "year": {WRONG_DATE},
        "extra_parenthesis": {EXTRA_PARENTHESIS},
        "missing_duration": {MISSING_ARGUMENT},
        "two_parameters": {MISSING_ARGUMENT},
        "duration": {WRONG_DURATION},
        "wrong_api_add": {WRONG_API},
        "wrong_api_remove": {WRONG_API},
        "wrong_event": {WRONG_TITLE},
    }
    for item in eval_corrections(0, 200):
        result = judge_reply(item.turns[-2].content, item.expected)  # The wrong reply, against its fix.
        assert result.verdict == "mistake" and kinds[item.label] & set(result.labels), (item, result)


def test_scenario_dialog_expected_outputs_judge_themselves_correct() -> None:
    expected = [
        'action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)',
        FRED,
        'action.add_calendar_entry("Rock Concert", date="2024-11-11", time="20:00", duration=30)',
        CONCERT,
        'action.add_calendar_entry("Meeting with Paul", date="2024-11-12", time="08:00", duration=30)',
        CANCEL,
    ]
    for call in expected:
        assert labelled(call, call).correct
        assert calendar(call, call)[0] == "correct"


# --- exact, regex, json ----------------------------------------------------------------------------


def test_exact() -> None:
    assert check("exact", "id,first_name,last_name", "  id,first_name,last_name\n").verdict == "correct"
    assert check("exact", "a  b", "a b").verdict == "correct"
    assert check("exact", "a  b", "a b", {"collapse_whitespace": False}).verdict == "mistake"
    assert check("exact", "Yes", "yes").verdict == "mistake"
    assert check("exact", "Yes", "yes", {"case_sensitive": False}).verdict == "correct"
    assert check("exact", "Yes", "   ").verdict == "garbage"
    assert check("exact", "Yes", "No").reason == "expected exactly 'Yes'"


def test_regex() -> None:
    assert check("regex", r"\d{4}-\d{2}-\d{2}", " 2024-11-12 ").verdict == "correct"
    assert check("regex", r"\d{4}-\d{2}-\d{2}", "It is 2024-11-12").verdict == "mistake"
    assert check("regex", r"\d{4}-\d{2}-\d{2}", "It is 2024-11-12", {"search": True}).verdict == "correct"
    assert check("regex", "yes", "YES", {"ignore_case": True}).verdict == "correct"


def test_json_semantic_equality() -> None:
    expected = '{"name": "Fred", "age": 42, "tags": ["a", "b"]}'
    assert check("json", expected, '{"tags":["a","b"],"age":42.0,"name":"Fred"}').verdict == "correct"
    assert (
        check("json", expected, '{"name": "Fred", "age": 41, "tags": ["a", "b"]}').reason == "$.age is 41, expected 42"
    )
    assert check("json", '{"ok": true}', '{"ok": 1}').verdict == "mistake"
    result = check("json", expected, '{"name": "Fred", "tags": ["a", "b"], "x": 1}')
    assert result.mistakes == ("missing key $.age", "unexpected key $.x")
    assert check("json", expected, f"Here you go: {expected}").reason == "text around the JSON: 'Here you go:'"
    assert check("json", expected, "no json here").verdict == "garbage"
    assert check("json", "[1, 2]", "[1, 2, 3]").reason == "$ has 3 items, expected 2"


# --- parts: what fix episodes compare field by field -----------------------------------------------


def test_parts_say_which_fields_are_right() -> None:
    result = check("python_call", FRED, f"Sure: {FRED.replace('2024', '2023').replace('17:00', '5PM')}", CALENDAR)
    facts = {"date = 2024-11-11", "date year = 2024", "time = 17:00"}
    assert result.wrong_parts == {"date", "time", "text around"} | facts
    assert result.parts["title"] and result.parts["duration"] and result.parts["function"]
    assert check("python_call", FRED, FRED, CALENDAR).wrong_parts == set()
    # The wrong function: its arguments cannot be bound to the expected one's, so they are not parts.
    removed = check("python_call", FRED, CANCEL, CALENDAR)
    assert set(removed.parts) == {"function", "calls", "text around"} and removed.wrong_parts == {"function"}
    assert check("python_call", FRED, "I can't do that.", CALENDAR).parts == {}  # nothing to judge part by part
    json_result = check("json", '{"name": "Fred", "tags": ["a"]}', 'Here: {"name": "Fred", "tags": ["b"], "x": 1}')
    assert json_result.parts == {
        "$.name": True,
        "$.tags": False,
        "other keys": False,
        "text around": False,
        "$.name = Fred": True,
        '$.tags = ["a"]': False,
    }
    assert check("exact", "yes", "no").parts == {"reply": False}


def test_facts_are_parts_named_by_the_value_expected() -> None:
    """Each expected argument is a fact, and a date's year one of its own: a later turn that
    expects the same value judges the same fact (the year 2024 of every later calendar turn),
    whatever else it expects; a value the turn leaves open (a pattern) is no fact."""
    next_day = check("python_call", FRED.replace("11-11", "11-12"), FRED.replace("11-11", "11-13"), CALENDAR)
    assert next_day.parts["date year = 2024"] is True and next_day.parts["date = 2024-11-12"] is False
    assert "date = 2024-11-11" not in next_day.parts
    assert check("python_call", FRED, FRED, CALENDAR).parts["title = Meeting with Fred"] is True
    assert check("python_call", CONCERT, CONCERT.replace("60*3", "180"), CALENDAR).parts["duration = 180"] is True
    garbled = check("python_call", FRED, FRED.replace('"2024-11-11"', '"11/11/2024"'), CALENDAR)
    assert garbled.parts["date year = 2024"] is False  # Not a date the year can be read from.
    cancel = check("python_call", CANCEL, CANCEL.replace("2024", "2023"), CALENDAR)
    assert cancel.parts["date year = 2024"] is False and cancel.parts["time = 17:00"] is True
    open_year = check(
        "python_call", FRED, FRED.replace("2024", "2023"), {**CALENDAR, "patterns": {"date": r"\d{4}-11-11"}}
    )
    assert open_year.verdict == "correct" and not any(part.startswith("date ") for part in open_year.parts)


# --- configuration errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected", "options", "message"),
    [
        ("python_call", "action.add_calendar_entry(", CALENDAR, "not a Python call"),
        ("python_call", "42", CALENDAR, "not a single Python function call"),
        ("python_call", 'action.add_calendar_entry("t", "2024-01-01")', CALENDAR, "duration is missing"),
        ("python_call", 'action.nope("t")', CALENDAR, "not in the signature"),
        ("python_call", FRED, {"signature": ["add(1)"]}, "plain names"),
        ("python_call", FRED, {**CALENDAR, "patterns": {"date": r"\d{4}-12-11"}}, "fails its own check"),
        ("python_call", FRED, {**CALENDAR, "colour": 1}, "Unknown option"),
        ("json", "{not json", {}, "not valid JSON"),
        ("regex", "(", {}, "Invalid regular expression"),
        ("exact", "x", {"case_sensitive": "yes"}, "must be a bool"),
        ("sql", "x", {}, "Unknown checker"),
    ],
)
def test_invalid_tasks_are_refused_clearly(kind: str, expected: str, options: dict, message: str) -> None:
    with pytest.raises(CheckerConfigError, match=message):
        validate(kind, expected, options)


def test_parse_signature() -> None:
    signature = parse_signature("action.add_calendar_entry(title, date, time, duration=30) # minutes")
    assert signature.name == "action.add_calendar_entry"
    assert signature.parameters == ("title", "date", "time", "duration")
    assert signature.defaults == {"duration": 30}


# --- check_reply -------------------------------------------------------------------------------------


def test_check_reply_command_prints_json() -> None:
    out = StringIO()
    call_command(
        "check_reply",
        "--kind=python_call",
        f"--expected={FRED}",
        f"--reply={FRED.replace('2024', '2023')}",
        f"--signature={ADD}",
        f"--signature={REMOVE}",
        stdout=out,
    )
    assert json.loads(out.getvalue()) == {
        "verdict": "mistake",
        "reason": "date is 2023-11-11, expected 2024-11-11",
        "mistakes": ["date is 2023-11-11, expected 2024-11-11"],
        "parts": {
            "function": True,
            "title": True,
            "date": False,
            "time": True,
            "duration": True,
            "calls": True,
            "text around": True,
            "title = Meeting with Fred": True,
            "date = 2024-11-11": False,
            "date year = 2024": False,
            "time = 17:00": True,
            "duration = 30": True,
        },
    }


def test_check_reply_command_refuses_bad_input() -> None:
    with pytest.raises(CommandError, match="not a Python call"):
        call_command("check_reply", "--kind=python_call", "--expected=f(", "--reply=f()")
    with pytest.raises(CommandError, match="--options is not valid JSON"):
        call_command("check_reply", "--kind=exact", "--expected=a", "--reply=a", "--options={")
    with pytest.raises(CommandError, match="python_call only"):
        call_command("check_reply", "--kind=exact", "--expected=a", "--reply=a", "--signature=f(a)")


def test_module_imports_without_django() -> None:
    code = "import sys, votes.checkers; sys.exit('django' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
