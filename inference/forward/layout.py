"""Timing a decode step's weight matmuls in the two orientations a forward pass can take.

A decode step multiplies a handful of rows (one token per slot) by every kernel. On a CPU,
XLA's speed at so few rows depends on the orientation, and which one wins depends on the
machine: ``kernel [out, in] @ columns [in, rows]`` ran twice as fast as ``rows [rows, in] @
kernel [in, out]`` on an AMD EPYC with AVX2, the same on an Intel Xeon, 5% slower on an AMD
EPYC with AVX-512 (SmolLM2's projections at 8 rows; docs/inference.md has the figures). The
Llama pass (``inference.forward.llama``) times both when an engine is built and runs the faster one; the
benchmark's matmul floor (``inference.bench``) takes the better of the two. No Django, no
keras: plain arrays.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def best_seconds(run: Callable[[], Any], seconds: float) -> float:
    """The shortest of repeated runs of ``run`` within about ``seconds`` (at least three)."""
    run()  # Compiles.
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        began = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - began)
        runs += 1
    return best


def products_seconds(kernels: Sequence[np.ndarray], rows: int, *, columns: bool, seconds: float) -> float:
    """Best time of one jitted function that multiplies ``rows`` rows (or columns) by every
    kernel ``[in, out]``, laid out beforehand for its orientation; every product is returned
    (not reduced), so that XLA cannot simplify any away."""
    import jax
    import jax.numpy as jnp

    if columns:
        laid_out = [jnp.asarray(np.ascontiguousarray(kernel.T)) for kernel in kernels]
        inputs = [jnp.ones((kernel.shape[0], rows), kernel.dtype) for kernel in kernels]
        step = jax.jit(lambda inputs, kernels: [w @ x for x, w in zip(inputs, kernels, strict=True)])
    else:
        laid_out = [jnp.asarray(kernel) for kernel in kernels]
        inputs = [jnp.ones((rows, kernel.shape[0]), kernel.dtype) for kernel in kernels]
        step = jax.jit(lambda inputs, kernels: [x @ w for x, w in zip(inputs, kernels, strict=True)])
    return best_seconds(lambda: jax.block_until_ready(step(inputs, laid_out)), seconds)
