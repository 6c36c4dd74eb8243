"""Every reply appears at the same pace (inference/pacing.py, inference.services.DeltaBatcher)."""

from typing import Any

import pytest

from inference.pacing import Pace
from inference.services import DeltaBatcher
from votes import services
from votes.models import Message


def test_the_pace() -> None:
    pace = Pace(chars_per_s=100, first_after_s=0.5)
    assert pace.active and not Pace().active
    assert pace.visible(0.2, 1000) == 0  # Nothing before the first text is due.
    assert pace.visible(0.5, 1000) == 1
    assert pace.visible(1.5, 1000) == 101
    assert pace.visible(1.5, 40) == 40  # Never more than there is.
    assert pace.wait_s(0.2, 0) == pytest.approx(0.3)
    assert pace.wait_s(1.0, 51) == pytest.approx(0.01)
    assert pace.wait_s(2.0, 51) == 0.0
    assert Pace().visible(0.0, 7) == 7 and Pace().wait_s(0.0, 0) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        Pace(chars_per_s=-1)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def publish(self, group: str, frames: list[dict[str, Any]]) -> None:
        self.frames += frames


@pytest.fixture
def streaming_reply(demo_llms: Any) -> Message:
    battle = services.start_battle(voter_key="voter")
    Message.objects.create(battle=battle, side="a", turn=0, role=Message.Role.USER, content="Hi")
    return Message.objects.create(
        battle=battle, side="a", turn=0, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING
    )


def batcher_for(reply: Message, pace: Pace, time: FakeTime, recorder: Recorder) -> DeltaBatcher:
    return DeltaBatcher(
        message_id=reply.pk, group="g", side="a", turn=0, publisher=recorder, pace=pace,
        clock=time.clock, sleep=time.sleep,
    )  # fmt: skip


@pytest.mark.django_db
def test_a_fast_model_is_shown_at_the_pace(streaming_reply: Message) -> None:
    time, recorder = FakeTime(), Recorder()
    batcher = batcher_for(streaming_reply, Pace(chars_per_s=100, first_after_s=0.5), time, recorder)
    text = "action.add_calendar_entry(" * 10  # 260 characters, all generated at once.
    for piece in (text[:100], text[100:]):
        batcher.add(piece)
    assert recorder.frames == []  # Not before 0.5 s, however fast the model was.
    streaming_reply.refresh_from_db()
    assert streaming_reply.content == ""  # Nor in the database a reconnecting page reads.
    batcher.drain()
    assert "".join(frame["text"] for frame in recorder.frames) == text
    assert [frame["seq"] for frame in recorder.frames] == list(range(len(recorder.frames)))
    # 260 characters at 100 a second after the first at 0.5 s: shown by about 3.1 s, not at once.
    assert time.now == pytest.approx(0.5 + 259 / 100, abs=0.1)
    streaming_reply.refresh_from_db()
    assert streaming_reply.content == text and streaming_reply.delta_count == batcher.seq


@pytest.mark.django_db
def test_a_stop_while_held_back_keeps_only_what_was_shown(streaming_reply: Message) -> None:
    time, recorder = FakeTime(), Recorder()
    batcher = batcher_for(streaming_reply, Pace(chars_per_s=100, first_after_s=0.0), time, recorder)
    batcher.add("x" * 500)
    time.now = 1.0
    batcher.flush()
    Message.objects.filter(pk=streaming_reply.pk).update(stop_requested=True)  # The voter presses Stop.
    batcher.drain()
    assert batcher.stop_requested
    shown = "".join(frame["text"] for frame in recorder.frames)
    assert batcher.published_text == shown and 0 < len(shown) < 500


@pytest.mark.django_db
def test_without_a_pace_text_goes_out_at_once(streaming_reply: Message) -> None:
    time, recorder = FakeTime(), Recorder()
    batcher = batcher_for(streaming_reply, Pace(), time, recorder)
    batcher.add("Sure")
    batcher.add(", here it is.")
    batcher.drain()
    assert [frame["text"] for frame in recorder.frames] == ["Sure", ", here it is."]
    assert time.now == 0.0  # Nothing waited.


@pytest.mark.django_db
def test_a_nul_character_from_the_model_is_saved_and_shown_as_a_replacement(streaming_reply: Message) -> None:
    time, recorder = FakeTime(), Recorder()
    batcher = batcher_for(streaming_reply, Pace(), time, recorder)
    batcher.add("ab\x00c")  # PostgreSQL text refuses NUL: the reply would fail to save.
    batcher.drain()
    assert [frame["text"] for frame in recorder.frames] == ["ab\ufffdc"]
    streaming_reply.refresh_from_db()
    assert streaming_reply.content == "ab\ufffdc"
