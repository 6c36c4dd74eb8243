"""The engine's in-place forward pass for Gemma 3 text models (Gemma 3 270M, 1B, ...).

Gemma 3 differs from Gemma 1/2 in what ``inference.forward.gemma`` leaves out: RMS norms on
each head's query and key, five sliding-window layers (512 positions for 270M) for each global
one, a rotary base of 10,000 on the local layers and 1,000,000 on the global ones (each layer's
own rotary layer carries it), and a feed-forward width not halved by the gates. keras-hub's
``Gemma3CausalLM.call_with_cache`` also takes image inputs, so the engine's generic step (which
calls it per slot) does not apply; this pass is the only way Gemma 3 runs in the engine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inference.forward import InPlaceDecoder
from inference.forward.attention import grouped_attention, write_keys, write_values


def in_place_decoder(lm: Any, context: int) -> InPlaceDecoder | None:
    """This pass for a text-only Gemma 3 model (see ``supports``); its caches' layout is given,
    since Gemma 3's keras-hub cache also takes image inputs."""
    if not supports(lm):
        return None
    return InPlaceDecoder(gemma3_forward, gemma3_weights, cache_layout=cache_layout)


def supports(lm: Any) -> bool:
    """Whether ``gemma3_forward`` computes exactly what ``lm.call_with_cache`` does: text only,
    causal, no soft caps, no dropout."""
    import keras_hub

    backbone = lm.backbone
    if type(lm) is not keras_hub.models.Gemma3CausalLM or getattr(backbone, "vision_encoder", None) is not None:
        return False
    if getattr(backbone, "use_bidirectional_attention", False) or backbone.final_logit_soft_cap is not None:
        return False
    return all(
        block.attention.logit_soft_cap is None and not block.dropout and not block.attention.dropout
        for block in backbone.transformer_layers
    )


def cache_layout(lm: Any) -> tuple[int, int, int, str]:
    """(layers, key/value heads, head dimension, dtype) of the caches this pass keeps."""
    backbone = lm.backbone
    return backbone.num_layers, backbone.num_key_value_heads, backbone.head_dim, backbone.compute_dtype


def gemma3_weights(model: Any) -> tuple[Any, ...]:
    """Nothing: the pass multiplies by the model's own kernels, as they lie.

    The tied embedding (262,144 entries: 168M of 270M's 268M parameters) gives the logits as
    ``embedding [vocabulary, hidden] @ x.T``, the product as it lies (see ``gemma3_forward``),
    instead of a transposed copy laid out beforehand (671 MB per engine): timed alone at 8 rows,
    the two products took the same time within the machine's noise.
    """
    return ()


def gemma3_forward(
    model: Any, tokens: Any, caches: tuple[Any, ...], starts: Any, weights: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...]]:
    """Logits ``[rows, T, vocabulary]`` for ``tokens [rows, T]`` of a Gemma 3 model, row r's
    tokens at positions ``starts[r]`` onwards, and the caches with their keys and values written.

    Per block, as ``Gemma3DecoderBlock`` with ``CachedGemma3Attention``: pre-attention norm;
    query and key projections, their per-head norms and rotary embeddings at each row's
    positions; attention over the cache up to each token's position (and, on sliding-window
    layers, no further back than the window), through the layer's own float32 masked softmax;
    output projection, post-attention norm, residual; pre-feed-forward norm, GELU-gated
    feed-forward, post-feed-forward norm, residual; final norm, tied logits. Caches are per
    layer, keys then values, in the engine's layout (``inference.forward.attention``).
    """
    import jax
    import jax.numpy as jnp
    import keras
    from keras import ops

    backbone = model.backbone
    rows, length = tokens.shape
    x = backbone.token_embedding(tokens)
    x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]
    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block.attention
        keys, values = caches[2 * index], caches[2 * index + 1]

        def rope(t: Any, attention: Any = attention) -> Any:  # [rows, T, heads, head_dim]
            return jax.vmap(lambda row, start: attention._apply_rope(row[None], start)[0])(t, starts)

        normalized = block.pre_attention_norm(x)
        query = attention.query_dense(normalized)
        key = attention.key_dense(normalized)
        if attention.use_query_key_norm:
            query, key = attention.query_norm(query), attention.key_norm(key)
        query, key = rope(query), rope(key)
        value = attention.value_dense(normalized)

        keys = write_keys(keys, key, starts)
        values = write_values(values, value, starts)
        updated += [keys, values]

        # CachedGemma3Attention._compute_attention without its fused path (never taken on a
        # CPU), with a mask per row instead of its own sliding mask, which assumes one cache
        # index for the whole batch.
        if attention.query_head_dim_normalize:
            normalization = 1 / np.sqrt(attention.head_dim)
        else:
            normalization = 1 / np.sqrt(attention.hidden_dim // attention.num_query_heads)
        query = query * ops.cast(normalization, query.dtype)
        window = attention.sliding_window_size if attention.use_sliding_window_attention else None
        attended = grouped_attention(query, keys, values, query_positions, window=window)
        attended = attention.output_dense(ops.reshape(attended, (rows, length, attention.num_query_heads, -1)))

        if block.use_post_attention_norm:
            attended = block.post_attention_norm(attended)
        attention_x = x + attended
        normalized = block.pre_ffw_norm(attention_x)
        hidden = keras.activations.gelu(block.gating_ffw(normalized), approximate=True) * block.gating_ffw_2(normalized)
        hidden = block.ffw_linear(hidden)
        if block.use_post_ffw_norm:
            hidden = block.post_ffw_norm(hidden)
        x = hidden + attention_x
    x = backbone.layer_norm(x)
    embedding = ops.convert_to_tensor(backbone.token_embedding.embeddings)  # [vocabulary, hidden]
    logits = jnp.dot(embedding, jnp.transpose(x.reshape(rows * length, -1)))  # [vocabulary, tokens]
    # As in inference.forward.llama: without the barrier XLA folds the transpose below into the
    # product and runs it through a slower generic kernel; with it, only the logits move.
    logits = jax.lax.optimization_barrier(logits)
    return jnp.transpose(logits).reshape(rows, length, -1), tuple(updated)
