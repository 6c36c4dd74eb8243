"""manage.py loadtest, small: real websocket voters against daphne + Redis + a Celery worker,
each a whole battle with a correction and two votes; nothing lost, reordered or refused."""

import json
import math
import uuid
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inference.models import LLM
from votes.models import Battle, Vote
from votes.testing.voters import ReplyRecord, VoterResult, percentile, summarize

pytestmark = pytest.mark.django_db(transaction=True)


def test_small_load_test_delivers_every_token_in_order(demo_llms, tmp_path: Path, capsys) -> None:
    for llm in demo_llms:  # Queues of their own: only the load test's worker serves them.
        llm.queue = f"loadtest-{uuid.uuid4().hex[:8]}.{llm.name}"
        llm.save()
    report_path = tmp_path / "report.json"

    # The quick warm-up: an inference host compiling every shape first takes minutes.
    call_command("loadtest", battles=4, worker_threads=8, warm_up="battle", json=report_path, log_dir=tmp_path / "logs")

    report = json.loads(report_path.read_text())
    assert report["errors"] == []
    assert report["battles_finished"] == 4
    assert report["replies"] == 4 * 3  # both sides, then the corrected side
    assert report["tokens_produced"] > 0
    assert report["delivered_ratio"] == 1.0
    assert report["replies_not_as_saved"] == 0
    assert report["order_violations"] == 0
    assert report["frames_timed"] > 0 and report["latency_p99_ms"] >= report["latency_p50_ms"] > 0
    # Its two parts, timed at daphne (each frame's parts add up to its whole): the Redis channel
    # layer, and daphne to the voter.
    assert 0 < report["layer_p50_ms"] <= report["latency_p50_ms"]
    assert 0 < report["socket_p50_ms"] <= report["latency_p50_ms"]
    assert report["votes"] == 8
    # The votes are really stored: two stages per battle, every battle ended (the warm-up's too).
    assert Vote.objects.count() == 2 * (4 + 1)
    assert Battle.objects.filter(state=Battle.State.ENDED).count() == 4 + 1
    assert "tokens delivered / produced" in capsys.readouterr().out
    # The web tier's share is timed from the frame relay on; the worker's hand-off before it.
    assert report["handoff_p50_ms"] >= 0
    assert report["end_to_end_p99_ms"] >= report["latency_p50_ms"]
    # The worker shared these cores with the web tier, at a lower priority than its relay.
    assert "Worker priority lowered (nice +19, SCHED_IDLE" in (tmp_path / "logs" / "loadtest-worker.log").read_text()


@pytest.mark.parametrize("left_out", [{"enabled": False}, {"context_tokens": 512}])
def test_load_test_needs_two_models(demo_llms, left_out: dict[str, object]) -> None:
    """Two models anonymous battles draw: enabled ones whose context holds the arena's limit."""
    LLM.objects.filter(pk=demo_llms[0].pk).update(**left_out)
    with pytest.raises(CommandError, match="two models that anonymous battles draw"):
        call_command("loadtest", battles=1)


def test_summary_counts_lost_and_reordered_text() -> None:
    whole = VoterResult(models={"a": "m", "b": "m"}, votes=2, finished=True, latencies_s=[0.001, 0.003])
    whole.replies[(0, "a")] = ReplyRecord(side="a", turn=0, delivered="one two", saved="one two")
    short = VoterResult(models={"a": "m", "b": "m"}, votes=1, order_violations=1, finished=True)
    short.replies[(0, "b")] = ReplyRecord(side="b", turn=0, delivered="one", saved="one two")

    report = summarize([whole, short], duration_s=2.0, count_tokens=lambda model, text: len(text.split()))

    assert (report.tokens_delivered, report.tokens_produced) == (3, 4)
    assert report.delivered_ratio == 0.75
    assert report.replies_not_as_saved == 1
    assert report.order_violations == 1
    assert report.votes_per_s == 1.5
    assert report.latency_p50_ms == pytest.approx(1.0)
    assert report.latency_p99_ms == pytest.approx(3.0)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile(list(range(1, 101)), 99) == 99
    assert math.isnan(percentile([], 50))
