"""Every reply appears at the same pace (votes/pacing.py, votes.generation.DeltaBatcher)."""

import random
import time as time_module
from typing import Any

import pytest
from django.conf import settings

from inference.models import LLM
from votes import selectors, services
from votes.generation import DeltaBatcher
from votes.models import Battle, Message
from votes.pacing import Pace, battle_pace, first_text_lead, sustained_speed, typical_first_token_s
from votes.selectors import HoldState


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


# --- One pace per battle: what its slower model sustains; both sides start together --------


def test_a_battle_is_paced_at_what_its_slower_model_sustains() -> None:
    assert sustained_speed([]) is None
    assert sustained_speed([50.0]) == 50.0
    # The 10th percentile: what nine replies in ten keep up with.
    assert sustained_speed([float(speed) for speed in range(100, 200, 5)]) == pytest.approx(109.5)
    assert battle_pace(250, [400.0, 100.0], unmeasured=40, margin=0.8) == pytest.approx(80.0)
    assert battle_pace(50, [400.0, 100.0], unmeasured=40, margin=0.8) == 50  # Never above the site's pace.
    assert battle_pace(250, [400.0, None], unmeasured=40, margin=0.8) == 40  # A new model: the cautious pace.
    assert battle_pace(0, [400.0, 100.0], unmeasured=40, margin=0.8) == 0  # Pacing off stays off.


def test_the_first_text_waits_for_the_slowest_model_s_typical_first_token() -> None:
    """A model's typical wait is the 90th percentile of its recent times to first token (one slow
    reply of ten moves it less than the maximum would); the arena's lead is the longest typical
    wait of the models it may draw, unmeasured ones left out, and 0 with pacing off."""
    assert typical_first_token_s([]) is None
    assert typical_first_token_s([700.0]) == pytest.approx(0.7)
    times = [100.0 * i for i in range(1, 11)]  # 0.1 s .. 1.0 s
    assert typical_first_token_s(times) == pytest.approx(0.91)
    assert first_text_lead([0.2, None, 2.5, 0.1], pacing=True) == 2.5
    assert first_text_lead([None], pacing=True) == 0.0
    assert first_text_lead([0.2, 2.5], pacing=False) == 0.0


def set_speeds(llm: LLM, chars_per_s: float, first_token_ms: float) -> None:
    LLM.objects.filter(pk=llm.pk).update(sustained_chars_per_s=chars_per_s, typical_first_token_ms=first_token_ms)


@pytest.mark.django_db
def test_an_anonymous_battle_is_paced_by_the_arena_not_by_its_pair(demo_llms: list[LLM], settings: Any) -> None:
    """Two fast models (300 and 400 characters a second, first tokens in 0.1-0.15 s) and a slow
    one (5, 2.5 s): every anonymous battle, with the slow model or without it, gets the same pace
    (0.8 x 5) and the same first-text lead (2.5 s), and its replies' generation context carries
    them; a named battle of the two fast models keeps its pair's pace (0.8 x 300) and no lead. A
    model taken out of anonymous battles no longer sets their pace."""
    settings.ARENA_STREAM_PACE_MARGIN = 0.8  # The figures below; the default is docs/configuration.md's.
    fast_a, fast_b = demo_llms
    slow = LLM.objects.create(
        name="slow", family=fast_a.family, preset=fast_a.preset, queue=fast_a.queue, context_tokens=2048
    )
    set_speeds(fast_a, 400.0, 100.0)
    set_speeds(fast_b, 300.0, 150.0)
    set_speeds(slow, 5.0, 2500.0)
    rng = random.Random(1)
    battles = [services.start_battle(voter_key="v", rng=rng) for _ in range(12)]
    with_slow = [b for b in battles if slow.pk in (b.model_a_id, b.model_b_id)]
    assert with_slow and len(with_slow) < len(battles)  # Both kinds of pair were drawn.
    assert {(b.pace_chars_per_s, b.first_text_lead_s) for b in battles} == {(0.8 * 5.0, 2.5)}
    Message.objects.create(battle=battles[0], side="b", turn=0, role=Message.Role.USER, content="Hi")
    reply = Message.objects.create(battle=battles[0], side="b", turn=0, role=Message.Role.ASSISTANT)
    context = selectors.generation_context(reply.pk)
    assert context is not None and (context.pace_chars_per_s, context.first_text_lead_s) == (pytest.approx(4.0), 2.5)

    named = services.start_battle(voter_key="v", mode=Battle.Mode.NAMED, models=[fast_a.name, fast_b.name])
    assert named.pace_chars_per_s == pytest.approx(240.0) and named.first_text_lead_s is None

    LLM.objects.filter(pk=slow.pk).update(enabled=False)
    battle = services.start_battle(voter_key="v", rng=rng)
    assert (battle.pace_chars_per_s, battle.first_text_lead_s) == (pytest.approx(240.0), 0.15)


@pytest.mark.django_db
def test_a_finished_reply_updates_its_model_s_typical_first_token(streaming_reply: Message) -> None:
    """Each finished reply with a time to first token re-measures its model's typical wait over
    its last ARENA_STREAM_PACE_SAMPLE replies (0.1 s .. 1.0 s: the 90th percentile, 0.91 s)."""
    battle = streaming_reply.battle
    for turn, ms in enumerate(range(100, 1001, 100)):
        if turn:
            Message.objects.create(battle=battle, side="a", turn=turn, role=Message.Role.USER, content="Hi")
            reply = Message.objects.create(
                battle=battle, side="a", turn=turn, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING
            )
        else:
            reply = streaming_reply
        assert services.finish_reply(
            reply.pk, status=Message.Status.DONE, content="ok", delta_count=1, stop_reason="stop",
            token_count=1, time_to_first_token_ms=ms, duration_ms=ms + 10,
        )  # fmt: skip
    battle.model_a.refresh_from_db()
    assert battle.model_a.typical_first_token_ms == pytest.approx(910.0)


class Partner:
    """The other side's reply, as votes.selectors.hold_state reports it to a holding side."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.started_at: float | None = None
        self.finished = False
        self.stop = False  # The voter stopped the holding side's reply.
        self.lookups = 0
        self.claimed_at = 0.0  # When its worker started on it (this side's started at 0).
        self.own_recorded_at: float | None = None  # This side's first text, as the database recorded it.

    def start_now(self) -> None:
        self.started_at = self.time.now

    def __call__(self) -> HoldState:
        self.lookups += 1
        ago = None if self.started_at is None else self.time.now - self.started_at
        return HoldState(
            partner_started_s_ago=ago,
            partner_finished=self.finished,
            stop_requested=self.stop,
            later_claim_s_ago=self.time.now - max(0.0, self.claimed_at),
            own_started_s_ago=None if self.own_recorded_at is None else self.time.now - self.own_recorded_at,
        )


def paired_batcher(reply: Message, pace: Pace, lead_s: float = 0.0) -> tuple[DeltaBatcher, FakeTime, Recorder, Partner]:
    """One side's batcher on a fake clock, its frames recorded, its first text held for ``partner``."""
    time, recorder = FakeTime(), Recorder()
    partner = Partner(time)
    batcher = DeltaBatcher(
        message_id=reply.pk, group="g", side="a", turn=0, publisher=recorder, pace=pace, hold=partner,
        lead_s=lead_s, clock=time.clock, sleep=time.sleep,
    )  # fmt: skip
    return batcher, time, recorder, partner


def first_and_last_frame_times(
    reply: Message, partner_first_text_s: float | None, lead_s: float
) -> tuple[float, float, str]:
    """When one side's first and last frames go out, and the text they carry: its model has 300
    characters at 0.1 s, the other side's first text comes at ``partner_first_text_s`` (None: no
    partner, a turn sent to one side)."""
    Message.objects.filter(pk=reply.pk).update(content="", delta_count=0)
    pace = Pace(chars_per_s=100, first_after_s=0.2)
    if partner_first_text_s is None:
        time, recorder = FakeTime(), Recorder()
        batcher = DeltaBatcher(
            message_id=reply.pk, group="g", side="a", turn=0, publisher=recorder, pace=pace, lead_s=lead_s,
            clock=time.clock, sleep=time.sleep,
        )  # fmt: skip
    else:
        batcher, time, recorder, partner = paired_batcher(reply, pace, lead_s)
    sent: list[float] = []
    recorder_publish = recorder.publish

    def publish(group: str, frames: list[dict[str, Any]]) -> None:
        sent.append(time.now)
        recorder_publish(group, frames)

    recorder.publish = publish  # type: ignore[method-assign]
    time.now = 0.1
    batcher.add("x" * 300)
    while partner_first_text_s is not None and time.now < partner_first_text_s:
        time.now = min(time.now + 0.05, partner_first_text_s)
        if time.now >= partner_first_text_s:
            partner.start_now()
        batcher.flush()
    batcher.drain()
    return sent[0], sent[-1], "".join(frame["text"] for frame in recorder.frames)


@pytest.mark.django_db
def test_a_fast_pair_s_first_text_comes_as_late_as_a_slow_pair_s(streaming_reply: Message) -> None:
    """With the arena's lead of 2.5 s, a side beside a fast partner (first text at 0.2 s), beside
    a slow one (2.3 s) and alone all show their first text at 2.5 + 0.2 s and their last 299 / 100
    s later; without the lead the fast pair's would show at 0.4 s."""
    times = {partner: first_and_last_frame_times(streaming_reply, partner, lead_s=2.5) for partner in (0.2, 2.3, None)}
    for first, last, text in times.values():
        assert text == "x" * 300
        assert first == pytest.approx(2.5 + 0.2, abs=0.06)
        assert last == pytest.approx(2.5 + 0.2 + 299 / 100, abs=0.06)
    first, _, _ = first_and_last_frame_times(streaming_reply, 0.2, lead_s=0.0)
    assert first == pytest.approx(0.2 + 0.2, abs=0.06)


class TimedRecorder(Recorder):
    """Each frame with the (fake) time it went out."""

    def __init__(self, time: FakeTime) -> None:
        super().__init__()
        self.time = time
        self.sent: list[tuple[float, int]] = []

    def publish(self, group: str, frames: list[dict[str, Any]]) -> None:
        super().publish(group, frames)
        self.sent += [(round(self.time.now, 9), len(frame["text"])) for frame in frames]


def stream(
    batcher: DeltaBatcher, time: FakeTime, tokens: list[tuple[float, str]], partner: Partner | None = None
) -> None:
    """Feed ``batcher`` as the reply's worker does: each token at its time, and a flush whenever
    the batcher's next tick comes first (``DeltaQueue.deltas`` with ``tick=batcher.next_tick_s``);
    then drain. ``partner`` (if any) has its first text with this side's."""
    for at, text in tokens:
        while (wake := time.now + batcher.next_tick_s()) < at:
            time.now = wake
            batcher.flush()
        time.now = at
        batcher.add(text)
        if partner is not None and partner.started_at is None:
            partner.start_now()
    batcher.drain()


@pytest.mark.django_db
def test_a_slow_and_a_fast_model_show_their_text_at_the_same_ticks(streaming_reply: Message) -> None:
    """Side a's model writes 200 characters in 0.5 s, side b's in 3.5 s (57 a second, ahead of
    the pace of 40): the voter sees the same frames at the same moments on both sides, from the
    first text, due at the lead plus the pace's delay, to the last; nothing tells which model
    flushes on its tokens and which on the ticks."""
    battle = streaming_reply.battle
    Message.objects.create(battle=battle, side="b", turn=0, role=Message.Role.USER, content="Hi")
    other = Message.objects.create(
        battle=battle, side="b", turn=0, role=Message.Role.ASSISTANT, status=Message.Status.STREAMING
    )
    fast = [(0.1 + 0.005 * i, "xy") for i in range(100)]
    slow = [(0.93 + 0.07 * i, "wxyz") for i in range(50)]
    sent = []
    for reply, side, tokens in ((streaming_reply, "a", fast), (other, "b", slow)):
        time = FakeTime()
        recorder = TimedRecorder(time)
        batcher = DeltaBatcher(
            message_id=reply.pk, group="g", side=side, turn=0, publisher=recorder,
            pace=Pace(chars_per_s=40, first_after_s=0.2), lead_s=1.0, clock=time.clock, sleep=time.sleep,
        )  # fmt: skip
        stream(batcher, time, tokens)
        assert "".join(frame["text"] for frame in recorder.frames) == "".join(text for _, text in tokens)
        sent.append(recorder.sent)
    assert sent[0] == sent[1]
    assert sent[0][0] == (1.2, 1)  # The first character at the lead plus the pace's delay.
    assert sent[0][-1][0] == pytest.approx(1.2 + 199 / 40, abs=0.05)


@pytest.mark.django_db
def test_the_lead_counts_from_the_later_of_the_two_workers_starts(streaming_reply: Message) -> None:
    """Both sides' first text comes at the same moment when their workers started apart: the
    lead counts from the later start, for both (this side started at 0, its partner at 0.3 s)."""
    batcher, time, _, partner = paired_batcher(streaming_reply, Pace(chars_per_s=100, first_after_s=0.2), 1.0)
    recorder = TimedRecorder(time)
    batcher.publisher = recorder
    partner.claimed_at = 0.3
    stream(batcher, time, [(0.1, "x" * 30)], partner)
    assert recorder.sent[0] == (0.3 + 1.0 + 0.2, 1)


@pytest.mark.django_db
def test_the_later_claim_and_the_first_texts_are_read_by_the_database_s_clock(streaming_reply: Message) -> None:
    """hold_state gives the later of the two sides' claims once both workers have started, and
    this side's own first text once it is recorded, as the other side reads it."""
    battle = streaming_reply.battle
    Message.objects.create(battle=battle, side="b", turn=0, role=Message.Role.USER, content="Hi")
    partner = Message.objects.create(
        battle=battle, side="b", turn=0, role=Message.Role.ASSISTANT, status=Message.Status.PENDING
    )
    services.claim_reply(streaming_reply.pk)
    assert selectors.hold_state(streaming_reply.pk, partner.pk).later_claim_s_ago is None
    services.claim_reply(partner.pk)
    ago = selectors.hold_state(streaming_reply.pk, partner.pk).later_claim_s_ago
    assert ago is not None and 0 <= ago < 5
    assert selectors.hold_state(partner.pk, streaming_reply.pk).later_claim_s_ago == pytest.approx(ago, abs=1)
    assert selectors.hold_state(streaming_reply.pk, partner.pk).own_started_s_ago is None
    services.mark_first_token(streaming_reply.pk)
    own = selectors.hold_state(streaming_reply.pk, partner.pk).own_started_s_ago
    assert own is not None and 0 <= own < 5
    assert selectors.hold_state(partner.pk, streaming_reply.pk).partner_started_s_ago == pytest.approx(own, abs=1)


@pytest.mark.django_db
def test_the_first_text_waits_until_the_other_side_has_text_too(streaming_reply: Message) -> None:
    batcher, time, recorder, partner = paired_batcher(streaming_reply, Pace(chars_per_s=100, first_after_s=0.2))
    time.now = 0.1
    batcher.add("x" * 300)  # The fast side has everything at once...
    streaming_reply.refresh_from_db()
    assert streaming_reply.first_token_at is not None  # ...and says so for the other side's worker.
    for _ in range(20):  # ...but shows nothing while the slow side has none.
        time.now += 0.05
        batcher.flush()
    assert recorder.frames == []
    assert partner.lookups <= 21  # Looked up once an interval, not on every call.
    time.now = 1.5
    partner.start_now()  # The slow side's first text: the pace of both starts here.
    batcher.drain()
    assert "".join(frame["text"] for frame in recorder.frames) == "x" * 300
    # First text 0.2 s after both had started (1.5 s), then 100 characters a second.
    assert time.now == pytest.approx(1.5 + 0.2 + 299 / 100, abs=0.1)


@pytest.mark.django_db
def test_a_side_that_started_later_counts_from_its_own_first_text(streaming_reply: Message) -> None:
    batcher, time, _, partner = paired_batcher(streaming_reply, Pace(chars_per_s=100, first_after_s=0.2))
    partner.start_now()  # The other side had text at 0.0.
    time.now = 2.0
    batcher.add("y" * 100)
    batcher.drain()
    assert batcher.origin == pytest.approx(2.0)
    assert time.now == pytest.approx(2.0 + 0.2 + 99 / 100, abs=0.1)


@pytest.mark.django_db
def test_the_later_side_counts_from_its_first_text_as_the_database_recorded_it(streaming_reply: Message) -> None:
    """The other side reads this side's first text from the database, a look-up's delay late:
    this side counts from the same recorded moment, not from its own clock, or its text would
    show that much sooner."""
    batcher, time, _, partner = paired_batcher(streaming_reply, Pace(chars_per_s=100, first_after_s=0.2))
    partner.start_now()  # The other side had text at 0.0.
    partner.own_recorded_at = 2.004  # This side's, recorded 4 ms after its model wrote it.
    time.now = 2.0
    batcher.add("y" * 100)
    time.now = 2.05
    batcher.flush()
    assert batcher.origin == pytest.approx(2.004)


@pytest.mark.django_db
def test_a_partner_that_ended_without_text_or_the_hold_limit_release_the_side(streaming_reply: Message) -> None:
    batcher, time, recorder, partner = paired_batcher(streaming_reply, Pace(chars_per_s=1000))
    batcher.add("z")
    partner.finished = True  # Failed or stopped before any text: nothing to wait for.
    batcher.drain()
    assert [frame["text"] for frame in recorder.frames] == ["z"]

    batcher, time, recorder, partner = paired_batcher(streaming_reply, Pace(chars_per_s=1000))
    Message.objects.filter(pk=streaming_reply.pk).update(content="", delta_count=0)
    batcher.add("w")
    batcher.drain()  # The other side never starts: shown after the hold limit, not never.
    assert [frame["text"] for frame in recorder.frames] == ["w"]
    assert time.now == pytest.approx(settings.ARENA_STREAM_HOLD_SECONDS, abs=0.1)


@pytest.mark.django_db
def test_the_held_text_comes_out_at_the_pace_not_in_one_burst(streaming_reply: Message) -> None:
    batcher, time, recorder, partner = paired_batcher(streaming_reply, Pace(chars_per_s=100))
    batcher.add("v" * 1000)
    time.now = 5.0
    partner.finished = True  # Ended without text after 5 s: the pace starts now, not at 0.
    batcher.flush()
    assert sum(len(frame["text"]) for frame in recorder.frames) == 1


@pytest.mark.django_db
def test_a_stop_while_holding_is_seen_at_the_next_look_up(streaming_reply: Message) -> None:
    batcher, time, recorder, partner = paired_batcher(streaming_reply, Pace(chars_per_s=100))
    batcher.add("u" * 50)
    partner.stop = True
    time.now = 0.1
    batcher.flush()
    assert batcher.stop_requested and recorder.frames == []


def test_the_model_speed_of_a_reply_is_measured_before_pacing() -> None:
    time = FakeTime()
    batcher = DeltaBatcher(
        message_id=0, group="g", side="a", turn=0, publisher=Recorder(), pace=Pace(chars_per_s=10),
        clock=time.clock, sleep=time.sleep,
    )  # fmt: skip
    batcher.flush = lambda now=None: None  # type: ignore[method-assign]  # No database here.
    time.now = 1.0
    batcher.add("a" * 10)
    time.now = 3.0
    batcher.add("b" * 200)
    time.now = 9.0
    batcher.add("")  # The model's stop tokens after its last text show nothing: not counted.
    # 200 characters in 2 s, to the last text: not the pace's 10, nor 200 in 8 s to the model's end.
    assert batcher.model_chars_per_s() == pytest.approx(100.0)
    fast = DeltaBatcher(message_id=0, group="g", side="a", turn=0, publisher=Recorder(), clock=time.clock)
    fast.flush = lambda now=None: None  # type: ignore[method-assign]
    fast.add("c")
    time.now += 0.05
    fast.add("d" * 100)
    assert fast.model_chars_per_s() == pytest.approx(500.0)  # Under 0.2 s: a lower bound.
    short = DeltaBatcher(message_id=0, group="g", side="a", turn=0, publisher=Recorder(), clock=time.clock)
    short.flush = lambda now=None: None  # type: ignore[method-assign]
    short.add("ok")
    time.now += 1
    assert short.model_chars_per_s() is None  # Too little text to tell.


@pytest.mark.django_db(transaction=True)
async def test_two_models_of_very_different_speed_look_alike_to_the_voter(
    embedded_mode: None, connect_battle: Any, smollm2_preset: Any
) -> None:
    """A tiny random-weight model (thousands of tokens a second) against SmolLM2 (tens), served
    by the in-process worker: a first battle measures them, a second is paced at the slower
    one. As the voter's socket sees it, each side's first text and its characters per second
    differ by less than 10%."""
    from channels.db import database_sync_to_async

    from inference.models import LLM
    from tests.conftest import PRESETS_DIR

    # Sampling (anonymous battles draw no greedy model), at a temperature low enough that the
    # two battles' replies are alike: the second is paced at what the first measured.
    near_greedy = {"max_new_tokens": 48, "temperature": 0.05, "top_p": 1.0}
    await database_sync_to_async(LLM.objects.create)(
        name="fast", family="gemma", preset=str(PRESETS_DIR / "tiny-gemma"), context_tokens=2048, **near_greedy
    )
    await database_sync_to_async(LLM.objects.create)(
        name="slow", family="chatml", preset=str(smollm2_preset), context_tokens=2048, **near_greedy
    )
    for _battle in ("measuring", "measured"):
        client = await connect_battle()
        sent = time_module.monotonic()
        await client.send({"type": "prompt", "text": "Tell me about the sea, in a few sentences."})
        arrivals: dict[str, list[tuple[float, int]]] = {"a": [], "b": []}
        ended: set[str] = set()
        while ended != {"a", "b"}:
            frame = await client.receive()
            if frame["type"] == "delta":
                arrivals[frame["side"]].append((time_module.monotonic() - sent, len(frame["text"])))
            elif frame["type"] == "end":
                assert frame["status"] == "done", frame
                ended.add(frame["side"])
        await client.communicator.disconnect()
    first_text = {side: times[0][0] for side, times in arrivals.items()}
    speed = {
        side: sum(chars for _, chars in times[1:]) / (times[-1][0] - times[0][0]) for side, times in arrivals.items()
    }
    assert abs(first_text["a"] - first_text["b"]) < 0.1 * max(first_text.values()), first_text
    assert abs(speed["a"] - speed["b"]) < 0.1 * max(speed.values()), speed
