"""One LoRA adapter of an engine, served as a model of its own (``AdapterEngine``): what a model
host hands out for a fine-tuned model whose base's engine serves it unmerged
(``inference.hosts.engines``). Its requests share the base engine's slots and decode steps."""

from __future__ import annotations

from typing import Any

from inference.engine.requests import Request
from inference.engine.scheduler import Engine


class AdapterEngine:
    """``engine``'s adapter ``adapter`` with the ``Engine`` interface its callers use: requests
    run the adapter, and the slot and queue counts are the adapter's own. Warming it warms the
    base engine (the programs are the same); shutting it down stops nothing: the base engine
    serves the base model and the other adapters too, and its own shutdown ends every request."""

    def __init__(self, engine: Engine, adapter: int) -> None:
        if not 1 <= adapter <= engine.adapter_count:
            raise ValueError(f"The engine serves adapters 1..{engine.adapter_count}, not {adapter}.")
        self.engine = engine
        self.adapter = adapter

    @property
    def lm(self) -> Any:
        return self.engine.lm

    @property
    def context_length(self) -> int:
        return self.engine.context_length

    @property
    def slots(self) -> int:
        return self.engine.slots

    @property
    def compilations(self) -> int:
        return self.engine.compilations

    @property
    def forward_layout(self) -> str | None:
        return self.engine.forward_layout

    @property
    def active_slots(self) -> int:
        return self.engine.active_slots_of(self.adapter)

    @property
    def queued(self) -> int:
        return self.engine.queued_of(self.adapter)

    def prompt_tokens(self, prompt: str) -> int:
        return self.engine.prompt_tokens(prompt)

    def submit(self, prompt: str, **options: Any) -> Request:
        """``Engine.submit`` (the same options) with this adapter."""
        return self.engine.submit(prompt, **options, adapter=self.adapter)

    def warm_up(self, timeout: float | None = None) -> None:
        self.engine.warm_up(timeout)

    def shutdown(self, timeout: float | None = None) -> bool:
        """Nothing to stop (see the class): True."""
        return True
