"""The engine's in-place forward pass for Llama 3 and Mistral decoders."""

from __future__ import annotations

from typing import Any


def no_weights(model: Any) -> tuple[Any, ...]:
    """Llama 3 and Mistral use their layers' own kernels."""
    return ()


def llama_forward(
    model: Any, tokens: Any, caches: tuple[Any, ...], starts: Any, weights: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...]]:
    """``inference.forward.gemma.gemma_forward`` for a Llama 3 or Mistral model.

    ``call_with_cache`` of those families, block by block, with the model's own layers
    (including the attention's own ``_compute_attention``, so the arithmetic is the same), but
    each layer's keys and values are separate ``[rows, positions, kv_heads, head_dim]`` arrays
    written in place.
    """
    import jax
    import jax.numpy as jnp
    from keras import ops

    backbone = model.backbone
    length = tokens.shape[1]
    x = backbone.token_embedding(tokens)
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]
    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block._self_attention_layer
        keys, values = caches[2 * index], caches[2 * index + 1]

        def rope(t: Any, attention: Any = attention) -> Any:
            def one(row: Any, start: Any) -> Any:
                return attention.rotary_embedding_layer(row[None], start_index=start)[0]

            return jax.vmap(one)(t, starts)

        residual = x
        normalized = block._self_attention_layernorm(x)
        query = rope(attention._query_dense(normalized))
        key = rope(attention._key_dense(normalized))
        value = attention._value_dense(normalized)

        def write(cache: Any, update: Any, start: Any) -> Any:
            return jax.lax.dynamic_update_slice(cache, update, (start, 0, 0))

        keys = jax.vmap(write)(keys, key, starts)
        values = jax.vmap(write)(values, value, starts)
        updated += [keys, values]
        groups = getattr(attention, "num_key_value_groups", None) or attention._num_key_value_groups
        mask = jnp.arange(keys.shape[1])[None, None, :] <= query_positions[:, :, None]  # [rows, T, positions]
        attended = attention._compute_attention(
            query,
            ops.repeat(keys, repeats=groups, axis=2),
            ops.repeat(values, repeats=groups, axis=2),
            ops.cast(mask, "int32"),
        )
        x = attention._output_dense(attended) + residual

        residual = x
        normalized = block._feedforward_layernorm(x)
        # As the decoder block: the activation in float32 (what torch's silu does).
        gate = ops.cast(
            block.activation(ops.cast(block._feedforward_gate_dense(normalized), "float32")), block.compute_dtype
        )
        x = (
            block._feedforward_output_dense(ops.multiply(block._feedforward_intermediate_dense(normalized), gate))
            + residual
        )
    x = backbone.layer_norm(x)
    return backbone.token_embedding(x, reverse=True), tuple(updated)
