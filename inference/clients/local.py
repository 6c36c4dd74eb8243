"""The arena's own keras-hub engine, in this process (``inference.hosts.engines``): the embedded
arena's models, and an inference host's. Keras and JAX are imported on first use."""

from __future__ import annotations

from collections.abc import Sequence

from inference import chat_templates
from inference.chat_templates import ChatTurn
from inference.clients.base import Generation, Sampling
from inference.hosts.engines import ModelSpec


class LocalEngineClient:
    def __init__(self, spec: ModelSpec) -> None:
        from inference.hosts import engines

        self.spec = spec
        self.engine = engines.engine_for(spec)

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    def render(self, system: str | None, turns: Sequence[ChatTurn]) -> str:
        return chat_templates.render_prompt(self.spec.family, system, turns)

    def prompt_tokens(self, system: str | None, turns: Sequence[ChatTurn]) -> int:
        return self.engine.prompt_tokens(self.render(system, turns))

    def submit(
        self,
        system: str | None,
        turns: Sequence[ChatTurn],
        *,
        max_new_tokens: int,
        sampling: Sampling,
        background: bool = False,
    ) -> Generation:
        return self.submit_prompt(
            self.render(system, turns),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop_strings=chat_templates.stop_strings(self.spec.family),
            background=background,
        )

    def submit_prompt(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        sampling: Sampling,
        stop_strings: Sequence[str] = (),
        ignore_stop_tokens: bool = False,
        background: bool = False,
    ) -> Generation:
        """A prompt already rendered (a plain completion), straight to the engine; a
        ``background`` one yields to live replies (``inference.engine.priority``)."""
        from inference.engine import SamplingParams

        return self.engine.submit(
            prompt,
            max_new_tokens=max_new_tokens,
            stop_strings=stop_strings,
            sampling=SamplingParams(
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, seed=sampling.seed
            ),
            ignore_stop_tokens=ignore_stop_tokens,
            background=background,
        )
