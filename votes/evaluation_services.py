"""Writes for evaluation runs: creating one, running it (in a worker), storing its replies."""

import logging
from collections.abc import Callable, Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from arena_site.celery import app as celery_app
from inference.models import LLM
from votes import dispatch, evaluation, shutdown
from votes.checkers import CheckResult
from votes.models import EvaluationReply, EvaluationRun, Task, TaskTurn

logger = logging.getLogger(__name__)

RUN_EVALUATION_TASK = "votes.run_evaluation"


def start_evaluation(*, task: Task, llms: Sequence[LLM], **counts: int) -> EvaluationRun:
    """Create a pending run (``counts``: create_evaluation's attempts, max_tries, ...) and hand it
    to a worker (Celery, or a thread in this process)."""
    run = create_evaluation(task=task, llms=llms, **counts)
    transaction.on_commit(lambda: enqueue_evaluation(run.pk))
    return run


def enqueue_evaluation(run_id: int) -> None:
    """An evaluation run goes to the evaluation queue (a host serving every model it names
    consumes it), or to a background thread of this process in embedded mode."""
    if settings.GENERATION_BACKEND == "celery":
        celery_app.send_task(RUN_EVALUATION_TASK, args=[run_id], queue=settings.ARENA_EVALUATION_QUEUE)
        return
    dispatch.run_in_background(lambda: run_evaluation(run_id), f"evaluation {run_id}")


def create_evaluation(
    *,
    task: Task,
    llms: Sequence[LLM],
    attempts: int = 5,
    max_tries: int = 3,
    fix_attempts: int = 3,
    decoys: int = 3,
    feedback_mistakes: int = 2,
) -> EvaluationRun:
    if not llms:
        raise ValueError("An evaluation needs at least one model.")
    if attempts < 1 or min(max_tries, fix_attempts, decoys, feedback_mistakes) < 0:
        raise ValueError(
            "attempts must be at least 1; max_tries, fix_attempts, decoys and feedback_mistakes at least 0."
        )
    turns = task.turns.count()
    if turns == 0:
        raise ValueError(f"Task {task.slug!r} has no scripted turns.")
    unchecked = list(task.turns.filter(checker=TaskTurn.Checker.NONE).values_list("position", flat=True))
    if unchecked:
        numbers = ", ".join(str(position + 1) for position in unchecked)
        raise ValueError(f"Task {task.slug!r} can't be evaluated automatically: turn(s) {numbers} have no check.")
    run = EvaluationRun.objects.create(
        task=task,
        attempts=attempts,
        max_tries=max_tries,
        fix_attempts=fix_attempts,
        decoys=decoys,
        feedback_mistakes=feedback_mistakes,
        total=len(llms) * (attempts + turns + fix_attempts + decoys + feedback_mistakes),
    )
    run.llms.set(llms)
    return run


class Cancelled(Exception):
    """The run was cancelled (admin or its page) while it ran."""


Generate = Callable[[LLM, str | None, list[tuple[str, str]], int], str]


def generate_with_models(
    model: LLM,
    system_prompt: str | None,
    conversation: list[tuple[str, str]],
    seed: int,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """One greedy reply of ``model``, from whatever serves it (``inference.services.generate_text``),
    in the background lane: on the arena's own engines it yields to live replies. Raises
    ``Cancelled`` once ``should_stop()`` says so (asked every second while the reply runs)."""
    from inference import services

    try:
        return services.generate_text(model, system_prompt, conversation, seed, should_stop=should_stop)
    except services.ContextOverflow as error:
        raise evaluation.ContextOverflow(str(error)) from error
    except services.GenerationStopped as error:
        raise Cancelled(str(error)) from error


def run_evaluation(
    run_id: int,
    generate: Generate | None = None,
    on_step: Callable[[], None] | None = None,
) -> EvaluationRun:
    """Run a pending evaluation to the end and store every rated reply.

    ``generate`` defaults to the models themselves (``generate_with_models``, in the background
    lane, stopping its reply when the run is cancelled or the server stops). A run cancelled
    meanwhile (``cancel_evaluation``) stops within a second of a reply or at its next step, and
    keeps nothing of what it did.
    """
    with transaction.atomic():
        run = EvaluationRun.objects.select_for_update().select_related("task").get(pk=run_id)
        if run.status != EvaluationRun.Status.PENDING:
            return run  # Already run (a redelivered job), or cancelled while it waited.
        run.status = EvaluationRun.Status.RUNNING
        run.started = timezone.now()
        run.save(update_fields=["status", "started"])
    llms = {llm.name: llm for llm in run.llms.order_by("name")}
    task_turns = list(run.task.turns.order_by("position"))
    turns = [evaluation.ScriptedTurn(prompt=turn.prompt, check=_checker_of(turn)) for turn in task_turns]
    system_prompt = run.task.system_prompt
    context = run.task.context_conversation()  # A promoted mistake, before the scripted prompts.
    running = EvaluationRun.objects.filter(pk=run.pk, status=EvaluationRun.Status.RUNNING)

    def should_stop() -> bool:
        return shutdown.stopping() or not running.exists()

    def reply(model: LLM, system: str | None, conversation: list[tuple[str, str]], seed: int) -> str:
        if generate is not None:
            return generate(model, system, conversation, seed)
        return generate_with_models(model, system, conversation, seed, should_stop=should_stop)

    def step() -> None:
        if not running.update(progress=F("progress") + 1):
            raise Cancelled(f"Evaluation {run.pk} was cancelled.")
        if on_step is not None:
            on_step()
        if shutdown.stopping():  # The server is stopping: no next step.
            raise shutdown.Interrupted

    try:
        records = evaluation.run(
            list(llms),
            turns,
            lambda name, conversation, seed: reply(llms[name], system_prompt, context + conversation, seed),
            attempts=run.attempts,
            max_tries=run.max_tries,
            fix_attempts=run.fix_attempts,
            decoys=run.decoys,
            feedback_mistakes=run.feedback_mistakes,
            seed=run.pk * 1000,
            progress=step,
        )
    except Cancelled:
        if shutdown.stopping():
            interrupt_evaluations(EvaluationRun.objects.filter(pk=run.pk))
        logger.info("Evaluation %s stopped: it was cancelled", run.pk)
        run.refresh_from_db()
        return run
    except Exception as error:
        if shutdown.stopping():  # Between two steps, or its model was shut down under it.
            logger.warning("Evaluation %s interrupted: the server is stopping", run.pk)
            interrupt_evaluations(EvaluationRun.objects.filter(pk=run.pk))
            run.refresh_from_db()
            return run
        logger.exception("Evaluation %s failed", run.pk)
        EvaluationRun.objects.filter(pk=run.pk).update(
            status=EvaluationRun.Status.FAILED, error=f"{type(error).__name__}: {error}", finished=timezone.now()
        )
        run.refresh_from_db()
        return run
    with transaction.atomic():
        # Done only if nobody cancelled it after its last step; else nothing is kept.
        if running.select_for_update().exists():
            EvaluationReply.objects.bulk_create(EvaluationReply.from_record(run, record, llms) for record in records)
            running.update(status=EvaluationRun.Status.DONE, finished=timezone.now())
    run.refresh_from_db()
    return run


def cancel_evaluation(run: EvaluationRun) -> bool:
    """Cancel a waiting or running run: a waiting one never starts, a running one stops within
    a second of its current reply (on the arena's own engines; a reply on a model served
    elsewhere is stopped there too) and keeps nothing. False if it had already ended; "Run
    again" starts a cancelled run over."""
    cancelled = EvaluationRun.objects.filter(pk=run.pk, status__in=EvaluationRun.UNFINISHED_STATUSES).update(
        status=EvaluationRun.Status.CANCELLED, finished=timezone.now()
    )
    return bool(cancelled)


def interrupt_evaluations(runs: QuerySet[EvaluationRun] | None = None) -> int:
    """Mark the runs (default: all) waiting or running as interrupted: the server that ran them
    is stopping, and in the embedded mode nothing else would ever finish them. How many; the
    admin's "Run again" starts one over."""
    unfinished = (EvaluationRun.objects.all() if runs is None else runs).filter(
        status__in=[EvaluationRun.Status.PENDING, EvaluationRun.Status.RUNNING]
    )
    return unfinished.update(status=EvaluationRun.Status.INTERRUPTED, finished=timezone.now())


def restart_evaluation(run: EvaluationRun) -> bool:
    """Start a failed, interrupted or cancelled run over (its rated replies dropped); False if
    it is not one (running, waiting or done)."""
    with transaction.atomic():
        locked = EvaluationRun.objects.select_for_update().filter(
            pk=run.pk, status__in=EvaluationRun.RESTARTABLE_STATUSES
        )
        if not locked.exists():
            return False
        EvaluationReply.objects.filter(run_id=run.pk).delete()
        locked.update(status=EvaluationRun.Status.PENDING, progress=0, error="", started=None, finished=None)
        transaction.on_commit(lambda: enqueue_evaluation(run.pk))
    return True


def _checker_of(turn: TaskTurn) -> Callable[[str], CheckResult]:
    def check(reply: str) -> CheckResult:
        result = turn.check_reply(reply)
        assert result is not None, "create_evaluation refuses tasks with unchecked turns"
        return result

    return check
