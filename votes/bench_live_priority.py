"""What an evaluation run costs a live reply (``manage.py bench_live_priority``).

In one process, on warm engines, the same live replies (a battle's: the roster's sampling, fixed
seeds, so the same texts every time) are timed three ways:

1. alone;
2. while an evaluation run of the task runs on its background lane (as the arena runs one);
3. while the same evaluation's replies are sent as live ones (no lane): what the lane saves.

Each evaluation is a real run (``evaluation_services``), started before the timed replies and
cancelled after them; the runs are deleted at the end. The command evaluates the other models by
default: an evaluation reply in the live reply's own engine rides in its decode batch at no cost
(a decode step computes every slot), one in another engine competes for the same cores. A
reply's speed is its tokens after the first over the seconds after its first token; the report
gives each way's median and the ratios to the replies alone (the target: an evaluation slows a
live reply by at most 20%).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.db import connections

from inference import services as inference_services
from inference.models import LLM
from votes import evaluation_services
from votes.models import EvaluationRun, Task

WAYS = ("alone", "evaluation, background lane", "evaluation, no lane")


@dataclass(frozen=True)
class Timed:
    model: str
    tokens: int
    first_token_s: float
    tokens_per_s: float  # After the first token.


@dataclass
class Report:
    replies: dict[str, list[Timed]] = field(default_factory=dict)
    evaluation_steps: dict[str, int] = field(default_factory=dict)  # Steps the run did meanwhile.

    def median_speed(self, way: str) -> float:
        return statistics.median(reply.tokens_per_s for reply in self.replies[way])

    def median_first_token(self, way: str) -> float:
        return statistics.median(reply.first_token_s for reply in self.replies[way])

    def ratio(self, way: str) -> float:
        """The way's median speed over the replies' alone."""
        return self.median_speed(way) / self.median_speed(WAYS[0])


def live_reply(model: LLM, task: Task, seed: int) -> Timed:
    """One live reply to the task's first prompt, as a battle sends it (foreground)."""
    prompt = task.turns.order_by("position").values_list("prompt", flat=True).first() or task.title
    conversation = [*task.context_conversation(), ("user", prompt)]
    reply = inference_services.ModelReply(model, task.system_prompt, conversation, seed=seed)
    began = time.perf_counter()
    reply.start()
    first: float | None = None
    for delta in reply.deltas(tick=None):
        if delta and first is None:
            first = time.perf_counter()
    ended = time.perf_counter()
    stats = reply.stats
    first = first if first is not None else ended
    after_first = max(stats.tokens - 1, 0)
    return Timed(model.name, stats.tokens, first - began, after_first / max(ended - first, 1e-9))


class _Evaluation:
    """A real evaluation run on a thread of this process, until cancelled."""

    def __init__(self, task: Task, models: Sequence[LLM], *, lane: bool) -> None:
        counts = {"attempts": 20, "max_tries": 3, "fix_attempts": 3, "decoys": 3, "feedback_mistakes": 2}
        self.run = evaluation_services.create_evaluation(task=task, llms=models, **counts)
        generate = None if lane else _foreground_generate
        self.thread = threading.Thread(target=self._work, args=(generate,), name="bench-evaluation", daemon=True)
        self.error: BaseException | None = None

    def _work(self, generate: evaluation_services.Generate | None) -> None:
        try:
            evaluation_services.run_evaluation(self.run.pk, generate=generate)
        except BaseException as error:  # Reported by stop().
            self.error = error
        finally:
            connections.close_all()

    def start(self, timeout_s: float) -> None:
        """Start it and wait for its first step: it is running when the timed replies start."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while self.steps() == 0:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"The evaluation did no step within {timeout_s} s: {self.error!r}")
            time.sleep(0.1)

    def steps(self) -> int:
        return EvaluationRun.objects.values_list("progress", flat=True).get(pk=self.run.pk)

    def stop(self) -> int:
        """Cancel it and wait for its thread; the steps it did. Deletes the run."""
        steps = self.steps()
        still_running = evaluation_services.cancel_evaluation(self.run)
        self.thread.join(timeout=600)
        EvaluationRun.objects.filter(pk=self.run.pk).delete()
        if not still_running:
            raise RuntimeError(f"The evaluation ended before the timed replies did: {self.error!r}")
        return steps


def _foreground_generate(model: LLM, system: str | None, conversation: list[tuple[str, str]], seed: int) -> str:
    """An evaluation reply sent as a live one: what the arena did without a background lane."""
    return inference_services.generate_text(model, system, conversation, seed, background=False)


def measure(
    task: Task,
    live: Sequence[LLM],
    evaluated: Sequence[LLM],
    *,
    replies: int,
    warm_up: bool = True,
    on_progress: Callable[[str], None] = lambda line: None,
) -> Report:
    """Time ``replies`` live replies of each of ``live`` each way (see the module), after
    compiling every shape of every model (``warm_up``; a smoke run may skip it, and its timed
    replies then compile)."""
    models = {model.pk: model for model in (*live, *evaluated)}.values()
    for model in models:  # Every shape compiled first, as the arena warms: no timed reply compiles.
        if warm_up:
            on_progress(f"warming {model.name}")
            inference_services.warm_up(model)
    for model in models:
        live_reply(model, task, seed=0)
    report = Report()
    for way in WAYS:
        evaluation = None if way == WAYS[0] else _Evaluation(task, evaluated, lane=way == WAYS[1])
        if evaluation is not None:
            on_progress(f"{way}: starting an evaluation run of {len(evaluated)} model(s)")
            evaluation.start(timeout_s=600)
        timed: list[Timed] = []
        for index in range(replies):
            for model in live:
                timed.append(live_reply(model, task, seed=1 + index))
                reply = timed[-1]
                on_progress(
                    f"{way}: {reply.model}, {reply.tokens} tokens, first after {reply.first_token_s:.2f} s, "
                    f"then {reply.tokens_per_s:.1f} tokens/s"
                )
        report.replies[way] = timed
        if evaluation is not None:
            report.evaluation_steps[way] = evaluation.stop()
    return report
