"""Generating one battle reply: load its conversation, stream it from the model (wherever the roster
says it is served: ``inference.services.ModelReply``), persist, publish.

Run by the ``votes.generate_reply`` Celery task (``votes.tasks``) on the queue of the reply's model,
or by a thread of the web process in the embedded mode (``votes.dispatch``). Keras and JAX are
imported only when a model hosted in this process first generates.
"""

import logging
import math
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import DatabaseError, connections

from inference.services import ModelReply
from votes import metrics, shutdown
from votes import selectors as votes_selectors
from votes import services as votes_services
from votes.models import Message
from votes.pacing import Pace
from votes.protocol import delta_frame, end_frame
from votes.publisher import FramePublisher

logger = logging.getLogger(__name__)

# One message whichever side the conversation outgrew: the voter must not learn which (see
# _both_sides_fit).
TOO_LONG = "The conversation is too long for these models; start a new battle."
NOT_GENERATED = "This reply could not be generated."
TIMED_OUT = "This reply took too long and was stopped."
# The cause each message is counted under (votes.metrics: arena_replies_failed_total).
FAILURE_CAUSES = {TOO_LONG: metrics.TOO_LONG, NOT_GENERATED: metrics.GENERATION_ERROR, TIMED_OUT: metrics.TIMED_OUT}


# A call this close to a tick (a fraction of an interval; a clock's rounding, a timer's lateness)
# counts as at it.
_TICK_SLACK = 0.02


class DeltaBatcher:
    """Collects text deltas and flushes them as one numbered frame per interval, at the pace.

    Each flush first persists the text shown so far, then publishes it: a client that
    reconnects and reads the database never misses a delta that was published before it
    subscribed, and never sees text the pace has not shown yet. The persist step also tells
    whether the voter has asked to stop the reply (`stop_requested`).

    The pace (votes.pacing) is the battle's, the same for both sides. On a turn sent to
    both sides (``hold``: what the other side's reply is doing), the reply's pace starts when
    both models have their first text, so that neither side's text appears sooner: the first
    text is recorded (``mark_first_token``), and the other side's looked up once an interval
    until it has one (the pace then counts from the later of the two), has finished without
    one, or ``ARENA_STREAM_HOLD_SECONDS`` have passed (the pace then counts from now: held text
    never comes out in one burst). A stop asked for while holding is seen at the next look-up.
    In an anonymous battle the pace never starts sooner than ``lead_s`` after the batcher's start
    (the worker's start on the reply): the arena's typical wait for a first token, so that the
    first text of a fast pair comes as late as a slow pair's. The two sides' first text must come
    out at the same instant, so beside a partner the lead counts from the later of the two
    workers' starts (``HoldState.later_claim_s_ago``, the same instant for both sides), not from
    each side's own (a model whose worker starts later, by its queue or its host, would show its
    text later). With a pace, text goes out only at ticks of one interval counted from the first
    text's due time, the same ticks on both sides, whatever its model's cadence: the caller wakes
    for each tick (``next_tick_s``, its ``deltas`` tick) as well as for each delta, and a tick
    shows what the pace allows at that tick. Flushed at its model's next token or at a tick of
    its own, Gemma 3's side showed its first text about 20 ms after the other side's in four
    battles of five, and its longest pause was longer in seven of ten (docs/security.md).
    """

    def __init__(
        self,
        *,
        message_id: int,
        group: str,
        side: str,
        turn: int,
        publisher: FramePublisher,
        pace: Pace | None = None,
        hold: Callable[[], votes_selectors.HoldState] | None = None,
        lead_s: float = 0.0,
        max_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.message_id = message_id
        self.group = group
        self.side = side
        self.turn = turn
        self.publisher = publisher
        self.interval = settings.ARENA_DELTA_FLUSH_SECONDS
        self.pace = pace or Pace(settings.ARENA_STREAM_CHARS_PER_S, settings.ARENA_STREAM_FIRST_TEXT_SECONDS)
        self.hold = hold
        self.clock = clock
        self.sleep = sleep
        self.started = clock()
        self.lead_s = lead_s
        # The pace never starts sooner than this (the arena's wait for a first token).
        self.earliest_origin = self.started + lead_s
        # When the pace starts counting: the reply's start, or, beside a partner, once known.
        self.origin: float | None = None if hold is not None else self.earliest_origin
        self.first_text_at: float | None = None  # clock() of the model's first text
        self.first_text_chars = 0
        self.last_text_at: float | None = None  # clock() of the model's latest text
        self.last_partner_check = -math.inf
        self.text = ""
        self.shown = 0  # Characters published (and persisted).
        self.seq = 0
        self.last_flush = 0.0
        self.last_tick = -1  # The pace's last tick flushed (``_tick``).
        self.stop_requested = False
        # The reply's cap in seconds, from when its text starts to show: past it, it stops where
        # the voter is, as a Stop would, but ends as done and cut (``capped``).
        self.max_seconds = max_seconds
        self.capped = False

    def add(self, delta: str) -> None:
        # PostgreSQL text cannot hold NUL, which a model may well produce: shown as U+FFFD.
        self.text += delta.replace("\x00", "\ufffd")
        now = self.clock()
        if delta:
            self.last_text_at = now
        if self.first_text_at is None and self.text:
            self.first_text_at, self.first_text_chars = now, len(self.text)
            if self.hold is not None:
                votes_services.mark_first_token(self.message_id)
        # With a pace, flush decides by its ticks; without, the first text goes out at once and
        # later text in batches.
        if self.pace.chars_per_s > 0 or self.seq == 0 or now - self.last_flush >= self.interval:
            self.flush(now)

    def _start(self) -> float:
        """When the first text is due (the origin being known)."""
        assert self.origin is not None
        return self.origin + self.pace.first_after_s

    def next_tick_s(self) -> float:
        """Seconds until the caller should flush again if no text comes meanwhile: the pace's next
        tick, or the first text's due time, at most one interval away (the partner's first text
        and the voter's Stop are looked for at flushes)."""
        if self.origin is None:
            return self.interval
        now = self.clock()
        start = self._start()
        if self.pace.chars_per_s > 0:
            return min(self.interval, max(0.0, self._next_tick_at(now) - now))
        return min(self.interval, start - now) if self.seq == 0 and start > now else self.interval

    def _next_tick_at(self, moment: float) -> float:
        """With a pace, the time of its first tick at or after ``moment`` not flushed yet."""
        start = self._start()
        tick = max(self.last_tick + 1, math.ceil((moment - start) / self.interval - _TICK_SLACK))
        return start + tick * self.interval

    def _tick(self, now: float) -> float | None:
        """With a pace, the time of the latest tick at or before ``now`` not flushed yet (None:
        none, the caller comes back at the next); without one, ``now``."""
        if self.pace.chars_per_s <= 0:
            return now
        start = self._start()
        tick = math.floor((now - start) / self.interval + _TICK_SLACK)
        if tick < 0 or tick <= self.last_tick:
            return None
        self.last_tick = tick
        return start + tick * self.interval

    def _find_origin(self, now: float) -> None:
        """Beside a partner: start the pace once both sides have text (or the partner ended
        without any, or the hold limit passed). Looked up at most once an interval."""
        if self.origin is not None or self.first_text_at is None or self.hold is None:
            return
        if now - self.last_partner_check < self.interval:
            return
        self.last_partner_check = now
        state = self.hold()
        if self.lead_s > 0 and state.later_claim_s_ago is not None:
            self.earliest_origin = now - state.later_claim_s_ago + self.lead_s
        if state.stop_requested:
            self.stop_requested = True
        elif state.partner_started_s_ago is not None:
            # Both sides' first texts by the database's clock, as the other side reads them too:
            # counting from its own clock, the side whose text came later would start before the
            # other side, which reads that moment from the database a look-up's delay late.
            own = self.first_text_at if state.own_started_s_ago is None else now - state.own_started_s_ago
            self.origin = max(own, now - state.partner_started_s_ago, self.earliest_origin)
        elif state.partner_finished or now - self.first_text_at >= settings.ARENA_STREAM_HOLD_SECONDS:
            self.origin = max(now, self.earliest_origin)

    def flush(self, now: float | None = None) -> None:
        """Persist, then publish, the text the pace lets the voter see by now. Once the server is
        stopping (votes.shutdown) the reply stops here, as for the voter's Stop."""
        if shutdown.stopping():
            self.stop_requested = True
        if self.stop_requested:
            return
        now = self.clock() if now is None else now
        self._find_origin(now)
        if self.origin is None:
            return
        if self.max_seconds is not None and now - self.origin >= self.max_seconds:
            self.capped = self.stop_requested = True
            return
        at = self._tick(now)
        if at is None:
            return
        visible = self.pace.visible(at - self.origin, len(self.text))
        if visible <= self.shown:
            return
        frame = delta_frame(self.side, self.turn, self.seq, self.text[self.shown : visible])
        shown_text = self.text[:visible]
        if not votes_services.save_partial_reply(self.message_id, content=shown_text, delta_count=self.seq + 1):
            self.stop_requested = True
            return
        self.seq += 1
        self.publisher.publish(self.group, [frame])
        self.shown = visible
        self.last_flush = now

    def drain(self) -> None:
        """Once the model is done: show the rest at the pace (at once without one), unless the
        voter stops the reply meanwhile."""
        while self.shown < len(self.text) and not self.stop_requested:
            if self.origin is None:  # Waiting for the partner's first text.
                self.sleep(self.interval)
                self.flush()
                continue
            now = self.clock()
            wait = self.pace.wait_s(now - self.origin, self.shown)
            if self.pace.chars_per_s > 0:  # Until the first tick at which more text shows.
                wait = self._next_tick_at(now + wait) - now
            elif wait > 0 and self.seq > 0:  # Without a pace: the first text when due, then in batches.
                wait = max(wait, self.interval)
            if wait > 0:
                self.sleep(wait)
            self.flush()

    def model_chars_per_s(self) -> float | None:
        """The model's own speed on this reply: characters after its first text, per second from
        it to its last text (None when too little was written to tell). To the last text, not to
        the model's end: what the pace must keep up with is text appearing, and the tokens a
        model spends after its last text (a stop sequence held back, a turn marker) show nothing.
        Counted in, they would make short replies look slow and pull the pace down."""
        if self.first_text_at is None or self.last_text_at is None:
            return None
        chars = len(self.text) - self.first_text_chars
        # Under 0.2 s the clock says little: a lower bound then (a fast model stays fast).
        return chars / max(self.last_text_at - self.first_text_at, 0.2) if chars >= 20 else None

    @property
    def published_text(self) -> str:
        """What the voter has seen: text not shown yet when a stop arrived is dropped."""
        return self.text[: self.shown]


class Heartbeat:
    """Touches the reply's heartbeat from a thread while it is generated (model loading too), so
    that a reply whose worker died is told apart from a slow one (fail_stalled_replies)."""

    def __init__(self, message_id: int, interval_s: float) -> None:
        self.message_id = message_id
        self.interval_s = interval_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"heartbeat-{message_id}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join()

    def _run(self) -> None:
        try:
            while not self.stopped.wait(self.interval_s):
                try:
                    votes_services.touch_reply(self.message_id)
                except DatabaseError:  # The database is away: the next beat tries again.
                    logger.warning("Heartbeat of reply %s could not be saved", self.message_id)
                    connections["default"].close_if_unusable_or_obsolete()
        finally:
            connections.close_all()  # This thread's own connection.


def run_generation(message_id: int, publisher: FramePublisher, attempt: int | None = None) -> None:
    """Generate one reply. Never raises: an error the generation could not end the reply
    through itself (a failed database write, say) fails the reply at once, with a message and
    Retry for the voter, rather than leaving it to the stall or queue limit."""
    if shutdown.stopping():  # Left pending: votes.shutdown ends it as stopped.
        return
    try:
        context = votes_selectors.generation_context(message_id)
        previous_status = votes_services.claim_reply(message_id, attempt) if context else None
        if context is None or previous_status is None:
            logger.info("Reply %s is gone, finished or stopped; nothing to generate", message_id)
            return

        with Heartbeat(message_id, settings.ARENA_REPLY_HEARTBEAT_SECONDS):
            _generate(context, previous_status, publisher)
    except Exception:
        logger.exception("Reply %s failed outside the model's generation", message_id)
        _fail_at_once(message_id, publisher, attempt)


def _fail_at_once(message_id: int, publisher: FramePublisher, attempt: int | None) -> None:
    try:
        failed = votes_services.fail_reply(message_id, votes_services.WORKER_ERROR, attempt)
        if failed is not None:
            publisher.publish(votes_selectors.battle_group(failed.battle_public_id), [failed.end_frame()])
    except Exception:  # The database is unreachable: fail_stalled_replies ends it later.
        logger.exception("Reply %s could not be failed; the stall check will", message_id)


FIT_VERDICT_SECONDS = 3600


def _fit_verdict_key(message_id: int) -> str:
    return f"reply-fits:{message_id}"


def _both_sides_fit(
    context: votes_selectors.GenerationContext,
    fits: bool,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Whether this reply's conversation fits its model's context and, on a turn sent to both
    sides, the other side's fits its model's: the two models' templates and tokenizers differ,
    so one prompt can outgrow one model only, and a refusal on that side alone would tell the
    voter which model it is. Each side records its own verdict, then waits for the other's
    (until the other side ends, the voter stops this reply, or ARENA_STREAM_HOLD_SECONDS pass),
    before either model sees the prompt: both are refused, with the same message, at the same
    moment (within one look-up interval), or neither is."""
    cache.set(_fit_verdict_key(context.message_id), fits, timeout=FIT_VERDICT_SECONDS)
    partner_id = context.partner_reply_id
    if partner_id is None:
        return fits
    deadline = clock() + settings.ARENA_STREAM_HOLD_SECONDS
    while True:
        partner_fits = cache.get(_fit_verdict_key(partner_id))
        if partner_fits is not None:
            return fits and partner_fits
        state = votes_selectors.hold_state(context.message_id, partner_id)
        if state.stop_requested or state.partner_finished or clock() >= deadline:
            return fits
        sleep(settings.ARENA_DELTA_FLUSH_SECONDS)


def _generate(context: votes_selectors.GenerationContext, previous_status: str, publisher: FramePublisher) -> None:
    message_id = context.message_id
    group = votes_selectors.battle_group(context.battle_public_id)
    if previous_status == Message.Status.STREAMING:
        # Redelivered after a worker was lost: the reply starts over from nothing.
        publisher.publish(group, [{"type": "restart", "side": context.side, "turn": context.turn}])
    pace = Pace(
        settings.ARENA_STREAM_CHARS_PER_S if context.pace_chars_per_s is None else context.pace_chars_per_s,
        settings.ARENA_STREAM_FIRST_TEXT_SECONDS,
    )
    partner_id = context.partner_reply_id
    batcher = DeltaBatcher(
        message_id=message_id,
        group=group,
        side=context.side,
        turn=context.turn,
        publisher=publisher,
        pace=pace,
        hold=None if partner_id is None else lambda: votes_selectors.hold_state(message_id, partner_id),
        lead_s=context.first_text_lead_s,
        max_seconds=context.max_reply_seconds,
    )
    generated_at: float | None = None
    model = context.model
    started = time.monotonic()
    failure = NOT_GENERATED
    reply: ModelReply | None = None
    watchdog = None
    timed_out = threading.Event()
    try:
        reply = ModelReply(model, context.system_prompt, context.conversation, seed=context.seed)
        if not reply.fits:  # Past the arena's own limit only where a model's context is shorter than it.
            logger.warning(
                "Reply %s: %s needs %d tokens of its %d-token context (ARENA_MAX_CONVERSATION_BYTES is %d)",
                message_id,
                model.name,
                reply.tokens_needed,
                reply.context_length,
                settings.ARENA_MAX_CONVERSATION_BYTES,
            )
        if not _both_sides_fit(context, reply.fits):
            failure = TOO_LONG
            raise ValueError(f"reply {message_id}: the conversation does not fit both models' contexts")
        reply.start()
        started_reply = reply

        def time_out() -> None:
            timed_out.set()
            started_reply.cancel()

        watchdog = threading.Timer(settings.ARENA_GENERATION_TIMEOUT_SECONDS, time_out)
        watchdog.daemon = True
        watchdog.start()
        for delta in reply.deltas(tick=batcher.next_tick_s):
            if delta:
                batcher.add(delta)
            else:  # No text for an interval: show what the pace allows by now.
                batcher.flush()
            if batcher.stop_requested:
                reply.cancel()
                reply.wait()  # Until the model's server has freed the reply's slot.
                break
        generated_at = time.monotonic()
        batcher.drain()
        if timed_out.is_set():
            failure = TIMED_OUT
            raise TimeoutError(f"reply {message_id} ran past {settings.ARENA_GENERATION_TIMEOUT_SECONDS} s")
    except Exception:
        if reply is not None:
            reply.cancel()
        if shutdown.stopping():  # Its model was shut down under it: stopped, not failed.
            _finish(context, batcher, publisher, status=Message.Status.STOPPED, stop_reason="shutdown", started=started)
            return
        # The voter sees that this side failed, never why in model terms (anonymity).
        logger.exception("Generation of reply %s failed", message_id)
        _finish(
            context,
            batcher,
            publisher,
            status=Message.Status.FAILED,
            stop_reason="error",
            started=started,
            error=failure,
        )
        return
    finally:
        if watchdog is not None:
            watchdog.cancel()

    stats = reply.stats
    # The model's own speed, before pacing: a cut reply's too (the pace's seconds ran out, not
    # the model's; its long replies are the ones the cap cuts).
    model_chars_per_s = None if generated_at is None else batcher.model_chars_per_s()
    if batcher.capped:  # Its seconds ran out: done, with what the voter saw, and said to be cut.
        _finish(
            context,
            batcher,
            publisher,
            status=Message.Status.DONE,
            stop_reason="time",
            started=started,
            tokens=stats.tokens,
            ttft_s=stats.ttft_s,
            generation_s=stats.duration_s,
            model_chars_per_s=model_chars_per_s,
        )
        return
    if batcher.stop_requested:
        _finish(
            context,
            batcher,
            publisher,
            status=Message.Status.STOPPED,
            stop_reason="shutdown" if shutdown.stopping() else "cancelled",
            started=started,
            tokens=stats.tokens,
            ttft_s=stats.ttft_s,
            generation_s=stats.duration_s,
        )
        return
    _finish(
        context,
        batcher,
        publisher,
        status=Message.Status.DONE,
        stop_reason=reply.stop_reason or "stop",
        started=started,
        tokens=stats.tokens,
        ttft_s=stats.ttft_s,
        generation_s=stats.duration_s,
        model_chars_per_s=model_chars_per_s,
    )


def _finish(
    context: votes_selectors.GenerationContext,
    batcher: DeltaBatcher,
    publisher: FramePublisher,
    *,
    status: str,
    stop_reason: str,
    started: float,
    tokens: int = 0,
    ttft_s: float | None = None,
    generation_s: float | None = None,
    error: str | None = None,
    model_chars_per_s: float | None = None,
) -> None:
    """Save the reply's final state, then announce it: the end frame never precedes the save."""
    text = batcher.published_text if status == Message.Status.STOPPED or batcher.capped else batcher.text
    ttft_ms = int(ttft_s * 1000) if ttft_s is not None else None
    duration_ms = int((time.monotonic() - started) * 1000)
    saved = votes_services.finish_reply(
        context.message_id,
        status=status,
        content=text,
        delta_count=batcher.seq,
        stop_reason=stop_reason,
        token_count=tokens,
        time_to_first_token_ms=ttft_ms,
        duration_ms=duration_ms,
        generation_ms=None if generation_s is None else int(generation_s * 1000),
        error=error or "",
        model_chars_per_s=model_chars_per_s,
    )
    if not saved:
        logger.warning("Reply %s was failed as stalled before it finished; its end is dropped", context.message_id)
        return
    metrics.record_reply(context.model.name, status)
    if status == Message.Status.FAILED:
        metrics.record_failure(FAILURE_CAUSES.get(error or "", metrics.GENERATION_ERROR))
    frame = end_frame(
        context.side,
        context.turn,
        seq=batcher.seq,
        status=status,
        text=text,
        # A battle is never ended while one of its replies is generated: the stats (speed and
        # token counts tell the models apart) wait for the reveal's state.
        stats={},
        error=error,
        cut=status == Message.Status.DONE and stop_reason in Message.CUT_REASONS,
    )
    publisher.publish(batcher.group, [frame])
