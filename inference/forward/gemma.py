"""The engine's in-place forward pass for Gemma (1 and 2 without sliding windows or soft caps)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inference.forward import InPlaceDecoder
from inference.forward.attention import grouped_attention, write_keys, write_values
from inference.forward.embedding import output_logits, token_rows


def in_place_decoder(lm: Any, context: int, *, relayout: bool = True) -> InPlaceDecoder | None:
    """This pass for a Gemma model without sliding windows, soft caps or dropout (one layout:
    ``relayout`` changes nothing)."""
    import keras_hub

    backbone = lm.backbone
    if type(lm) is not keras_hub.models.GemmaCausalLM or type(backbone) is not keras_hub.models.GemmaBackbone:
        return None
    if any(
        block.attention.use_sliding_window_attention or block.attention.logit_soft_cap is not None or block.dropout
        for block in backbone.transformer_layers
    ):
        return None
    return InPlaceDecoder(gemma_forward, gemma_weights)


def gemma_weights(model: Any) -> tuple[Any, ...]:
    """Gemma's matmul weights laid out for plain 2-D matmuls (once per engine: a copy of them).

    keras-hub's EinsumDense kernels are ``[heads, hidden, head_dim]`` (q/k/v) and the tied
    embedding is ``[vocabulary, hidden]``: used as they are, XLA transposes them at every token.
    Per block: q/k/v ``[hidden, (heads + 2 kv_heads) * head_dim]``, output ``[heads * head_dim,
    hidden]``, both gates ``[hidden, 2 * ffw]``, the down projection; then the embedding's
    transpose ``[hidden, vocabulary]``.
    """
    import jax.numpy as jnp
    from keras import ops

    def flat(kernel: Any) -> Any:  # [heads, hidden, head_dim] -> [hidden, heads * head_dim]
        kernel = ops.convert_to_tensor(kernel)
        return jnp.transpose(kernel, (1, 0, 2)).reshape(kernel.shape[1], -1)

    backbone = model.backbone
    weights = []
    for block in backbone.transformer_layers:
        attention = block.attention
        qkv = jnp.concatenate(
            [flat(attention.query_dense.kernel), flat(attention.key_dense.kernel), flat(attention.value_dense.kernel)],
            axis=1,
        )
        output = ops.convert_to_tensor(attention.output_dense.kernel)
        gates = jnp.concatenate(
            [ops.convert_to_tensor(block.gating_ffw.kernel), ops.convert_to_tensor(block.gating_ffw_2.kernel)], axis=1
        )
        weights += [qkv, output.reshape(-1, output.shape[-1]), gates, ops.convert_to_tensor(block.ffw_linear.kernel)]
    embedding = ops.convert_to_tensor(backbone.token_embedding.embeddings)
    # An embedding kept narrower than the model computes is multiplied as it lies
    # (``inference.forward.embedding``): no transposed copy.
    if embedding.dtype == backbone.compute_dtype:
        weights.append(jnp.transpose(embedding))
    return tuple(weights)


def gemma_forward(
    model: Any, tokens: Any, caches: tuple[Any, ...], starts: Any, weights: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...]]:
    """Logits ``[rows, tokens, vocabulary]`` for ``tokens [rows, T]`` of a Gemma model, row r's
    tokens at positions ``starts[r]`` onwards, and the caches with their keys and values written.

    One token for every slot (T = 1) is the decode step; T tokens of one row is a prefill chunk.
    The same computation as ``GemmaCausalLM.call_with_cache`` (embedding scaled by sqrt(hidden),
    per block: pre-attention norm, rotary query and key, attention over the cache up to each
    token's position, output projection, gated feed-forward; final norm, tied logits), with the
    model's own norms, rotary embedding and softmax, and its matmul weights as
    ``gemma_weights`` lays them out. keras-hub's layers slice the keys and values out of one
    stacked cache, update and restack it for every token, which on a CPU costs more than the
    arithmetic; here each layer's keys and values are separate arrays laid out ``[rows,
    kv_heads, positions, head_dim]``, written in place. Traced in jit.
    """
    import jax
    import jax.numpy as jnp
    import keras
    from keras import ops

    backbone = model.backbone
    rows, length = tokens.shape
    x = token_rows(backbone.token_embedding, tokens, backbone.compute_dtype)  # [rows, T, hidden]
    x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]
    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block.attention
        qkv_kernel, output_kernel, gates_kernel, down_kernel = weights[4 * index : 4 * index + 4]
        heads, kv_heads, head_dim = attention.num_query_heads, attention.num_key_value_heads, attention.head_dim
        keys, values = caches[2 * index], caches[2 * index + 1]

        def rope(t: Any, attention: Any = attention) -> Any:  # [rows, T, heads, head_dim]
            return jax.vmap(lambda row, start: attention._apply_rope(row[None], start)[0])(t, starts)

        normalized = block.pre_attention_norm(x)
        qkv = jnp.dot(normalized, qkv_kernel)
        query = rope(qkv[..., : heads * head_dim].reshape(rows, length, heads, head_dim))
        key = rope(qkv[..., heads * head_dim : (heads + kv_heads) * head_dim].reshape(rows, length, kv_heads, head_dim))
        value = qkv[..., (heads + kv_heads) * head_dim :].reshape(rows, length, kv_heads, head_dim)

        keys = write_keys(keys, key, starts)
        values = write_values(values, value, starts)
        updated += [keys, values]

        # GemmaAttention._compute_attention, over the engine's cache layout.
        if attention.query_head_dim_normalize:
            normalization = 1 / np.sqrt(head_dim)
        else:
            normalization = 1 / np.sqrt(attention.hidden_dim // heads)
        query = query * ops.cast(normalization, query.dtype)
        attended = jnp.dot(grouped_attention(query, keys, values, query_positions), output_kernel)

        if block.use_post_attention_norm:
            attended = block.post_attention_norm(attended)
        attention_x = x + attended
        normalized = block.pre_ffw_norm(attention_x)
        gates = jnp.dot(normalized, gates_kernel)
        width = gates.shape[-1] // 2
        hidden = keras.activations.gelu(gates[..., :width], approximate=True) * gates[..., width:]
        hidden = jnp.dot(hidden, down_kernel)
        if block.use_post_ffw_norm:
            hidden = block.post_ffw_norm(hidden)
        x = hidden + attention_x
    x = backbone.layer_norm(x)
    embedding = ops.convert_to_tensor(backbone.token_embedding.embeddings)
    if embedding.dtype == x.dtype:  # Its transpose laid out, [hidden, vocabulary].
        return jnp.dot(x, weights[-1]), tuple(updated)
    # A narrower embedding, as it lies; the barrier as in inference.forward.llama.
    logits = jax.lax.optimization_barrier(output_logits(embedding, x.reshape(rows * length, -1)))
    return jnp.transpose(logits).reshape(rows, length, -1), tuple(updated)
