"""The engine's in-place forward passes, one module per model family (as keras-hub has one
folder per family).

Each pass computes what the family's ``call_with_cache`` computes, with the model's own layers,
for ``tokens [rows, T]`` at per-row positions, but keeps each layer's keys and values as separate
arrays that are updated in place (``inference.engine`` explains why). Traced inside jit only.

A family's module offers ``in_place_decoder(lm, context, relayout=...)``: its pass for ``lm``, or
None where the pass would not compute exactly what keras-hub does; ``relayout`` False keeps the
pass on the model's kernels as they lie (no second copy laid out otherwise). A new family is one
new module and one entry of ``FAMILIES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

# The modules of inference.forward with a pass, asked in this order.
FAMILIES = ("gemma", "gemma3", "llama")


class InPlaceDecoder(NamedTuple):
    forward: Callable[..., Any]
    prepare: Callable[[Any], tuple[Any, ...]]  # Lays out the weights the pass multiplies by.
    layout: str | None = None  # The Llama pass's, chosen by timing (inference.forward.llama).
    # (layers, key/value heads, head dimension, dtype) of the caches, for a family whose
    # keras-hub cache cannot be built without its other inputs (Gemma 3's images); None: the
    # engine finds it by building keras-hub's cache abstractly.
    cache_layout: Callable[[Any], tuple[int, int, int, str]] | None = None


def adapter_kernels(lm: Any) -> Callable[[Any], list[tuple[Any, ...]]] | None:
    """The function giving ``lm``'s block kernels as its pass multiplies by them, per block, in
    the order LoRA adapters are given to the engine (``inference.forward.adapters``); None for a
    family whose pass takes no adapters (its ``forward`` has no ``adapted``)."""
    import keras_hub

    if type(lm) in (keras_hub.models.Llama3CausalLM, keras_hub.models.MistralCausalLM):
        from inference.forward.llama import block_kernels

        return block_kernels
    if type(lm) is keras_hub.models.Gemma3CausalLM:
        from inference.forward.gemma3 import block_kernels

        return block_kernels
    return None


def narrow_embedding_pays(lm: Any) -> bool:
    """Whether ``lm``'s pass runs a token embedding kept in bfloat16 (``inference.engine.
    stored_dtype``) at least as fast as a float32 one on a CPU, so that a host narrows it: Gemma
    3's (its logits then read half the bytes: a decode step of 8 slots 105 ms against 144 ms).
    Not the Llama pass's, whose logits XLA widens the table for (SmolLM2: 82 ms against 57 ms),
    nor Gemma's, not measured (scratch timings, this project's Intel Xeon)."""
    import keras_hub

    return type(lm) is keras_hub.models.Gemma3CausalLM


def in_place_decoder(lm: Any, context: int, *, relayout: bool = True) -> InPlaceDecoder | None:
    """The engine's own forward pass for ``lm`` (the first family's that takes it), with the
    function that lays out its matmul weights; None where there is none. ``relayout``: whether
    the pass may multiply by a copy of the kernels laid out otherwise where that runs faster
    (the Llama pass's feature-major layout); False: the kernels as they lie, held once."""
    for family in FAMILIES:
        module = importlib.import_module(f"{__name__}.{family}")
        decoder = module.in_place_decoder(lm, context, relayout=relayout)
        if decoder is not None:
            return decoder
    return None
