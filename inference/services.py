"""The roster's services: how the rest of the arena talks to a model, wherever it is served (the
arena's own engine in this process, or an OpenAI-compatible endpoint: ``inference.clients``), and
the roster's writes for models served elsewhere.

``ModelReply`` is one reply of a roster model as the arena shows it; ``votes.generation`` streams
battle replies through it, ``generate_text`` writes evaluation replies with it. Keras and JAX are
imported only when a model hosted here first generates, so that importing this module (the web
tier does) stays cheap.
"""

import dataclasses
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError

from inference import metrics, selectors
from inference.chat_templates import ChatTurn
from inference.clients.base import GREEDY, Generation, ModelClient, Sampling, StopReason
from inference.clients.openai_compatible import Endpoint, OpenAICompatibleClient
from inference.hosts.engines import ModelSpec
from inference.models import LLM, parse_mesh_shape
from inference.registry import PresetInfo, read_preset
from inference.reply_edges import without_edge_whitespace, without_family_prefix, without_family_prefix_text
from inference.streaming import GenerationStats, Tick

logger = logging.getLogger(__name__)


class ContextOverflow(ValueError):
    """The conversation does not fit the model's context: nothing was sent."""


class GenerationStopped(Exception):
    """``generate_text``'s caller asked it to stop (a cancelled evaluation run)."""


# How often generate_text asks its caller whether to stop.
STOP_POLL_SECONDS = 1.0


def resolve_preset(preset: str) -> str:
    """A relative preset path is taken from the project root; anything else is a hub handle."""
    path = Path(preset)
    if not path.is_absolute() and (settings.BASE_DIR / path).is_dir():
        return str(settings.BASE_DIR / path)
    return preset


def model_spec(model: LLM) -> ModelSpec:
    """How a process hosting ``model`` loads it. With ``ARENA_FIXERS_AS_ADAPTERS``, a model the
    project fine-tuned from another model hosted with it (``selectors.hosted_beside``) is served
    by that model's engine as a LoRA adapter (``inference.hosts.engines``): its spec names the
    other's, whose spec names its preset among its adapters, with ``ARENA_ENGINE_SLOTS`` for each
    model it serves (as many replies of each model at once as an engine of its own would take; the
    prefix pool is shared). Called for every reply: one roster query per spec, the presets'
    descriptions read once per change of their files."""
    spec = _own_spec(model)
    if not settings.ARENA_FIXERS_AS_ADAPTERS or model.served_elsewhere:
        return spec
    beside = selectors.hosted_beside(model)
    base = next((other for other in beside if _tuned_from(model, other)), None)
    if base is not None:
        return dataclasses.replace(spec, adapter_of=model_spec(base))
    tuned = [other for other in beside if _tuned_from(other, model)]
    return dataclasses.replace(
        spec, adapters=tuple(_own_spec(other).preset for other in tuned), slots=spec.slots * (1 + len(tuned))
    )


def _own_spec(model: LLM) -> ModelSpec:
    return ModelSpec(
        name=model.name,
        family=model.family,
        preset=resolve_preset(model.preset),
        dtype=model.dtype or None,
        mesh_shape=parse_mesh_shape(model.mesh_shape),
        slots=settings.ARENA_ENGINE_SLOTS,
        prefix_cache_rows=settings.ARENA_PREFIX_CACHE_ROWS,
        prefix_cache_tokens=settings.ARENA_PREFIX_CACHE_TOKENS,
        compact=settings.ARENA_ENGINE_COMPACT,
        cache_dtype=settings.ARENA_ENGINE_CACHE_DTYPE or None,
        embedding_dtype=settings.ARENA_ENGINE_EMBEDDING_DTYPE or None,
    )


def _tuned_from(tuned: LLM, base: LLM) -> bool:
    """Whether the project fine-tuned ``tuned`` from ``base`` (``tuned``'s preset metadata names
    ``base``'s preset folder, and ``base`` was tuned from nothing), both loaded alike (dtype,
    mesh)."""
    tuned_info, base_info = _preset_info(tuned), _preset_info(base)
    return (
        tuned_info is not None
        and base_info is not None
        and tuned_info.fine_tuned_from == base_info.path.name
        and base_info.fine_tuned_from is None
        and (tuned.dtype, tuned.mesh_shape) == (base.dtype, base.mesh_shape)
    )


def _preset_info(model: LLM) -> PresetInfo | None:
    """The local preset's description; None for a hub handle or a folder that is not one."""
    path = Path(resolve_preset(model.preset))
    stamps = tuple(_modified_ns(path / name) for name in ("config.json", "metadata.json"))
    try:
        return _read_preset(path, stamps)
    except (ValueError, OSError):
        return None


def _modified_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=256)
def _read_preset(path: Path, stamps: tuple[int | None, ...]) -> PresetInfo:
    """``read_preset``, once per change of the files that say what a preset is (``stamps``:
    their modification times; a failed read is not kept)."""
    return read_preset(path)


def warm_up(model: LLM) -> None:
    """Load ``model`` in this process's engines, if it is hosted here, and compile every shape
    its engine will use (as ``inference.warming`` does before the first voter)."""
    if not model.served_elsewhere:
        from inference.hosts import engines

        engines.warm_up(model_spec(model))


def endpoint(model: LLM) -> Endpoint:
    """Where a model served elsewhere is, with its key read from the workers' environment now."""
    return Endpoint(
        base_url=model.endpoint_url,
        served_model=model.served_model,
        context_tokens=model.context_tokens or 0,
        api_key=os.environ.get(model.api_key_env) if model.api_key_env else None,
        server_applies_template=model.server_applies_template,
        family=model.family,
        connect_timeout_s=settings.ARENA_ENDPOINT_CONNECT_TIMEOUT_SECONDS,
        read_timeout_s=settings.ARENA_ENDPOINT_READ_TIMEOUT_SECONDS,
        max_response_bytes=settings.ARENA_ENDPOINT_MAX_RESPONSE_BYTES,
    )


def client_for(model: LLM) -> ModelClient:
    """The client of whatever serves ``model``: its OpenAI-compatible endpoint, or the arena's own
    keras-hub engine in this process (loaded on first use)."""
    if model.served_elsewhere:
        return OpenAICompatibleClient(endpoint(model))
    from inference.clients.local import LocalEngineClient

    return LocalEngineClient(model_spec(model))


class ModelReply:
    """One reply of a roster model, as the arena shows it.

    Made with the conversation (``(role, content)`` pairs after the system prompt); ``fits`` tells
    whether the conversation and a whole reply of the model's token limit fit its context, before
    anything is sent; ``start()`` sends it. ``deltas(tick)`` streams the text without the family's
    habitual prefix and the whitespace at its edges (no tell reaches the voter), with an empty
    string for every ``tick`` seconds without text; ``cancel()`` stops it from any thread, and
    ``wait()`` then returns once the server has let it go. Its tokens and timings are recorded
    (``inference.metrics``) when its text has been read to the end.

    The model's context length is what its server states (the roster keeps it, as the draw of
    anonymous pairs reads it: ``LLM.objects.anonymous()``). Sampling is the roster's, with
    ``seed``; ``greedy`` decodes greedily whatever the roster says (evaluation runs), and a
    ``background`` reply yields to live ones (evaluation runs: ``inference.engine.priority``).
    """

    def __init__(
        self,
        model: LLM,
        system_prompt: str | None,
        conversation: Sequence[tuple[str, str]],
        *,
        seed: int = 0,
        greedy: bool = False,
        background: bool = False,
    ) -> None:
        self.model = model
        self.background = background
        self.client = client_for(model)
        if model.context_tokens != self.client.context_length:
            LLM.objects.filter(pk=model.pk).update(context_tokens=self.client.context_length)
            model.context_tokens = self.client.context_length
        self.system = system_prompt or None
        self.turns = [ChatTurn(role=role, content=content) for role, content in conversation]
        self.max_new_tokens = min(model.max_new_tokens, settings.ARENA_MAX_NEW_TOKENS)
        self.sampling = (
            GREEDY
            if greedy
            else Sampling(temperature=model.temperature, top_k=model.top_k, top_p=model.top_p, seed=seed)
        )
        self.generation: Generation | None = None
        self._recorded = False

    @property
    def context_length(self) -> int:
        return self.client.context_length

    @property
    def prompt_tokens(self) -> int:
        return self.client.prompt_tokens(self.system, self.turns)

    @property
    def tokens_needed(self) -> int:
        """The prompt's tokens and room for a whole reply: a reply cut short by the context on one
        side only would tell the models apart as surely as a refusal."""
        return self.prompt_tokens + self.max_new_tokens

    @property
    def fits(self) -> bool:
        return self.tokens_needed <= self.context_length

    def start(self) -> None:
        """Send the conversation. Raises ``ContextOverflow`` when the model's server refuses it
        for its length (nothing was generated)."""
        try:
            self.generation = self.client.submit(
                self.system,
                self.turns,
                max_new_tokens=self.max_new_tokens,
                sampling=self.sampling,
                background=self.background,
            )
        except ValueError as error:  # The conversation is never empty: it does not fit.
            raise ContextOverflow(str(error)) from error

    def _started(self) -> Generation:
        if self.generation is None:
            raise RuntimeError("The reply has not been started.")
        return self.generation

    def deltas(self, tick: Tick = None) -> Iterator[str]:
        generation = self._started()
        raw = generation.deltas(tick=tick)
        if self.model.family:
            raw = without_family_prefix(self.model.family, raw)
        yield from without_edge_whitespace(raw)
        self._record()

    def result(self, timeout: float | None = None) -> str:
        """The whole text, once the reply is done (at most ``timeout`` seconds), as a battle
        shows it."""
        generation = self._started()
        text = generation.result(timeout=timeout)
        self._record()
        return (without_family_prefix_text(self.model.family, text) if self.model.family else text).strip()

    def cancel(self) -> None:
        if self.generation is not None:
            self.generation.cancel()

    def wait(self) -> None:
        """After ``cancel()``: until the server has let the reply go (the rest is dropped)."""
        for _ in self._started():
            pass
        self._record()

    def _record(self) -> None:
        if not self._recorded:
            self._recorded = True
            metrics.record_generation(self.model.name, self._started().stats)

    @property
    def stats(self) -> GenerationStats:
        return self._started().stats

    @property
    def stop_reason(self) -> StopReason | None:
        return self._started().stop_reason


def generate_text(
    model: LLM,
    system_prompt: str | None,
    conversation: list[tuple[str, str]],
    seed: int,
    *,
    background: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """One whole reply from whatever serves the model, for evaluation runs (no streaming, no rows).

    Greedy, whatever the roster's sampling settings (real models sample in battles): a run
    measures each model's most likely reply, reproducibly. The model's token limit applies, as
    in a battle; ``seed`` is kept for the interface (it matters only to sampled decoding). Raises
    ``ContextOverflow`` for a conversation the model's context cannot hold. ``background``: the
    reply yields to live ones on the arena's own engines (``inference.engine.priority``).
    ``should_stop`` is asked every ``STOP_POLL_SECONDS`` while the reply runs: once it says so
    the reply is cancelled and ``GenerationStopped`` raised.
    """
    reply = ModelReply(model, system_prompt, conversation, seed=seed, greedy=True, background=background)
    if reply.prompt_tokens + 1 > reply.context_length:
        raise ContextOverflow(f"The conversation does not fit {model.name}'s {reply.context_length}-token context.")
    reply.start()
    if should_stop is None:
        return reply.result(timeout=settings.ARENA_GENERATION_TIMEOUT_SECONDS)
    deadline = time.monotonic() + settings.ARENA_GENERATION_TIMEOUT_SECONDS
    while True:
        left = deadline - time.monotonic()
        try:
            return reply.result(timeout=max(0.0, min(STOP_POLL_SECONDS, left)))
        except TimeoutError:
            if left <= STOP_POLL_SECONDS:
                reply.cancel()
                raise
        if should_stop():
            reply.cancel()
            reply.wait()
            raise GenerationStopped(f"{model.name}'s reply was stopped before its end.")


def save_endpoint_model(
    name: str,
    *,
    url: str,
    served_model: str,
    api_key_env: str = "",
    context_tokens: int | None = None,
    family: str = "",
    server_applies_template: bool = True,
    base: bool = False,
    enabled: bool = True,
    sampling: dict[str, float] | None = None,
    max_new_tokens: int = 96,
    check: bool = True,
) -> tuple[LLM, bool]:
    """Add a model served by an OpenAI-compatible endpoint to the roster, or update its entry.

    With ``check``, the server is asked for its models first (raising ``EndpointError`` if it does
    not answer or does not serve ``served_model``), and the context length it states is used when
    none is given. Raises ``ValidationError`` for an entry the roster cannot take.
    """
    from inference.clients.openai_compatible import EndpointError

    model = LLM.objects.filter(name=name).first() or LLM(name=name)
    created = model.pk is None
    if not created and not model.served_elsewhere:
        raise ValidationError({"name": f"{name} is hosted by the arena (preset {model.preset}); choose another name."})
    model.endpoint_url = url
    model.served_model = served_model
    model.api_key_env = api_key_env
    model.family = family
    model.server_applies_template = server_applies_template
    model.base = base
    model.enabled = enabled
    model.max_new_tokens = max_new_tokens
    model.preset = ""
    model.queue = ""  # The endpoints' queue (LLM.save).
    for field, value in (sampling or {}).items():
        setattr(model, field, value)
    model.context_tokens = context_tokens
    if check:
        model.clean_fields(exclude=["context_tokens"])  # A URL and names worth asking.
        try:
            client = OpenAICompatibleClient(endpoint(model))
        except ValueError as error:
            raise ValidationError({NON_FIELD_ERRORS: str(error)}) from None
        served = client.served_models()
        if served_model not in served:
            listed = ", ".join(sorted(served)) or "none"
            raise EndpointError(f"The server at {url} does not serve {served_model!r} (it serves: {listed}).")
        model.context_tokens = context_tokens or served[served_model]
    model.full_clean()
    model.save()
    return model, created


def stop_local_models(timeout_s: float = 1.0) -> list[str]:
    """Shut down the engines this process runs (their running and queued replies end as
    cancelled); their models' names. Nothing is imported when no model was ever loaded here."""
    engines = sys.modules.get("inference.hosts.engines")
    if engines is None:
        return []
    return engines.shutdown_where(lambda spec: True, timeout_s=timeout_s)


def stop_local_models_to_exit() -> int:
    """For a process about to exit: every engine of it shut down, each given
    ``inference.hosts.engines.STOP_TIMEOUT_S`` to end its XLA call in flight; how many have not
    (then leave with :func:`exit_now`)."""
    engines = sys.modules.get("inference.hosts.engines")
    return 0 if engines is None else engines.shutdown_all(engines.STOP_TIMEOUT_S)


def exit_now(exitcode: int = 0) -> NoReturn:
    """Leave without Python's finalisation (``inference.hosts.engines.exit_now``): the way out of a
    process with a thread still in an XLA call, which finalising would abort."""
    from inference.hosts import engines

    engines.exit_now(exitcode)


def local_models_still_running() -> int:
    """Engines of this process stopped by :func:`stop_local_models` whose decode thread is still
    in an XLA call (``inference.hosts.engines.still_running``): the process must then leave with
    :func:`exit_now`."""
    engines = sys.modules.get("inference.hosts.engines")
    return 0 if engines is None else engines.still_running()
