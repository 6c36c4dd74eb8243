"""Building keras-hub models from presets, one build at a time per process.

Keras is not thread-safe while it builds a model: constructing a ``CausalLM`` rewrites its class
hierarchy in place (``keras.src.models.model.inject_functional_model_class`` assigns
``cls.__bases__``), so two threads building models of one architecture at the same moment can
fail with ``TypeError: super(type, obj): obj must be an instance or subtype of type``. A Celery
worker with a thread pool, or a host loading two models for two first replies, does exactly
that; every build in the process goes through this lock instead.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras_hub

_build_lock = threading.Lock()


def causal_lm_from_preset(preset: str, **kwargs: Any) -> keras_hub.models.CausalLM:
    """``keras_hub.models.CausalLM.from_preset(preset, **kwargs)``, serialised with every other
    model build of this process (a distribution scope the caller entered still applies: keras
    keeps it per thread)."""
    import keras_hub

    import inference.tokenizers  # noqa: F401  (imported presets may name its tokenizer class)

    with _build_lock:
        return keras_hub.models.CausalLM.from_preset(preset, **kwargs)
