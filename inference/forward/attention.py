"""Attention over the engine's heads-first caches, shared by the families' forward passes.

Each layer keeps its keys and values as ``[rows, kv_heads, positions, head_dim]``: the decode
step's contractions then read the cache as it lies, where ``[rows, positions, kv_heads,
head_dim]`` (keras-hub's order) makes XLA transpose the whole cache of every layer at every
token. Grouped-query attention contracts each key/value head with its group of query heads
directly, never repeating keys and values to the number of query heads (which, on a CPU, costs
more than the attention itself).
"""

from __future__ import annotations

from typing import Any


def masked_softmax(logits: Any, mask: Any, axis: int = -1) -> Any:
    """keras's ``Softmax`` layer with a mask, in float32 as keras-hub's attention layers run it:
    masked logits set to -1e9, softmax over ``axis`` (the positions), cast back. The layer also zeroes
    masked outputs afterwards, which changes nothing when every row keeps a position (here, its
    own) and costs a pass."""
    import jax
    import jax.numpy as jnp

    probabilities = jax.nn.softmax(jnp.where(mask, logits.astype(jnp.float32), -1e9), axis=axis)
    return probabilities.astype(logits.dtype)


def write_heads_first(cache: Any, update: Any, starts: Any) -> Any:
    """``cache [rows, kv_heads, positions, head_dim]`` with ``update [rows, T, kv_heads,
    head_dim]`` written at each row's positions ``starts[r]`` onwards (in place under jit)."""
    import jax
    import jax.numpy as jnp

    def write(row: Any, part: Any, start: Any) -> Any:
        return jax.lax.dynamic_update_slice(row, jnp.swapaxes(part, 0, 1), (0, start, 0))

    return jax.vmap(write)(cache, update, starts)


def grouped_attention(
    query: Any,
    keys: Any,
    values: Any,
    query_positions: Any,
    *,
    window: int | None = None,
    logit_scale: float | None = None,
) -> Any:
    """Causal attention of ``query [rows, T, heads, head_dim]`` over heads-first ``keys`` and
    ``values``, each token up to its own position (``query_positions [rows, T]``) and, with a
    sliding ``window``, no further back than it; returns ``[rows, T, heads * head_dim]``.

    The query comes scaled where the family scales the query (Gemma); ``logit_scale`` scales
    the logits instead, where the family does that (Llama, Mistral): the same arithmetic in the
    same order, so greedy tokens match the family's own ``call_with_cache``."""
    import jax.numpy as jnp

    rows, length, heads, head_dim = query.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    positions = jnp.arange(keys.shape[2])[None, None, :]
    mask = positions <= query_positions[:, :, None]  # [rows, T, positions]
    if window is not None:
        mask = mask & (positions > query_positions[:, :, None] - window)

    def scaled(logits: Any) -> Any:
        return logits if logit_scale is None else logits * jnp.asarray(logit_scale, logits.dtype)

    if length == 1:  # The decode step: simpler contractions, measurably faster on a CPU.
        # Logits laid out [rows, kv_heads, positions, groups]: each key/value head's keys
        # [positions, head_dim] times its queries, the many-row side first (faster on a CPU).
        query = query.reshape(rows, kv_heads, groups, head_dim)
        logits = scaled(jnp.einsum("bksh,bkgh->bksg", keys, query))
        probabilities = masked_softmax(logits, mask[:, :, :, None], axis=2)
        attended = jnp.einsum("bksg,bksh->bkgh", probabilities, values)
    else:
        # Logits laid out [rows, kv_heads, T, groups, positions]: what the matmul produces,
        # positions last for the softmax (other orders cost a transpose of all the logits).
        query = query.reshape(rows, length, kv_heads, groups, head_dim)
        logits = scaled(jnp.einsum("btkgh,bksh->bktgs", query, keys))
        attended = jnp.einsum("bktgs,bksh->btkgh", masked_softmax(logits, mask[:, None, :, None]), values)
    return attended.reshape(rows, length, heads * head_dim)
