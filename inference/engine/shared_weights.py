"""Weights held once per process: the models of one architecture share every variable whose
value is the same (a fine-tuned fixer and its base: LoRA changed a few kernels of the upper
blocks, the rest is the base's), and their engines share equal laid-out copies
(``Programs.laid_out``). JAX arrays are immutable, so a shared array is never written through
one model and seen by the other. No Django.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

_models: list[weakref.ref[Any]] = []
_lock = threading.Lock()


def equal_arrays(a: Any, b: Any) -> bool:
    """Whether two JAX arrays hold the same values, in the same shape, dtype and placement."""
    if a is b:
        return True
    if a is None or b is None or a.shape != b.shape or a.dtype != b.dtype or a.sharding != b.sharding:
        return False
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def share_weights(lm: Any) -> int:
    """Point each variable of ``lm`` whose value equals the same variable's in a live model of
    the same architecture (already loaded in this process) at that model's array, and remember
    ``lm`` for the models loaded after it; returns the bytes ``lm`` no longer holds itself."""
    from inference.engine.programs import architecture

    shape = architecture(lm)
    with _lock:
        _models[:] = [ref for ref in _models if ref() is not None]
        others = [model for ref in _models if (model := ref()) is not None and architecture(model) == shape]
        shared = 0
        for other in others:
            for mine, theirs in zip(lm.weights, other.weights, strict=True):
                if mine.path != theirs.path or mine.value is theirs.value:
                    continue
                if equal_arrays(mine.value, theirs.value):
                    shared += mine.value.nbytes
                    mine.assign(theirs.value)  # A JAX array of the same dtype: held, not copied.
        _models.append(weakref.ref(lm))
    return shared
