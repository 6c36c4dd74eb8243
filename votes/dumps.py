"""Dated dumps of the votes for researchers (``manage.py export_dump``, nightly by beat)."""

import csv
import gzip
import hashlib
import io
import json
import re
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from django.utils import timezone

from votes import research

LICENCE_PLACEHOLDER = "TO BE DECIDED by the arena's operators before publication (e.g. CC-BY-4.0)."


def export_dump(out: Path, *, day: date | None = None, progress: Callable[[int], None] | None = None) -> Path:
    """Write ``out/<day>/``: votes.jsonl.gz, votes.csv.gz, votes.parquet (if pyarrow is
    installed), episodes.jsonl.gz (the fix episodes) and a dataset card (dataset_card.json and
    README.md) with counts and checksums.

    Every vote is there, each with ``excluded`` and its reason, so a dump can be filtered like
    the leaderboard (or not).
    """
    folder = out / (day or timezone.localdate()).isoformat()
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    queryset = research.all_votes()  # Every stage: a battle's two votes are two records.
    for record in research.vote_records(queryset, with_exclusion=True):
        records.append(record)
        if progress:
            progress(1)
    episodes = research.episode_records(include_excluded=True)
    files = {"votes.jsonl.gz": _jsonl(records), "votes.csv.gz": _csv(records), "episodes.jsonl.gz": _jsonl(episodes)}
    parquet = _parquet(records)
    if parquet is not None:
        files["votes.parquet"] = parquet
    for name, content in files.items():
        (folder / name).write_bytes(content)
    card = {
        "name": "Fix Arena votes",
        "date": folder.name,
        "licence": LICENCE_PLACEHOLDER,
        "records": len(records),
        "counts": _counts(records),
        "files": {
            name: {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
            for name, content in files.items()
        },
        "fields": FIELD_DOCS,
        "privacy": "No IP address or session identifier. judge is an HMAC of the voter with a server secret, "
        "stable across dumps. Conversation text is as the models and voters wrote it.",
    }
    (folder / "dataset_card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(_card_markdown(card), encoding="utf-8")
    return folder


FIELD_DOCS = {
    "question_id": "battle id and vote stage, unique per record",
    "model_a / model_b": "the models, by roster name",
    "winner": "model_a, model_b, tie or tie (bothbad)",
    "judge": "the voter's pseudonym (keyed hash)",
    "conversation_a / conversation_b": "what the voter had seen: [{role, content, num_tokens}]",
    "turn": "number of user turns in the conversation",
    "conv_metadata": "style, as in LMArena's releases: sum_assistant_a_tokens / _b_tokens, header_count_a / _b, "
    "list_count_a / _b, bold_count_a / _b (markdown headers, list items, bold spans of the replies seen)",
    "anony": "always true: names are revealed only after the votes",
    "language": "unknown (not detected)",
    "tstamp": "Unix time the battle ended (when its votes started to count)",
    "stage": "first_try or after_fix",
    "after_turn": "the last turn (0-based) the voter had seen when voting",
    "corrections": "prompts sent to one side only: [{side, turn, text}]",
    "ratings_a / ratings_b": "per reply: turn, status, stop_reason (stop: its model ended it; length or time: "
    "its token or seconds cap did; cancelled, shutdown, error), cut (a cap ended it), voter rating (correct, "
    "mistake, fixed, garbage), checker verdict and reason, regenerations",
    "task / task_category": "the curated task, or null for free chat",
    "system_prompt / context / script": "the task's system prompt, context (a conversation handed to both "
    "models as their own) and scripted turns (prompt, expected_output, corrects_previous) as the battle's "
    "models were given them when it started, or null for free chat",
    "excluded / excluded_reason": "whether the leaderboard leaves the vote out, and why",
    "episodes.jsonl.gz": "fix episodes (a reply judged wrong, the correction to that side, the reply to it): "
    "episode_id, battle, model, task, turn (the scripted turn: the difficulty), wrong_turn, side, attempt, "
    "correction (null for an evaluation run's checker-written correction, which quotes a reply, while that "
    "reply's model is in the arena), source (scripted, voter or checker), feedback_kind (generic, pointing, "
    "prescriptive), fixed, decoy, "
    "excluded / excluded_reason; `manage.py rate_fixes` rates the file as it is",
}


# What export_dump writes: a folder per day, plain file names. Anything else under the dump
# folder (a NUL, a slash, dot-dot, a hidden file) is not a dump file and is never served.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _is_dump_file(path: Path) -> bool:
    """A regular file (not a link) in a day folder (not a link), both with safe names."""
    return (
        SAFE_NAME.fullmatch(path.name) is not None
        and SAFE_NAME.fullmatch(path.parent.name) is not None
        and not path.is_symlink()
        and not path.parent.is_symlink()
        and path.is_file()
    )


def dump_files(out: Path) -> list[Path]:
    """The files of every dump under ``out`` (``<date>/<file>``), newest first; links are
    never followed nor listed (their names and sizes would tell of files elsewhere)."""
    return sorted((p for p in out.glob("*/*") if _is_dump_file(p)), reverse=True) if out.is_dir() else []


def dump_file(out: Path, day: str, name: str) -> Path | None:
    """``out/<day>/<name>`` if it is a dump file; None for anything else (no path escapes, no
    links, no NUL or slash in either part)."""
    if SAFE_NAME.fullmatch(day) is None or SAFE_NAME.fullmatch(name) is None:
        return None
    path = out / day / name
    return path if out.is_dir() and _is_dump_file(path) else None


def _counts(records: list[dict[str, Any]]) -> dict[str, Any]:
    counts: dict[str, Any] = {
        "by_stage": {},
        "excluded": {},
        "models": len({r["model_a"] for r in records} | {r["model_b"] for r in records}),
    }
    for record in records:
        counts["by_stage"][record["stage"]] = counts["by_stage"].get(record["stage"], 0) + 1
        if record["excluded"]:
            reason = record["excluded_reason"].split(":")[0]
            counts["excluded"][reason] = counts["excluded"].get(reason, 0) + 1
    return counts


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    text = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    return gzip.compress(text.encode("utf-8"), mtime=0)


def _csv(records: list[dict[str, Any]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=research.CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for record in records:
        writer.writerow(research.flat_record(record))
    return gzip.compress(buffer.getvalue().encode("utf-8"), mtime=0)


def _parquet(records: list[dict[str, Any]]) -> bytes | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    flat = [research.flat_record(record) for record in records]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(flat), sink)
    return sink.getvalue()


def _card_markdown(card: dict[str, Any]) -> str:
    lines = [
        f"# {card['name']}, {card['date']}",
        "",
        f"{card['records']} votes ({', '.join(f'{n} {s}' for s, n in card['counts']['by_stage'].items()) or 'none'}); "
        f"{card['counts']['models']} models. Licence: {card['licence']}",
        "",
        card["privacy"],
        "",
        "## Files",
        "",
        *[f"- `{name}`: {info['bytes']} bytes, sha256 `{info['sha256']}`" for name, info in card["files"].items()],
        "",
        "## Fields (clean_battle compatible, plus this arena's)",
        "",
        *[f"- `{name}`: {doc}" for name, doc in card["fields"].items()],
        "",
    ]
    return "\n".join(lines)
