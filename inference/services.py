"""Generating one reply: load the conversation, stream from the model, persist, publish.

Keras and JAX are imported inside run_generation only, so that importing this module (the web
tier does, through Celery's task discovery) stays cheap.
"""

import logging
import time
from pathlib import Path

from django.conf import settings

from inference.publisher import FramePublisher
from votes import selectors as votes_selectors
from votes import services as votes_services
from votes.protocol import delta_frame, end_frame

logger = logging.getLogger(__name__)


def resolve_preset(preset: str) -> str:
    """A relative preset path is taken from the project root; anything else is a hub handle."""
    path = Path(preset)
    if not path.is_absolute() and (settings.BASE_DIR / path).is_dir():
        return str(settings.BASE_DIR / path)
    return preset


class DeltaBatcher:
    """Collects text deltas and flushes them as one numbered frame per interval.

    Each flush first persists the text so far, then publishes: a client that reconnects and
    reads the database never misses a delta that was published before it subscribed.
    """

    def __init__(self, *, message_id: int, group: str, side: str, turn: int, publisher: FramePublisher) -> None:
        self.message_id = message_id
        self.group = group
        self.side = side
        self.turn = turn
        self.publisher = publisher
        self.interval = settings.ARENA_DELTA_FLUSH_SECONDS
        self.text = ""
        self.pending = ""
        self.seq = 0
        self.last_flush = 0.0

    def add(self, delta: str) -> None:
        self.text += delta
        self.pending += delta
        # The first delta goes out at once (time to first token); later ones in batches.
        if self.seq == 0 or time.monotonic() - self.last_flush >= self.interval:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        frame = delta_frame(self.side, self.turn, self.seq, self.pending)
        self.seq += 1
        votes_services.save_partial_reply(self.message_id, content=self.text, delta_count=self.seq)
        self.publisher.publish(self.group, [frame])
        self.pending = ""
        self.last_flush = time.monotonic()


def run_generation(message_id: int, publisher: FramePublisher) -> None:
    context = votes_selectors.generation_context(message_id)
    if context is None or context.finished or not votes_services.mark_reply_streaming(message_id):
        logger.info("Reply %s is gone or already finished; nothing to generate", message_id)
        return

    from inference import chat_templates, streaming

    group = votes_selectors.battle_group(context.battle_public_id)
    batcher = DeltaBatcher(
        message_id=message_id, group=group, side=context.side, turn=context.turn, publisher=publisher
    )
    started = time.monotonic()
    failure = "This reply could not be generated."
    try:
        lm = streaming.load_causal_lm(resolve_preset(context.preset))
        turns = [chat_templates.ChatTurn(role=role, content=content) for role, content in context.conversation]
        prompt = chat_templates.render_prompt(context.family, None, turns)
        try:
            generation = streaming.StreamingGeneration(
                lm,
                prompt,
                max_new_tokens=min(context.max_new_tokens, settings.ARENA_MAX_NEW_TOKENS),
                stop_strings=chat_templates.stop_strings(context.family),
            )
        except ValueError:
            # The prompt is validated as non-empty upstream: what is left is a context overflow.
            failure = "The conversation is too long for this model; start a new battle."
            raise
        for delta in generation:
            batcher.add(delta)
        batcher.flush()
    except Exception:
        # The voter sees that this side failed, never why in model terms (anonymity).
        logger.exception("Generation of reply %s failed", message_id)
        duration_ms = int((time.monotonic() - started) * 1000)
        votes_services.fail_reply(message_id, content=batcher.text, delta_count=batcher.seq, duration_ms=duration_ms)
        end = end_frame(
            context.side, context.turn, seq=batcher.seq, status="failed", text=batcher.text, error=failure
        )
        publisher.publish(group, [end])
        return

    stats = generation.stats
    ttft_ms = int(stats.ttft_s * 1000) if stats.ttft_s is not None else None
    duration_ms = int(stats.duration_s * 1000)
    votes_services.complete_reply(
        message_id,
        content=batcher.text,
        delta_count=batcher.seq,
        token_count=stats.tokens,
        time_to_first_token_ms=ttft_ms,
        duration_ms=duration_ms,
    )
    publisher.publish(
        group,
        [
            end_frame(
                context.side,
                context.turn,
                seq=batcher.seq,
                status="done",
                text=batcher.text,
                stats=votes_selectors.reply_stats(tokens=stats.tokens, ttft_ms=ttft_ms, duration_ms=duration_ms),
            )
        ],
    )
