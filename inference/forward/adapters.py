"""LoRA adapters served unmerged over their base's kernels, several in one batch, as vLLM,
S-LoRA and Punica serve them: one copy of the base's weights, and per row of a batch the
adapter it runs (0: none, the base itself).

An adapter's change to a kernel, ``merged - base`` flattened to ``[in, out]`` as the family's
pass multiplies by it, is kept as two factors, ``down [in, R]`` and ``up [R, out]``
(``factors_of``); an engine (``inference.engine``'s ``adapters``) stacks them over the
adapters it serves, adapter 0 all zeros (``stack_adapters``), so that every row runs the same
program and only the index differs. A row's
projection is then ``x @ kernel + (x @ down[i]) @ up[i]``: the base's kernel is read once for
all rows, whichever adapter each runs, and the factors add ``R * (in + out)`` multiply-adds a
token to the kernel's ``in * out``. ``R`` is the change's rank: a Dense layer's LoRA rank, or
heads times it for a kernel whose LoRA factors are per head (keras's ``EinsumDense`` keeps
``a`` as ``kernel.shape[:-1] + (rank,)``).

An adapter's factors are computed from its model's kernels and its base's
(``factors_between``), and can be kept in a file beside its preset (``save_factors``,
``load_factors``), so that a host serving it need not read the whole tuned model.

Plain NumPy and JAX, no Keras: the families' passes (``inference.forward.llama``,
``inference.forward.gemma3``) call ``row_delta`` where a kernel has factors.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# Singular values below this share of the largest are the change's rounding, not its rank.
RANK_TOLERANCE = 1e-6


class Adapted(NamedTuple):
    """What a batch's rows run besides the base: ``rows [rows]`` (int32) each row's adapter, 0
    for none; ``factors`` per block, per kernel in the family's order, its stacked
    ``(down [adapters, in, R], up [adapters, R, out])`` or None where no adapter changes it."""

    rows: Any
    factors: tuple[tuple[tuple[Any, Any] | None, ...], ...]


def factors_of(delta: np.ndarray, tolerance: float = RANK_TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """``delta [in, out]`` as ``down [in, R] @ up [R, out]``, ``R`` its numerical rank (at least
    1), by a singular value decomposition in float64, the singular values split evenly between
    the two factors; returned in ``delta``'s dtype."""
    matrix = np.asarray(delta, dtype=np.float64)
    left, values, right = np.linalg.svd(matrix, full_matrices=False)
    rank = max(1, int(np.sum(values > tolerance * values[0]))) if values.size and values[0] > 0 else 1
    root = np.sqrt(values[:rank])
    return (left[:, :rank] * root).astype(delta.dtype), (root[:, None] * right[:rank]).astype(delta.dtype)


Factors = list[list[tuple[np.ndarray, np.ndarray] | None]]  # Per block, per kernel of the family's order.


def factors_between(tuned: Sequence[Sequence[Any]], base: Sequence[Sequence[Any]]) -> Factors:
    """An adapter's factors from its model's kernels and its base's, each per block, per kernel
    of the family's order (``block_kernels``, ``[in, out]``): ``factors_of`` each change in
    float32, None where the kernel is unchanged."""
    shapes = [[tuple(kernel.shape) for kernel in block] for block in tuned]
    if shapes != [[tuple(kernel.shape) for kernel in block] for block in base]:
        raise ValueError("The tuned model's kernels are not shaped as its base's.")
    factors: Factors = []
    for tuned_block, base_block in zip(tuned, base, strict=True):
        pairs = zip(tuned_block, base_block, strict=True)
        changes = (np.asarray(mine, np.float32) - np.asarray(theirs, np.float32) for mine, theirs in pairs)
        factors.append([factors_of(change) if change.any() else None for change in changes])
    return factors


def save_factors(path: Path, factors: Factors) -> None:
    """``factors`` in an ``.npz`` file: ``down_{block}_{kernel}`` and ``up_{block}_{kernel}`` where
    the kernel changes, and the block and kernel counts."""
    arrays = {"shape": np.array([len(factors), len(factors[0]) if factors else 0])}
    for index, block in enumerate(factors):
        for which, pair in enumerate(block):
            if pair is not None:
                arrays[f"down_{index}_{which}"], arrays[f"up_{index}_{which}"] = pair
    with path.open("wb") as out:
        np.savez(out, **arrays)


def load_factors(path: Path, kernel_shapes: Sequence[Sequence[tuple[int, ...]]]) -> Factors:
    """The factors ``save_factors`` wrote, for a base whose block kernels have ``kernel_shapes``
    (``[in, out]`` per block, per kernel); ValueError where they do not fit them."""
    with np.load(path) as saved:
        blocks, kernels = (int(n) for n in saved["shape"])
        if blocks != len(kernel_shapes) or any(len(block) != kernels for block in kernel_shapes):
            raise ValueError(f"{path}: factors for {blocks} blocks of {kernels} kernels, not this model's.")
        factors: Factors = []
        for index, block in enumerate(kernel_shapes):
            factors.append([])
            for which, (ins, outs) in enumerate(block):
                if f"down_{index}_{which}" not in saved:
                    factors[-1].append(None)
                    continue
                down, up = saved[f"down_{index}_{which}"], saved[f"up_{index}_{which}"]
                if down.shape[0] != ins or up.shape[1] != outs or down.shape[1] != up.shape[0]:
                    raise ValueError(f"{path}: block {index}'s kernel {which} does not fit this model's.")
                factors[-1].append((down, up))
    return factors


def stack(per_adapter: Sequence[tuple[np.ndarray, np.ndarray] | None]) -> tuple[np.ndarray, np.ndarray] | None:
    """One kernel's factors over an engine's adapters, ``per_adapter[i]`` being adapter ``i + 1``'s
    (None: it leaves the kernel as it is): ``(down [1 + n, in, R], up [1 + n, R, out])``, adapter 0
    and those without a change all zeros, every adapter's zero-padded to the largest ``R``. None
    when no adapter changes the kernel."""
    changed = [factors for factors in per_adapter if factors is not None]
    if not changed:
        return None
    rank = max(down.shape[1] for down, _ in changed)
    ins, outs = changed[0][0].shape[0], changed[0][1].shape[1]
    down = np.zeros((1 + len(per_adapter), ins, rank), np.float32)
    up = np.zeros((1 + len(per_adapter), rank, outs), np.float32)
    for index, factors in enumerate(per_adapter, start=1):
        if factors is not None:
            first, second = factors
            down[index, :, : first.shape[1]] = first
            up[index, : second.shape[0]] = second
    return down, up


def stack_adapters(adapters: Sequence[Sequence[Sequence[tuple[np.ndarray, np.ndarray] | None]]]) -> Any:
    """An engine's adapters' factors, each given per block, per kernel of the family's order
    (``factors_of`` or None), stacked kernel by kernel (``stack``): ``Adapted.factors``."""
    blocks = {len(adapter) for adapter in adapters}
    kernels = {len(block) for adapter in adapters for block in adapter}
    if len(blocks) != 1 or len(kernels) != 1:
        raise ValueError("Every adapter needs the same blocks, each with the same kernels.")
    (block_count,), (kernel_count,) = blocks, kernels
    return tuple(
        tuple(stack([adapter[index][which] for adapter in adapters]) for which in range(kernel_count))
        for index in range(block_count)
    )


def row_delta(x: Any, factors: tuple[Any, Any], rows: Any, *, feature_major: bool = False) -> Any:
    """What each row's adapter adds to a projection of ``x``: ``x [rows * T, in]`` gives ``[rows
    * T, out]``; feature-major, ``x [in, rows * T]`` gives ``[out, rows * T]`` (the Llama pass's
    layouts; tokens row by row). Each row's factors are gathered once, not each token's."""
    import jax.numpy as jnp

    down, up = factors
    count = rows.shape[0]
    down, up = down[rows], up[rows]  # [rows, in, R], [rows, R, out]
    if feature_major:
        grouped = x.reshape(x.shape[0], count, -1)  # [in, rows, T]
        low = jnp.einsum("irt,rik->rtk", grouped, down)
        return jnp.einsum("rtk,rko->ort", low, up).reshape(up.shape[-1], -1)
    grouped = x.reshape(count, -1, x.shape[-1])  # [rows, T, in]
    low = jnp.einsum("rti,rik->rtk", grouped, down)
    return jnp.einsum("rtk,rko->rto", low, up).reshape(-1, up.shape[-1])
