"""The engine's in-place forward pass for Llama 3 and Mistral decoders (SmolLM2 included).

The pass runs feature-major: the residual stream is ``[hidden, tokens]`` and every projection
is ``kernel [out, in] @ activations [in, tokens]``. On a CPU, XLA's matmul with a handful of
rows (a decode step's batch) is about twice as fast in that orientation as ``activations
[tokens, in] @ kernel [in, out]`` (keras-hub's): with 8 rows, 60-68 ms against 121-130 ms for
SmolLM2's 30 blocks of projections on this 2-core AVX2 machine (scripts measured on the
orientation alone; the README gives the step's figures). The kernels are therefore laid out
``[out, in]`` once per engine (``llama_weights``), a second copy of the block weights.
"""

from __future__ import annotations

from typing import Any

from inference.forward.attention import grouped_attention, write_keys, write_values


def llama_weights(model: Any) -> tuple[Any, ...]:
    """Per block, its seven kernels laid out ``[out, in]``: query, key, value, attention output,
    gate, intermediate, feed-forward output; after the blocks, the untied output projection as
    ``[vocabulary, hidden]`` (a tied embedding, SmolLM2's, is already that and is not copied).

    keras-hub keeps q/k/v as ``[hidden, heads, head_dim]``, the attention output as ``[heads,
    head_dim, hidden]`` and the dense kernels as ``[in, out]``.
    """
    import jax.numpy as jnp
    from keras import ops

    def out_in(kernel: Any, inputs: int) -> Any:
        kernel = ops.convert_to_tensor(kernel)
        return jnp.transpose(kernel.reshape(inputs, -1))

    backbone = model.backbone
    hidden = backbone.hidden_dim
    blocks = []
    for block in backbone.transformer_layers:
        attention = block._self_attention_layer
        output = ops.convert_to_tensor(attention._output_dense.kernel)
        blocks.append(
            (
                out_in(attention._query_dense.kernel, hidden),
                out_in(attention._key_dense.kernel, hidden),
                out_in(attention._value_dense.kernel, hidden),
                out_in(output, output.shape[0] * output.shape[1]),
                out_in(block._feedforward_gate_dense.kernel, hidden),
                out_in(block._feedforward_intermediate_dense.kernel, hidden),
                out_in(block._feedforward_output_dense.kernel, backbone.intermediate_dim),
            )
        )
    embedding = backbone.token_embedding
    untied = () if embedding.tie_weights else (jnp.transpose(ops.convert_to_tensor(embedding.reverse_embeddings)),)
    return (*blocks, *untied)


def _rms_norm(layer: Any, x: Any) -> Any:
    """keras-hub's ``LlamaLayerNorm`` (and ``MistralLayerNormalization``, the same arithmetic)
    over axis 0 of a feature-major ``x [hidden, tokens]``: float32, mean of squares, rsqrt with
    the layer's epsilon, its scale, cast back. Not the layer on ``x.T``: XLA folds such
    transposes into the neighbouring matmuls and picks the slow orientation again."""
    import jax
    import jax.numpy as jnp
    from keras import ops

    x = x.astype(jnp.float32)
    variance = jnp.mean(jnp.square(x), axis=0, keepdims=True)
    scale = ops.convert_to_tensor(layer.scale)
    return (x * jax.lax.rsqrt(variance + layer.epsilon) * scale[:, None]).astype(layer.compute_dtype)


def llama_forward(
    model: Any, tokens: Any, caches: tuple[Any, ...], starts: Any, weights: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...]]:
    """``inference.forward.gemma.gemma_forward`` for a Llama 3 or Mistral model.

    ``call_with_cache`` of those families, block by block, with the model's own norm epsilons
    and scales, rotary embedding and kernels (laid out by ``llama_weights``): per block,
    pre-attention norm, rotary query and key, attention over the cache up to each token's
    position (scaled by 1/sqrt(head_dim), float32 softmax), output projection and residual;
    feed-forward norm, SiLU-gated feed-forward (the activation in float32, as the decoder block
    runs it), residual; final norm, logits. Each layer's keys and values are separate
    arrays in the engine's cache layout (``inference.forward.attention``), written in place.
    Traced in jit.
    """
    import jax
    import jax.numpy as jnp
    from keras import ops

    backbone = model.backbone
    rows, length = tokens.shape
    count = rows * length
    blocks = backbone.transformer_layers
    first = blocks[0]._self_attention_layer
    heads, kv_heads = backbone.num_query_heads, backbone.num_key_value_heads
    head_dim = backbone.hidden_dim // heads
    x = jnp.transpose(backbone.token_embedding(tokens).reshape(count, -1))  # [hidden, tokens]
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]

    # Every block's rotary layer has the backbone's settings: cos and sin once, by the layer's
    # own computation, feature-major [head_dim, tokens].
    cos, sin = first.rotary_embedding_layer._compute_cos_sin_embedding(
        jnp.zeros((count, 1, head_dim), x.dtype), positions=query_positions.reshape(count, 1)
    )
    cos, sin = jnp.transpose(cos.reshape(count, head_dim)), jnp.transpose(sin.reshape(count, head_dim))
    half = head_dim // 2

    def rope(t: Any) -> Any:  # [heads, head_dim, tokens], as RotaryEmbedding._apply_rotary_pos_emb
        rotated = jnp.concatenate([-t[:, half:], t[:, :half]], axis=1)
        return t * cos + rotated * sin

    def heads_last(t: Any, count_heads: int) -> Any:  # [heads, head_dim, tokens] -> [rows, T, heads, head_dim]
        return jnp.transpose(t.reshape(count_heads, head_dim, rows, length), (2, 3, 0, 1))

    updated = []
    for index, block in enumerate(blocks):
        attention = block._self_attention_layer
        query_kernel, key_kernel, value_kernel, output_kernel, gate_kernel, up_kernel, down_kernel = weights[index]
        keys, values = caches[2 * index], caches[2 * index + 1]

        residual = x
        normalized = _rms_norm(block._self_attention_layernorm, x)
        query = rope(jnp.dot(query_kernel, normalized).reshape(heads, head_dim, count))
        key = rope(jnp.dot(key_kernel, normalized).reshape(kv_heads, head_dim, count))
        value = jnp.dot(value_kernel, normalized).reshape(kv_heads, head_dim, count)
        keys = write_keys(keys, heads_last(key, kv_heads), starts)
        values = write_values(values, heads_last(value, kv_heads), starts)
        updated += [keys, values]

        attended = grouped_attention(
            heads_last(query, heads), keys, values, query_positions, logit_scale=attention._inv_norm_factor
        )  # [rows, T, heads * head_dim]
        x = jnp.dot(output_kernel, jnp.transpose(attended.reshape(count, -1))) + residual

        residual = x
        normalized = _rms_norm(block._feedforward_layernorm, x)
        gate = ops.cast(block.activation(ops.cast(jnp.dot(gate_kernel, normalized), "float32")), block.compute_dtype)
        x = jnp.dot(down_kernel, jnp.dot(up_kernel, normalized) * gate) + residual
    x = _rms_norm(backbone.layer_norm, x)
    embedding = backbone.token_embedding
    output = ops.convert_to_tensor(embedding.embeddings) if embedding.tie_weights else weights[len(blocks)]
    logits = jnp.dot(output, x)  # [vocabulary, tokens]
    # Left to itself, XLA folds the transpose below into this product, as ``x.T [tokens,
    # hidden] @ output.T``, which its CPU backend runs through a generic kernel at a quarter of
    # the speed: 30 ms against 8 ms a decode step for SmolLM2's 49152 x 576 embedding at 8 rows
    # (profiled). The barrier keeps the product as written; the transpose then moves only the
    # logits.
    logits = jax.lax.optimization_barrier(logits)
    return jnp.transpose(logits).reshape(rows, length, -1), tuple(updated)
