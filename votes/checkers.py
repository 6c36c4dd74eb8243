"""Automatic checkers: judge a reply against a task turn's expected output.

Four kinds, chosen per scripted turn by the admin who curates the task:

* ``exact``: the reply, trimmed, equals the expected text (options: ``case_sensitive``,
  default true; ``collapse_whitespace``, default true);
* ``regex``: the trimmed reply matches the expected pattern in full (options: ``ignore_case``;
  ``search`` to accept the pattern anywhere in the reply);
* ``json``: the reply is JSON semantically equal to the expected JSON (key order and spacing
  do not matter; ``1`` equals ``1.0`` but ``true`` is not ``1``); JSON inside other text is a
  mistake ("text around the JSON");
* ``python_call``: one function call, parsed with :mod:`ast` and never executed, compared with
  the expected call after binding both to the API signature the task declares (options:
  ``signature``, a list like ``["action.remove_calendar_entry(title, date, time)"]``; a
  parameter written ``name=value`` there is optional with that default). Keyword or positional
  arguments, quote style and spacing do not matter; safe constant arithmetic is folded
  (``60*3`` equals ``180``). Text around a correct call is a mistake: the tasks ask for the call
  alone. ``case_insensitive`` lists parameters compared without case; ``patterns`` maps a
  parameter to a regular expression its value must match instead of the expected value (for a
  value the task leaves open, like the year before the voter has said which it is).
  ``api_like``, a regular expression: only calls of the API's functions, on its receiver, or
  whose function name it matches are calls to judge; the checker looks inside any other (so
  ``print(action.f(...))`` is a call with text around it, and ``print("hi")`` no call at all).
  ``labels`` (the rules the training and evaluation of the calendar models count by): each
  mistake is one of ``MISTAKE_LABELS``, each kind counted once (two missing arguments are one
  "missing argument"), the result lists them in ``labels``; a call of another function is still
  compared argument by argument (a wrong API, not garbage); a ``)`` too many is "extra
  parenthesis", not text around; a string argument must be a string literal and an integer one
  integer arithmetic. With ``labels``, ``formats`` maps a parameter to ``"date"`` or ``"time"``:
  a value that is the expected date or time written another way ("11/11/2024", "5PM") is the
  mistake "wrong date format" or "wrong time format" rather than "wrong date" or "wrong time".

Every check returns a verdict, ``correct``, ``mistake`` (one or two mistakes) or ``garbage``
(nothing recognisable, or three or more mistakes at once: the 🔥 of shared/scenario.md), with a
short reason a voter could send as the correction ("date is 2023-11-11, expected 2024-11-11"),
and the parts it judged, each right or wrong (a call's name and each parameter, the text around
it; a JSON document's top-level keys): what fix episodes compare field by field to tell a
regression (a correction that breaks a part that was right). Besides, each value the turn expects
is a **fact** part, named by the value (``date = 2024-11-11``; a date's year on its own too,
``date year = 2024``): later turns that expect the same value judge the same fact, which is how a
fix episode tells whether a corrected fact persists (the year in the calendar's turns 3 to 6,
though their dates differ).

Pure Python, no Django: the evaluation runner, the admin's validation, ``check_reply`` and the
calendar models' training and evaluation (``inference.building.calendar_data``) share it.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["correct", "mistake", "garbage"]
CHECKER_KINDS: tuple[str, ...] = ("exact", "regex", "json", "python_call")
GARBAGE_THRESHOLD = 3  # Three or more mistakes at once is garbage, as in the seed experiment.
_SHOWN = 60  # Characters of a value or of chatter quoted in a reason.


FACT = " = "  # In a part's name: a fact, the part and the value expected of it.
_ISO_DATE = re.compile(r"(\d{4})-\d{2}-\d{2}")


def is_fact(part: str) -> bool:
    """Whether a part names a fact (an expected value) rather than a field."""
    return FACT in part


class CheckerConfigError(ValueError):
    """The expected output or the options cannot be checked against: a bug in the task."""


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    mistakes: tuple[str, ...] = ()  # One short sentence each.
    details: Mapping[str, Any] = field(default_factory=dict)
    # Each part the checker could judge -> whether it is right; empty when nothing in the reply
    # could be matched part by part (no call at all, an exact text that differs).
    parts: Mapping[str, bool] = field(default_factory=dict)
    # With python_call's option ``labels``: the kind of each mistake (one of MISTAKE_LABELS), in
    # the order of ``mistakes``; empty otherwise.
    labels: tuple[str, ...] = ()

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    @property
    def wrong_parts(self) -> frozenset[str]:
        return frozenset(part for part, right in self.parts.items() if not right)

    @property
    def reason(self) -> str:
        """The mistakes as one sentence; empty when the reply is correct."""
        return "; ".join(self.mistakes)

    def as_dict(self) -> dict[str, Any]:
        mistakes = list(self.mistakes)
        result = {"verdict": self.verdict, "reason": self.reason, "mistakes": mistakes, "parts": dict(self.parts)}
        return result | ({"labels": list(self.labels)} if self.labels else {})


class _Findings:
    """Mistakes as they are found, each charged to the part of the reply it is about."""

    def __init__(self, parts: Sequence[str] = ()) -> None:
        self.mistakes: list[str] = []
        self.labels: list[str] = []
        self.parts: dict[str, bool] = dict.fromkeys(parts, True)

    def add(self, part: str | Sequence[str], mistake: str, label: str | None = None) -> None:
        """One mistake, charged to ``part`` (or to each of several); ``label`` its kind."""
        self.mistakes.append(mistake)
        if label is not None:
            self.labels.append(label)
        for name in [part] if isinstance(part, str) else part:
            self.parts[name] = False

    def facts(self, parameter: str, want: Any, got: Any) -> None:
        """The facts of an expected argument, judged as the parameter was; an ISO date's year
        on its own too (right when the argument is a date of that year)."""
        self.parts[f"{parameter}{FACT}{_value_text(want)}"] = self.parts[parameter]
        year = _ISO_DATE.fullmatch(want) if isinstance(want, str) else None
        if year is not None:
            got_year = _ISO_DATE.fullmatch(got.strip()) if isinstance(got, str) else None
            right = got_year is not None and got_year.group(1) == year.group(1)
            self.parts[f"{parameter} year{FACT}{year.group(1)}"] = right

    def result(self) -> CheckResult:
        return _result(self.mistakes, parts=self.parts, labels=self.labels)


def _result(
    mistakes: Sequence[str],
    *,
    garbage: bool = False,
    parts: Mapping[str, bool] | None = None,
    labels: Sequence[str] = (),
) -> CheckResult:
    parts, labels = dict(parts or {}), tuple(labels)
    if garbage or len(mistakes) >= GARBAGE_THRESHOLD:
        return CheckResult("garbage", tuple(mistakes), parts=parts, labels=labels)
    return CheckResult("mistake" if mistakes else "correct", tuple(mistakes), parts=parts, labels=labels)


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _option(options: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = options.get(name, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckerConfigError(f"Option {name!r} must be a {kind.__name__}, got {value!r}.")
    return value


def _known_options(kind: str, options: Mapping[str, Any], allowed: Sequence[str]) -> None:
    if not isinstance(options, Mapping):
        raise CheckerConfigError(f"Checker options must be a JSON object, got {options!r}.")
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        accepted = ", ".join(allowed) or "none"
        raise CheckerConfigError(f"Unknown option(s) for {kind}: {', '.join(unknown)} (accepted: {accepted}).")


# --- exact -----------------------------------------------------------------------------------


def _check_exact(expected: str, reply: str, options: Mapping[str, Any]) -> CheckResult:
    _known_options("exact", options, ("case_sensitive", "collapse_whitespace"))
    case_sensitive = _option(options, "case_sensitive", bool, True)
    collapse = _option(options, "collapse_whitespace", bool, True)

    def normal(text: str) -> str:
        text = " ".join(text.split()) if collapse else text.strip()
        return text if case_sensitive else text.casefold()

    if not reply.strip():
        return _result(["the reply is empty"], garbage=True)
    if normal(reply) == normal(expected):
        return _result([], parts={"reply": True})
    return _result([f"expected exactly {_shown(expected)!r}"], parts={"reply": False})


# --- regex -----------------------------------------------------------------------------------


def _compile(pattern: str, ignore_case: bool = False) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as error:
        raise CheckerConfigError(f"Invalid regular expression {pattern!r}: {error}.") from None


def _check_regex(expected: str, reply: str, options: Mapping[str, Any]) -> CheckResult:
    _known_options("regex", options, ("ignore_case", "search"))
    pattern = _compile(expected, _option(options, "ignore_case", bool, False))
    search = _option(options, "search", bool, False)
    if not reply.strip():
        return _result(["the reply is empty"], garbage=True)
    text = reply.strip()
    matched = pattern.search(text) if search else pattern.fullmatch(text)
    if matched:
        return _result([], parts={"reply": True})
    return _result([f"the reply does not match the expected pattern {_shown(expected)!r}"], parts={"reply": False})


# --- json ------------------------------------------------------------------------------------


def _same_json(got: Any, want: Any, path: str, found: list[str]) -> None:
    """Differences between two decoded JSON values, one sentence each, by JSON path."""
    numbers = (int, float)
    if isinstance(want, bool) or isinstance(got, bool):
        same = type(got) is type(want) and got == want
    elif isinstance(want, numbers) and isinstance(got, numbers):
        same = got == want
    elif isinstance(want, dict) and isinstance(got, dict):
        for key in want:
            if key not in got:
                found.append(f"missing key {path}.{key}")
            else:
                _same_json(got[key], want[key], f"{path}.{key}", found)
        found.extend(f"unexpected key {path}.{key}" for key in got if key not in want)
        return
    elif isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            found.append(f"{path} has {len(got)} items, expected {len(want)}")
            return
        for index, (item, wanted) in enumerate(zip(got, want, strict=True)):
            _same_json(item, wanted, f"{path}[{index}]", found)
        return
    else:
        same = type(got) is type(want) and got == want
    if not same:
        found.append(f"{path} is {_shown(json.dumps(got))}, expected {_shown(json.dumps(want))}")


def _find_json(text: str) -> tuple[Any, int, int] | None:
    """The first JSON object or array in ``text``, with where it starts and ends."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[\[{]", text):
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        return value, match.start(), end
    return None


def _check_json(expected: str, reply: str, options: Mapping[str, Any]) -> CheckResult:
    _known_options("json", options, ())
    try:
        want = json.loads(expected)
    except ValueError as error:
        raise CheckerConfigError(f"The expected output is not valid JSON: {error}.") from None
    text = reply.strip()
    around: list[str] = []
    try:
        got = json.loads(text)
    except ValueError:
        found = _find_json(text)
        if found is None:
            return _result(["the reply contains no JSON"], garbage=True)
        got, start, end = found
        outside = (text[:start] + " " + text[end:]).strip()
        around.append(f"text around the JSON: {_shown(outside)!r}")
    differences: list[str] = []
    _same_json(got, want, "$", differences)
    # Parts: each top-level key of an object (a difference is charged to the key its path
    # starts with), else the document as a whole; and the text around it.
    keys = [f"$.{key}" for key in want] if isinstance(want, dict) and isinstance(got, dict) else ["$"]
    parts = {key: True for key in keys} | {"text around": not around}
    for difference in differences:
        path = difference.split(" ", 2)[-1] if difference.startswith(("missing key", "unexpected key")) else difference
        owner = next((key for key in keys if path == key or path.startswith((key + ".", key + "[", key + " "))), None)
        parts[owner or "other keys"] = False
    if isinstance(want, dict) and isinstance(got, dict):
        parts |= {f"$.{key}{FACT}{_value_text(value)}": parts[f"$.{key}"] for key, value in want.items()}
    return _result(differences + around, parts=parts)


# --- python_call -----------------------------------------------------------------------------

_UNREADABLE = object()  # An argument that is not a constant expression (a variable, a call...).
_CALL_START = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\s*\.\s*)*[A-Za-z_]\w*)\s*\(")


@dataclass(frozen=True)
class Signature:
    """An API function: its dotted name, parameter names in order, and optional defaults."""

    name: str
    parameters: tuple[str, ...]
    defaults: Mapping[str, Any]

    @property
    def short_name(self) -> str:
        return self.name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class FoundCall:
    name: str
    node: ast.Call
    start: int
    end: int


def fold_constant(node: ast.AST) -> Any:
    """The value of a constant expression (numbers, strings, arithmetic, containers) or
    ``_UNREADABLE``. Evaluated on the syntax tree, never executed; powers are bounded."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = fold_constant(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
        return _UNREADABLE
    if isinstance(node, ast.BinOp):
        left, right = fold_constant(node.left), fold_constant(node.right)
        if isinstance(left, str) and isinstance(right, str) and isinstance(node.op, ast.Add):
            return left + right
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            return _UNREADABLE
        operations: dict[type, Callable[[Any, Any], Any]] = {
            ast.Add: lambda a, b: a + b,
            ast.Sub: lambda a, b: a - b,
            ast.Mult: lambda a, b: a * b,
            ast.Div: lambda a, b: a / b,
            ast.FloorDiv: lambda a, b: a // b,
            ast.Mod: lambda a, b: a % b,
        }
        if isinstance(node.op, ast.Pow):
            if abs(right) > 64 or abs(left) > 10**6:  # No 9**9**9 in a reply.
                return _UNREADABLE
            operations[ast.Pow] = lambda a, b: a**b
        operation = operations.get(type(node.op))
        if operation is None:
            return _UNREADABLE
        try:
            return operation(left, right)
        except (ZeroDivisionError, OverflowError, ValueError):
            return _UNREADABLE
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [fold_constant(item) for item in node.elts]
        return _UNREADABLE if any(item is _UNREADABLE for item in items) else items
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            return _UNREADABLE
        keys = [fold_constant(key) for key in node.keys if key is not None]
        values = [fold_constant(value) for value in node.values]
        if any(v is _UNREADABLE or isinstance(v, (list, dict)) for v in keys) or _UNREADABLE in values:
            return _UNREADABLE
        return dict(zip(keys, values, strict=True))
    return _UNREADABLE


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def parse_signature(text: str) -> Signature:
    """``"action.add_calendar_entry(title, date, time, duration=30)"`` as a Signature.

    A trailing ``# comment`` is ignored. Raises CheckerConfigError when it is not a call whose
    arguments are parameter names (optionally ``name=constant`` for a default).
    """
    source = text.split("#", 1)[0].strip()
    try:
        node = ast.parse(source, mode="eval").body
    except SyntaxError:
        raise CheckerConfigError(f"Signature {text!r} is not a Python call like f(a, b=1).") from None
    name = _dotted(node.func) if isinstance(node, ast.Call) else None
    if not isinstance(node, ast.Call) or name is None:
        raise CheckerConfigError(f"Signature {text!r} is not a Python call like f(a, b=1).")
    parameters: list[str] = []
    for argument in node.args:
        if not isinstance(argument, ast.Name):
            raise CheckerConfigError(f"Signature {text!r}: positional parameters must be plain names.")
        parameters.append(argument.id)
    defaults: dict[str, Any] = {}
    for keyword in node.keywords:
        value = fold_constant(keyword.value) if keyword.arg else _UNREADABLE
        if keyword.arg is None or value is _UNREADABLE:
            raise CheckerConfigError(f"Signature {text!r}: a default must be a constant, like duration=30.")
        parameters.append(keyword.arg)
        defaults[keyword.arg] = value
    if len(set(parameters)) != len(parameters):
        raise CheckerConfigError(f"Signature {text!r} repeats a parameter.")
    return Signature(name, tuple(parameters), defaults)


def _bind(call: ast.Call, signature: Signature) -> tuple[dict[str, Any], list[str]]:
    """Arguments by parameter name (folded), and binding problems as sentences."""
    bound: dict[str, Any] = {}
    problems: list[str] = []
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        problems.append("*args or **kwargs cannot be checked")
    positional = [a for a in call.args if not isinstance(a, ast.Starred)]
    for index, argument in enumerate(positional):
        if index < len(signature.parameters):
            bound[signature.parameters[index]] = fold_constant(argument)
        else:
            problems.append(
                f"{len(positional)} positional arguments, {signature.short_name}() takes at most "
                f"{len(signature.parameters)}"
            )
            break
    for keyword in call.keywords:
        if keyword.arg is None:
            continue
        if keyword.arg not in signature.parameters:
            problems.append(f"unexpected argument {keyword.arg}")
        elif keyword.arg in bound:
            problems.append(f"{keyword.arg} is given twice")
        else:
            bound[keyword.arg] = fold_constant(keyword.value)
    for parameter in signature.parameters:
        if parameter not in bound and parameter in signature.defaults:
            bound[parameter] = signature.defaults[parameter]
    return bound, problems


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return _shown(value)
    return _shown(json.dumps(value)) if isinstance(value, (list, dict)) else repr(value)


def _same_value(got: Any, want: Any, case_insensitive: bool) -> bool:
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return got == want
    if isinstance(got, str) and isinstance(want, str) and case_insensitive:
        return got.casefold() == want.casefold()
    return type(got) is type(want) and got == want


def matching_paren(text: str, open_index: int) -> int | None:
    """Index of the parenthesis closing the one at ``open_index``, skipping string literals."""
    depth = 0
    quote: str | None = None
    index = open_index
    while index < len(text):
        char = text[index]
        if quote:
            if char == "\\":
                index += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return index
        index += 1
    return None


def find_calls(text: str, recognise: Callable[[str], bool] | None = None) -> list[FoundCall]:
    """Every parsable function call in ``text`` that is not inside another one found.

    With ``recognise``, only calls whose dotted name it accepts are found; the search goes on
    inside any other call.
    """
    calls: list[FoundCall] = []
    position = 0
    for match in _CALL_START.finditer(text):
        if match.start() < position:
            continue
        close = matching_paren(text, match.end() - 1)
        if close is None:
            continue
        end = close + 1
        try:
            node = ast.parse(text[match.start() : end].strip(), mode="eval").body
        except SyntaxError:
            continue
        name = _dotted(node.func) if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Call) and name is not None and (recognise is None or recognise(name)):
            calls.append(FoundCall(name, node, match.start(), end))
            position = end
    return calls


def _outside(reply: str, spans: Sequence[tuple[int, int]]) -> str:
    """The reply's text outside the calls' spans, whitespace and a trailing semicolon aside."""
    pieces = (
        [reply[: spans[0][0]]] + [reply[a[1] : b[0]] for a, b in itertools.pairwise(spans)] + [reply[spans[-1][1] :]]
    )
    return " ".join(piece.strip() for piece in pieces).strip().removesuffix(";").strip()


def _signatures(expected_call: ast.Call, expected_name: str, options: Mapping[str, Any]) -> dict[str, Signature]:
    texts = options.get("signature", [])
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise CheckerConfigError("Option 'signature' must be a list of calls like f(a, b=1).")
    signatures = {signature.name: signature for signature in map(parse_signature, texts)}
    if expected_name not in signatures:
        if signatures:
            declared = ", ".join(sorted(signatures))
            raise CheckerConfigError(f"The expected call {expected_name}() is not in the signature ({declared}).")
        # No declared signature: positional arguments are named by position, keywords by name.
        count = len(expected_call.args)
        names = [f"argument {i + 1}" for i in range(count)] + [k.arg or "" for k in expected_call.keywords]
        signatures[expected_name] = Signature(expected_name, tuple(names), {})
    return signatures


def _parse_expected_call(expected: str) -> tuple[ast.Call, str]:
    try:
        node = ast.parse(expected.strip(), mode="eval").body
    except SyntaxError as error:
        raise CheckerConfigError(f"The expected output is not a Python call: {error.msg}.") from None
    name = _dotted(node.func) if isinstance(node, ast.Call) else None
    if not isinstance(node, ast.Call) or name is None:
        raise CheckerConfigError("The expected output is not a single Python function call.")
    return node, name


_PYTHON_CALL_OPTIONS = ("signature", "case_insensitive", "patterns", "api_like", "labels", "formats")


def _check_python_call(expected: str, reply: str, options: Mapping[str, Any]) -> CheckResult:
    _known_options("python_call", options, _PYTHON_CALL_OPTIONS)
    expected_call, expected_name = _parse_expected_call(expected)
    signatures = _signatures(expected_call, expected_name, options)
    signature = signatures[expected_name]
    case_insensitive = options.get("case_insensitive", [])
    if not isinstance(case_insensitive, list) or not all(p in signature.parameters for p in case_insensitive):
        raise CheckerConfigError(f"Option 'case_insensitive' must list parameters of {expected_name}().")
    patterns = options.get("patterns", {})
    if not isinstance(patterns, dict) or not all(p in signature.parameters for p in patterns):
        raise CheckerConfigError(f"Option 'patterns' must map parameters of {expected_name}() to regexes.")
    compiled = {name: _compile(str(pattern)) for name, pattern in patterns.items()}
    wanted, problems = _bind(expected_call, signature)
    unreadable = [name for name, value in wanted.items() if value is _UNREADABLE]
    missing = [p for p in signature.parameters if p not in wanted]
    if problems or unreadable or missing:
        detail = problems + [f"{n} is not a constant" for n in unreadable] + [f"{n} is missing" for n in missing]
        raise CheckerConfigError(f"The expected call does not fit its signature: {'; '.join(detail)}.")
    recognise = _api_like(options, signatures)
    labelled = _option(options, "labels", bool, False)
    formats = options.get("formats", {})
    if not isinstance(formats, dict) or not all(
        p in signature.parameters and kind in _FORMATS for p, kind in formats.items()
    ):
        raise CheckerConfigError(
            f"Option 'formats' must map parameters of {expected_name}() to one of {', '.join(_FORMATS)}."
        )
    if formats and not labelled:
        raise CheckerConfigError("Option 'formats' needs the option 'labels'.")
    if labelled:
        rules = _LabelRules(signatures, signature, case_insensitive, compiled, formats, recognise)
        return _check_labelled(expected_call, wanted, reply, rules)

    calls = find_calls(reply, recognise)
    short_names = {s.short_name: s for s in signatures.values()}
    known = [c for c in calls if c.name in signatures or c.name.rsplit(".", 1)[-1] in short_names]
    if not calls:
        return _result(["the reply contains no function call"], garbage=True)
    main = next(
        (c for c in known if c.name == expected_name),
        next((c for c in known if c.name.rsplit(".", 1)[-1] == signature.short_name), known[0] if known else None),
    )
    if main is None:  # Calls, but none of the API's functions.
        main = calls[0]
        if main.name.split(".")[0] != expected_name.split(".")[0]:
            return _result([f"{main.name}() is not part of the API"], garbage=True)
    same_function = main.name.rsplit(".", 1)[-1] == signature.short_name
    # The parameters are parts only when the call can be bound to the expected signature.
    found = _Findings(["function", *(signature.parameters if same_function else ()), "calls", "text around"])
    if main.name != expected_name:
        found.add("function", f"called {main.name}(), expected {expected_name}()")
    if same_function:
        got, problems = _bind(main.node, signature)
        for problem in problems:
            found.add("function", problem)
        for parameter in signature.parameters:
            want = wanted[parameter]
            if parameter not in got:
                found.add(parameter, f"{parameter} is missing")
                continue
            value = got[parameter]
            if value is _UNREADABLE:
                found.add(parameter, f"{parameter} is not a literal value")
            elif parameter in compiled:
                if not compiled[parameter].fullmatch(str(value)):
                    found.add(parameter, f"{parameter} is {_value_text(value)}, expected {_value_text(want)}")
            elif not _same_value(value, want, parameter in case_insensitive):
                found.add(parameter, f"{parameter} is {_value_text(value)}, expected {_value_text(want)}")
        for parameter in signature.parameters:
            if parameter not in compiled:  # A value the turn leaves open is no fact.
                found.facts(parameter, wanted[parameter], got.get(parameter, _UNREADABLE))
    if len(calls) > 1:
        found.add("calls", f"{len(calls)} calls, expected one")
    outside = _outside(reply, [(call.start, call.end) for call in calls])
    if outside:
        found.add("text around", f"text around the call: {_shown(outside)!r}")
    return found.result()


# --- python_call with labels: the rules training and evaluation count by ---------------------------

# The kinds of mistake (``CheckResult.labels``): fixed strings, so that callers can count them.
WRONG_API = "wrong API"
MISSING_ARGUMENT = "missing argument"
EXTRA_ARGUMENT = "extra argument"
CHATTER = "chatter around the call"
EXTRA_PARENTHESIS = "extra parenthesis"
EXTRA_CALL = "extra call"
NO_CALL = "no recognisable API call"


def wrong(parameter: str) -> str:
    """The label of a wrong value of ``parameter`` ("wrong date")."""
    return f"wrong {parameter}"


def wrong_format(parameter: str) -> str:
    """The label of the right value of ``parameter`` in the wrong format ("wrong date format")."""
    return f"wrong {parameter} format"


# Those of the calendar API, whose parameters are title, date, time and duration.
WRONG_TITLE, WRONG_DATE, WRONG_TIME, WRONG_DURATION = map(wrong, ("title", "date", "time", "duration"))
WRONG_DATE_FORMAT, WRONG_TIME_FORMAT = wrong_format("date"), wrong_format("time")
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

_MONTH_NAMES = (
    ("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",),
    ("jun", "june"), ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"),
    ("oct", "october"), ("nov", "november"), ("dec", "december"),
)  # fmt: skip
_MONTHS = {name: number for number, names in enumerate(_MONTH_NAMES, start=1) for name in names}
_DATE_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(\d{4})-(\d{1,2})-(\d{1,2})", "ymd"),
    (r"(\d{4})/(\d{1,2})/(\d{1,2})", "ymd"),
    (r"(\d{1,2})/(\d{1,2})/(\d{4})", "mdy"),
    (r"(\d{1,2})-(\d{1,2})-(\d{4})", "mdy"),
    (r"([A-Za-z]+)\.? (\d{1,2}),? (\d{4})", "Mdy"),
    (r"(\d{1,2}) ([A-Za-z]+)\.?,? (\d{4})", "dMy"),
)


def parse_date(value: str) -> tuple[int, int, int] | None:
    """(year, month, day) of a date written in a common format, or None.

    Tells a right date in the wrong format ("11/11/2024") from a wrong date.
    """
    value = value.strip()
    for pattern, order in _DATE_PATTERNS:
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
        return None  # A bare number is not a time.
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half.startswith("p") else 0)
    if hour > 23 or minute > 59:
        return None
    return hour, minute


# A format: how to read a value, and the format a value should be written in.
_FORMATS: dict[str, tuple[Callable[[str], Any], str]] = {
    "date": (parse_date, "YYYY-MM-DD"),
    "time": (parse_time, "HH:MM"),
}


class _Unreadable(Exception):
    """An argument that is not a literal of the kind expected."""


def _int_value(node: ast.AST) -> int:
    """Integer arithmetic (``60*3``, ``90``, ``(1+2)*60``) on the syntax tree: every step an
    integer (a float only when whole), factors of a product at most a million."""
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
            if abs(left) > 10**6 or abs(right) > 10**6:  # No giant numbers from hostile input.
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


def _literal(node: ast.AST, want: Any) -> Any:
    """The reply's argument read as the kind of value expected: a string only as a string
    literal, an integer by integer arithmetic, anything else folded; or ``_UNREADABLE``."""
    try:
        if isinstance(want, str):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                return node.value
            return _UNREADABLE
        if isinstance(want, int) and not isinstance(want, bool):
            return _int_value(node)
        return fold_constant(node)
    except (_Unreadable, RecursionError):
        return _UNREADABLE


def _api_like(options: Mapping[str, Any], signatures: Mapping[str, Signature]) -> Callable[[str], bool] | None:
    """The ``api_like`` option as a test of a called name; None (every call) without it."""
    if "api_like" not in options:
        return None
    pattern = _compile(_option(options, "api_like", str, ""))
    short_names = {s.short_name for s in signatures.values()}
    receivers = {s.name.rsplit(".", 1)[0] for s in signatures.values() if "." in s.name}

    def recognise(name: str) -> bool:
        receiver, _, short = name.rpartition(".")
        return short in short_names or receiver in receivers or bool(pattern.search(short))

    return recognise


@dataclass(frozen=True)
class _LabelRules:
    signatures: Mapping[str, Signature]  # The API, in the order declared.
    signature: Signature  # The expected call's.
    case_insensitive: Sequence[str]
    patterns: Mapping[str, re.Pattern[str]]
    formats: Mapping[str, str]
    recognise: Callable[[str], bool] | None


def _bind_labelled(call: ast.Call, parameters: Sequence[str]) -> tuple[dict[str, ast.AST], list[str]]:
    """Arguments by parameter name (positional ones by their position, a ``*args`` holding its
    place), and what could not be bound."""
    bound: dict[str, ast.AST] = {}
    extra: list[str] = []
    for index, argument in enumerate(call.args):
        if index < len(parameters) and not isinstance(argument, ast.Starred):
            bound[parameters[index]] = argument
        else:
            extra.append(f"positional argument {index + 1}")
    for keyword in call.keywords:
        if keyword.arg is None:
            extra.append("**kwargs")
        elif keyword.arg in bound:
            extra.append(f"{keyword.arg} given twice")
        elif keyword.arg not in parameters:
            extra.append(keyword.arg)
        else:
            bound[keyword.arg] = keyword.value
    return bound, extra


def _extra_parenthesis_end(reply: str, call: FoundCall) -> int | None:
    """Where a ``)`` too many right after ``call`` ends; None if there is none (a ``)`` that
    closes a ``(`` opened before the call, as in ``print(f(...))``, is not one too many)."""
    closing = re.match(r"[\s)]*", reply[call.end :]).group(0)  # type: ignore[union-attr]
    before = reply[: call.start]
    if closing.count(")") - max(before.count("(") - before.count(")"), 0) <= 0:
        return None
    return call.end + closing.rindex(")") + 1


def _date_difference(got: tuple[int, int, int], want: tuple[int, int, int]) -> str:
    """Which part of a wrong date is wrong, when only the year or only the month and day are."""
    if got[1:] == want[1:]:
        return " (year)"
    return " (month/day)" if got[0] == want[0] else ""


def _check_labelled(expected_call: ast.Call, wanted: Mapping[str, Any], reply: str, rules: _LabelRules) -> CheckResult:
    """python_call with ``labels``: mistakes by kind, each kind once.

    The call judged is the first one of the expected function, else the first call. Its
    arguments bind to the signature of the function it calls (by short name), or to the first
    one declared for a function outside the API, which then needs only the parameters every
    function of the API has. Each parameter of the expected call that the reply's function
    needs is compared: a call of another function is a wrong API and still compared argument by
    argument.
    """
    calls = find_calls(reply, rules.recognise)
    if not calls:
        return _result(["the reply contains no call of the API"], garbage=True, labels=[NO_CALL])
    signature = rules.signature
    main = next((call for call in calls if call.name == signature.name), calls[0])
    short_names = {s.short_name: s for s in rules.signatures.values()}
    called = short_names.get(main.name.rsplit(".", 1)[-1])
    if called is not None:
        binding, needed = called, called.parameters
    else:
        declared = list(rules.signatures.values())
        binding = declared[0]
        needed = tuple(p for p in binding.parameters if all(p in s.parameters for s in declared))
    nodes, extra = _bind_labelled(main.node, binding.parameters)
    missing = [p for p in needed if p not in nodes and p not in binding.defaults]
    compared = [p for p in signature.parameters if p in needed and p not in missing]
    found = _Findings(["function", *compared, *missing, "calls", "text around"])
    if main.name != signature.name:
        found.add("function", f"called {main.name}(), expected {signature.name}()", WRONG_API)
    if missing:
        found.add(missing, f"missing {', '.join(missing)}", MISSING_ARGUMENT)
    if extra:
        found.add("function", f"unexpected {', '.join(extra)}", EXTRA_ARGUMENT)
    got: dict[str, Any] = {}
    for parameter in compared:
        want = wanted[parameter]
        node = nodes.get(parameter)
        value = got[parameter] = binding.defaults[parameter] if node is None else _literal(node, want)
        shown = f"{parameter} is {_value_text(value)}, expected {_value_text(want)}"
        if value is _UNREADABLE:
            found.add(parameter, f"{parameter} is not a literal value", wrong(parameter))
        elif parameter in rules.patterns:
            if not rules.patterns[parameter].fullmatch(str(value)):
                found.add(parameter, shown, wrong(parameter))
        elif not _same_value(value, want, parameter in rules.case_insensitive):
            label, note = wrong(parameter), ""
            if parameter in rules.formats and isinstance(value, str) and isinstance(want, str):
                read, written = _FORMATS[rules.formats[parameter]]
                value_read, want_read = read(value), read(want)
                if value_read is not None and value_read == want_read:
                    label, note = wrong_format(parameter), f" ({written})"
                elif rules.formats[parameter] == "date" and value_read and want_read:
                    note = _date_difference(value_read, want_read)
            found.add(parameter, shown + note, label)
    for parameter in signature.parameters:
        if parameter in needed and parameter not in rules.patterns:
            found.facts(parameter, wanted[parameter], got.get(parameter, _UNREADABLE))
    if len(calls) > 1:
        found.add("calls", f"{len(calls)} calls, expected one", EXTRA_CALL)
    ends = [_extra_parenthesis_end(reply, call) for call in calls]
    if any(end is not None for end in ends):
        found.add("text around", "a ')' too many after the call", EXTRA_PARENTHESIS)
    spans = [(call.start, end or call.end) for call, end in zip(calls, ends, strict=True)]
    outside = _outside(reply, spans)
    if outside:
        found.add("text around", f"text around the call: {_shown(outside)!r}", CHATTER)
    return found.result()


_CHECKERS: dict[str, Callable[[str, str, Mapping[str, Any]], CheckResult]] = {
    "exact": _check_exact,
    "regex": _check_regex,
    "json": _check_json,
    "python_call": _check_python_call,
}


def check(kind: str, expected: str, reply: str, options: Mapping[str, Any] | None = None) -> CheckResult:
    """Judge ``reply`` against ``expected`` with the checker ``kind``.

    Raises CheckerConfigError if the kind, the expected output or the options are invalid.
    """
    checker = _CHECKERS.get(kind)
    if checker is None:
        raise CheckerConfigError(f"Unknown checker {kind!r}; use one of {', '.join(CHECKER_KINDS)}.")
    return checker(expected, reply, options or {})


def validate(kind: str, expected: str, options: Mapping[str, Any] | None = None) -> None:
    """Raise CheckerConfigError, saying what is wrong, unless the checker can judge replies.

    The expected output must itself pass its own check (a task whose answer fails is a bug).
    """
    result = check(kind, expected, expected, options)
    if not (kind == "regex" or result.verdict == "correct"):
        raise CheckerConfigError(f"The expected output fails its own check: {result.reason}.")
