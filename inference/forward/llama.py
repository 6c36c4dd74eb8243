"""The engine's in-place forward pass for Llama 3 and Mistral decoders (SmolLM2 included)."""

from __future__ import annotations

from typing import Any

from inference.forward.attention import grouped_attention, write_heads_first


def llama_weights(model: Any) -> tuple[Any, ...]:
    """The output projection ``[hidden, vocabulary]``, laid out once per engine.

    A tied embedding (SmolLM2's) is ``[vocabulary, hidden]``: used as it is, XLA transposes it
    at every token. The layers' own kernels need no copy: keras-hub keeps q/k/v as ``[hidden,
    heads, head_dim]`` and the output as ``[heads, head_dim, hidden]``, so plain matmuls take
    them reshaped, which costs nothing.
    """
    import jax.numpy as jnp
    from keras import ops

    embedding = model.backbone.token_embedding
    if embedding.tie_weights:
        return (jnp.transpose(ops.convert_to_tensor(embedding.embeddings)),)
    return (ops.convert_to_tensor(embedding.reverse_embeddings),)


def llama_forward(
    model: Any, tokens: Any, caches: tuple[Any, ...], starts: Any, weights: tuple[Any, ...]
) -> tuple[Any, tuple[Any, ...]]:
    """``inference.forward.gemma.gemma_forward`` for a Llama 3 or Mistral model.

    ``call_with_cache`` of those families, block by block, with the model's own norms, rotary
    embedding and kernels: per block, pre-attention norm, rotary query and key, attention over
    the cache up to each token's position (scaled by 1/sqrt(head_dim), float32 softmax),
    output projection and residual; feed-forward norm, SiLU-gated feed-forward (the activation
    in float32, as the decoder block runs it), residual; final norm, logits through
    ``llama_weights``. Each layer's keys and values are separate heads-first arrays
    (``inference.forward.attention``), written in place. Traced in jit.
    """
    import jax
    import jax.numpy as jnp
    from keras import ops

    backbone = model.backbone
    rows, length = tokens.shape
    x = backbone.token_embedding(tokens)  # [rows, T, hidden]
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]

    def project(x: Any, kernel: Any) -> Any:  # EinsumDense "bqm,muh->bquh" as one matmul
        kernel = ops.convert_to_tensor(kernel)
        return jnp.dot(x, kernel.reshape(kernel.shape[0], -1)).reshape(rows, length, kernel.shape[1], -1)

    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block._self_attention_layer
        keys, values = caches[2 * index], caches[2 * index + 1]

        def rope(t: Any, attention: Any = attention) -> Any:  # [rows, T, heads, head_dim]
            return jax.vmap(lambda row, start: attention.rotary_embedding_layer(row[None], start_index=start)[0])(
                t, starts
            )

        residual = x
        normalized = block._self_attention_layernorm(x)
        query = rope(project(normalized, attention._query_dense.kernel))
        key = rope(project(normalized, attention._key_dense.kernel))
        value = project(normalized, attention._value_dense.kernel)
        keys = write_heads_first(keys, key, starts)
        values = write_heads_first(values, value, starts)
        updated += [keys, values]

        output_kernel = ops.convert_to_tensor(attention._output_dense.kernel)
        attended = grouped_attention(query, keys, values, query_positions, logit_scale=attention._inv_norm_factor)
        x = jnp.dot(attended, output_kernel.reshape(-1, output_kernel.shape[-1])) + residual

        residual = x
        normalized = block._feedforward_layernorm(x)
        gate = ops.cast(
            block.activation(ops.cast(block._feedforward_gate_dense(normalized), "float32")), block.compute_dtype
        )
        x = (
            block._feedforward_output_dense(ops.multiply(block._feedforward_intermediate_dense(normalized), gate))
            + residual
        )
    x = backbone.layer_norm(x)
    return jnp.dot(x, weights[0]), tuple(updated)
