"""Attention over the engine's caches, shared by the families' forward passes.

Each layer keeps its keys as ``[rows, kv_heads, head_dim, positions]`` and its values as
``[rows, kv_heads, positions, head_dim]``: a decode step's logits are then each head's query
rows times a ``[head_dim, positions]`` matrix, and its output the probabilities times a
``[positions, head_dim]`` one, both read as they lie. With keys laid out like the values, the
logits contraction ran at about two thirds of the speed on a CPU (30 layers of SmolLM2's 8 x 3
key/value heads over 256 positions: 13.9 ms against 8.8 ms, scratch measurement), and
keras-hub's own order (``[rows, positions, kv_heads, head_dim]``) makes XLA transpose the whole
cache of every layer at every token. Grouped-query attention contracts each key/value head with
its group of query heads directly, never repeating keys and values to the number of query heads
(which, on a CPU, costs more than the attention itself).

The caches may be kept narrower than the model computes (float16 for a float32 model: half the
memory of every slot, staging row and prefix pool row), as vLLM's ``kv_cache_dtype`` keeps them:
keys and values are rounded once when written and attended over in the model's dtype. On a CPU
float16 is the narrow dtype that costs least: XLA widens bfloat16 slowly (a decode step of 8
slots over 1024 positions: SmolLM2 116 ms with float16 caches, 94 ms float32, 270 ms bfloat16;
Gemma 3 126, 117 and 219 ms; docs/models.md).
"""

from __future__ import annotations

from typing import Any

# Where the positions lie in a layer's key and value caches (after the rows axis).
KEY_POSITION_AXIS = 3
VALUE_POSITION_AXIS = 2


def cache_shapes(rows: int, kv_heads: int, head_dim: int, positions: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of one layer's key and value caches."""
    return (rows, kv_heads, head_dim, positions), (rows, kv_heads, positions, head_dim)


def masked_softmax(logits: Any, mask: Any, axis: int = -1) -> Any:
    """keras's ``Softmax`` layer with a mask, in float32 as keras-hub's attention layers run it:
    masked logits set to -1e9, softmax over ``axis`` (the positions), cast back. The layer also zeroes
    masked outputs afterwards, which changes nothing when every row keeps a position (here, its
    own) and costs a pass."""
    import jax
    import jax.numpy as jnp

    probabilities = jax.nn.softmax(jnp.where(mask, logits.astype(jnp.float32), -1e9), axis=axis)
    return probabilities.astype(logits.dtype)


def narrowed(update: Any, dtype: Any) -> Any:
    """``update`` in the cache's ``dtype``, held within that dtype's range where it is narrower
    (float16's reaches 65504: a larger key would be infinite, and its softmax not a number)."""
    import jax.numpy as jnp

    if update.dtype == dtype:
        return update
    top = float(jnp.finfo(dtype).max)
    if top < float(jnp.finfo(update.dtype).max):
        update = jnp.clip(update, -top, top)
    return update.astype(dtype)


def write_keys(cache: Any, update: Any, starts: Any) -> Any:
    """``cache [rows, kv_heads, head_dim, positions]`` with ``update [rows, T, kv_heads,
    head_dim]`` written at each row's positions ``starts[r]`` onwards (in place under jit), in
    the cache's dtype."""
    import jax
    import jax.numpy as jnp

    def write(row: Any, part: Any, start: Any) -> Any:
        return jax.lax.dynamic_update_slice(row, narrowed(jnp.transpose(part, (1, 2, 0)), row.dtype), (0, 0, start))

    return jax.vmap(write)(cache, update, starts)


def write_values(cache: Any, update: Any, starts: Any) -> Any:
    """``cache [rows, kv_heads, positions, head_dim]`` with ``update [rows, T, kv_heads,
    head_dim]`` written at each row's positions ``starts[r]`` onwards (in place under jit), in
    the cache's dtype."""
    import jax
    import jax.numpy as jnp

    def write(row: Any, part: Any, start: Any) -> Any:
        return jax.lax.dynamic_update_slice(row, narrowed(jnp.swapaxes(part, 0, 1), row.dtype), (0, start, 0))

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
    """Causal attention of ``query [rows, T, heads, head_dim]`` over a layer's ``keys`` and
    ``values`` caches, each token up to its own position (``query_positions [rows, T]``) and,
    with a sliding ``window``, no further back than it; returns ``[rows, T, heads * head_dim]``.

    The query comes scaled where the family scales the query (Gemma); ``logit_scale`` scales
    the logits instead, where the family does that (Llama, Mistral): the same arithmetic in the
    same order, so greedy tokens match the family's own ``call_with_cache``. Caches kept in a
    narrower dtype than the query's (``Engine``'s ``cache_dtype``) are read in the query's."""
    import jax.numpy as jnp

    keys, values = keys.astype(query.dtype), values.astype(query.dtype)

    rows, length, heads, head_dim = query.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    positions = jnp.arange(keys.shape[KEY_POSITION_AXIS])[None, None, :]
    mask = positions <= query_positions[:, :, None]  # [rows, T, positions]
    if window is not None:
        mask = mask & (positions > query_positions[:, :, None] - window)

    def scaled(logits: Any) -> Any:
        return logits if logit_scale is None else logits * jnp.asarray(logit_scale, logits.dtype)

    # Logits laid out with the positions last, as the key matmul produces them and the softmax
    # reduces them.
    if length == 1:  # The decode step: simpler contractions, measurably faster on a CPU.
        query = query.reshape(rows, kv_heads, groups, head_dim)
        logits = scaled(jnp.einsum("bkgh,bkhs->bkgs", query, keys))
        probabilities = masked_softmax(logits, mask[:, :, None, :])
        attended = jnp.einsum("bkgs,bksh->bkgh", probabilities, values)
    else:
        query = query.reshape(rows, length, kv_heads, groups, head_dim)
        logits = scaled(jnp.einsum("btkgh,bkhs->bktgs", query, keys))
        attended = jnp.einsum("bktgs,bksh->btkgh", masked_softmax(logits, mask[:, None, :, None]), values)
    return attended.reshape(rows, length, heads * head_dim)
