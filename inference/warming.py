"""Models warm before the first voter, and their hosts say so (``inference.readiness``).

A :class:`Warmer` runs on one background thread of a process that serves models:

* the embedded arena's (``manage.py serve``, or the first page any embedded server answers):
  it loads and compiles every enabled model the arena hosts itself, the anonymous roster first,
  then keeps reporting them ready, warms models an admin enables later, and checks the models
  served elsewhere (their endpoint must list them in ``GET /models``);
* an inference host's (``run_inference_host``): it reports the models that host has warmed.

Every third of ``ARENA_MODEL_STATE_TTL_SECONDS`` it reports again, so a host that stops stops
counting as ready. It stops at its next look once ``should_stop()`` says so (the server is
stopping); a model it is loading at that moment is abandoned with the process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from django.conf import settings
from django.db import close_old_connections

from inference import readiness, services
from inference.clients.openai_compatible import EndpointError, OpenAICompatibleClient
from inference.hosts import engines
from inference.hosts.engines import ModelSpec
from inference.models import LLM
from inference.readiness import State

logger = logging.getLogger(__name__)


def roster() -> list[LLM]:
    """The enabled models, those anonymous battles draw first (they are what a first voter
    needs), then the rest, each group by name."""
    anonymous = set(LLM.objects.anonymous().values_list("pk", flat=True))
    return sorted(LLM.objects.filter(enabled=True), key=lambda model: (model.pk not in anonymous, model.name))


def check_endpoint(model: LLM) -> None:
    """Report a model served elsewhere ready when its server lists it, failed otherwise."""
    try:
        served = OpenAICompatibleClient(services.endpoint(model)).served_models()
    except EndpointError as error:
        readiness.report(model.name, State.FAILED, detail=str(error))
        return
    if model.served_model in served:
        readiness.report(model.name, State.READY)
    else:
        readiness.report(model.name, State.FAILED, detail=f"Its server does not list {model.served_model!r}.")


def check_endpoints() -> int:
    """Check every enabled model served elsewhere (the beat's job in production); how many."""
    models = list(LLM.objects.filter(enabled=True).exclude(endpoint_url=""))
    for model in models:
        check_endpoint(model)
    return len(models)


class Warmer:
    """Warms ``models()`` (when ``warm``) and keeps reporting the ones this process serves."""

    def __init__(
        self,
        models: Callable[[], Sequence[LLM]] = roster,
        *,
        warm: bool = True,
        check_endpoints: bool = True,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        self.models = models
        self.warm = warm
        self.check_endpoints = check_endpoints
        self.should_stop = should_stop
        # Models whose loading failed, with why: not retried until their roster entry changes.
        self._failed: dict[str, tuple[ModelSpec, str]] = {}
        self._loading: str | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._heartbeat: threading.Thread | None = None

    def start(self) -> Warmer:
        self._thread = threading.Thread(target=self._warm_loop, name="arena-warm-up", daemon=True)
        self._heartbeat = threading.Thread(target=self._report_loop, name="arena-readiness", daemon=True)
        self._heartbeat.start()
        if self.warm:
            self._thread.start()
        return self

    @property
    def busy(self) -> bool:
        """Whether it is still warming (it may be loading a model)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Stop at its next look (a model being loaded is abandoned with the process), and take
        back the reports of the models this process hosts: their replies end with it."""
        self.should_stop = lambda: True
        self._wake.set()
        for name in engines.running_specs():
            readiness.forget(name)
        if self._loading is not None:
            readiness.forget(self._loading)

    def _every_interval(self, work: Callable[[], None], what: str) -> None:
        while not self.should_stop():
            try:
                work()
            except Exception:  # The thread must outlive a database hiccup.
                logger.exception("%s failed", what)
            finally:
                close_old_connections()
            self._wake.wait(settings.ARENA_MODEL_STATE_TTL_SECONDS / 3)

    def _warm_loop(self) -> None:
        self._every_interval(self.warm_pass, "Warming the roster")

    def _report_loop(self) -> None:
        self._every_interval(self.report_pass, "Reporting the roster's readiness")

    def warm_pass(self) -> None:
        """Load and compile, one after the other in roster order, the models this process hosts
        and has not warmed yet (a model whose loading failed waits for its entry to change)."""
        for model in self.models():
            if self.should_stop():
                return
            if model.served_elsewhere:
                continue
            spec = services.model_spec(model)
            failed = self._failed.get(model.name)
            if engines.running_specs().get(spec.name) != spec and (failed is None or failed[0] != spec):
                self._warm_one(model.name, spec)

    def report_pass(self) -> None:
        """Report every model this process serves warm as ready, the one it is loading as
        loading, one that failed to load as failed, and (``check_endpoints``) the state of the
        models served elsewhere."""
        running = engines.running_specs()
        for model in self.models():
            if self.should_stop():
                return
            if model.served_elsewhere:
                if self.check_endpoints:
                    check_endpoint(model)
                continue
            spec = services.model_spec(model)
            failed = self._failed.get(model.name)
            if model.name == self._loading:
                readiness.report(model.name, State.LOADING)
            elif running.get(model.name) == spec:
                readiness.report(model.name, State.READY)
            elif failed is not None and failed[0] == spec:
                readiness.report(model.name, State.FAILED, detail=failed[1])

    def _warm_one(self, name: str, spec: ModelSpec) -> None:
        self._loading = name
        readiness.report(name, State.LOADING)
        logger.info("Warming %s", name)
        try:
            engines.warm_up(spec)
        except Exception as error:
            logger.exception("Warming %s failed", name)
            self._failed[name] = (spec, _summary(error))
            readiness.report(name, State.FAILED, detail=self._failed[name][1])
            return
        finally:
            self._loading = None
        self._failed.pop(name, None)
        if not self.should_stop():
            readiness.report(name, State.READY)
            logger.info("%s is ready", name)


def _summary(error: Exception) -> str:
    """An error in one line: its first and last lines (a loader's errors list every option)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [""]
    text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return f"{type(error).__name__}: {text}"


_embedded: Warmer | None = None
_embedded_lock = threading.Lock()


def start_embedded(should_stop: Callable[[], bool]) -> Warmer | None:
    """The embedded arena's warmer, started once per process (``ARENA_WARM_AT_START``); None
    where this process does not write the replies (Celery) or warming at start is off."""
    global _embedded
    if settings.GENERATION_BACKEND != "in-process" or not settings.ARENA_WARM_AT_START:
        return None
    with _embedded_lock:
        if _embedded is None:
            _embedded = Warmer(should_stop=should_stop).start()
        return _embedded
