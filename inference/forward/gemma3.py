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
from inference.forward.adapters import Adapted, row_delta
from inference.forward.attention import grouped_attention, write_keys, write_values
from inference.forward.embedding import output_logits, token_rows


def in_place_decoder(lm: Any, context: int, *, relayout: bool = True) -> InPlaceDecoder | None:
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


def block_kernels(model: Any) -> list[tuple[Any, ...]]:
    """Per block, its seven kernels flattened to ``[in, out]`` as ``gemma3_forward`` multiplies by
    them: query, key, value (keras-hub keeps them ``[heads, hidden, head_dim]``; out is head by
    head), attention output (``[heads, head_dim, hidden]``), the two gates and the feed-forward
    output. An adapter's change to a kernel, flattened alike, gives its factors
    (``inference.forward.adapters.factors_of``)."""
    from keras import ops

    def heads_out(kernel: Any) -> Any:  # [heads, in, head_dim] -> [in, heads * head_dim]
        value = ops.convert_to_tensor(kernel)
        return ops.reshape(ops.transpose(value, (1, 0, 2)), (value.shape[1], -1))

    def in_out(kernel: Any, inputs: int) -> Any:
        return ops.reshape(ops.convert_to_tensor(kernel), (inputs, -1))

    blocks = []
    for block in model.backbone.transformer_layers:
        attention = block.attention
        output = attention.output_dense.kernel
        blocks.append(
            (
                heads_out(attention.query_dense.kernel),
                heads_out(attention.key_dense.kernel),
                heads_out(attention.value_dense.kernel),
                in_out(output, output.shape[0] * output.shape[1]),
                in_out(block.gating_ffw.kernel, block.gating_ffw.kernel.shape[0]),
                in_out(block.gating_ffw_2.kernel, block.gating_ffw_2.kernel.shape[0]),
                in_out(block.ffw_linear.kernel, block.ffw_linear.kernel.shape[0]),
            )
        )
    return blocks


def gemma3_forward(
    model: Any,
    tokens: Any,
    caches: tuple[Any, ...],
    starts: Any,
    weights: tuple[Any, ...],
    adapted: Adapted | None = None,
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
    ``adapted``: LoRA adapters per row, unmerged (``inference.forward.adapters``; the factors
    of ``block_kernels``'s seven kernels).
    """
    import jax
    import jax.numpy as jnp
    import keras
    from keras import ops

    backbone = model.backbone
    rows, length = tokens.shape
    x = token_rows(backbone.token_embedding, tokens, backbone.compute_dtype)
    x = x * ops.cast(ops.sqrt(backbone.hidden_dim), x.dtype)
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]
    updated = []
    for index, block in enumerate(backbone.transformer_layers):
        attention = block.attention
        keys, values = caches[2 * index], caches[2 * index + 1]
        changes = (None,) * 7 if adapted is None else adapted.factors[index]

        def changed(which: int, inputs: Any, out: Any, changes: Any = changes) -> Any:
            """``out``, a layer's projection of ``inputs`` by the block's kernel ``which``
            (``block_kernels``'s order), with each row's adapter's change where it has one."""
            if changes[which] is None:
                return out
            assert adapted is not None
            flat = ops.reshape(inputs, (rows * length, -1))
            delta = row_delta(flat, changes[which], adapted.rows)
            return out + ops.reshape(delta, out.shape).astype(out.dtype)

        def rope(t: Any, attention: Any = attention) -> Any:  # [rows, T, heads, head_dim]
            return jax.vmap(lambda row, start: attention._apply_rope(row[None], start)[0])(t, starts)

        normalized = block.pre_attention_norm(x)
        query = changed(0, normalized, attention.query_dense(normalized))
        key = changed(1, normalized, attention.key_dense(normalized))
        if attention.use_query_key_norm:
            query, key = attention.query_norm(query), attention.key_norm(key)
        query, key = rope(query), rope(key)
        value = changed(2, normalized, attention.value_dense(normalized))

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
        attended = ops.reshape(attended, (rows, length, attention.num_query_heads, -1))
        attended = changed(3, attended, attention.output_dense(attended))

        if block.use_post_attention_norm:
            attended = block.post_attention_norm(attended)
        attention_x = x + attended
        normalized = block.pre_ffw_norm(attention_x)
        gate = changed(4, normalized, block.gating_ffw(normalized))
        hidden = keras.activations.gelu(gate, approximate=True) * changed(5, normalized, block.gating_ffw_2(normalized))
        hidden = changed(6, hidden, block.ffw_linear(hidden))
        if block.use_post_ffw_norm:
            hidden = block.post_ffw_norm(hidden)
        x = hidden + attention_x
    x = backbone.layer_norm(x)
    embedding = ops.convert_to_tensor(backbone.token_embedding.embeddings)  # [vocabulary, hidden]
    logits = output_logits(embedding, x.reshape(rows * length, -1))  # [vocabulary, tokens]
    # As in inference.forward.llama: without the barrier XLA folds the transpose below into the
    # product and runs it through a slower generic kernel; with it, only the logits move.
    logits = jax.lax.optimization_barrier(logits)
    return jnp.transpose(logits).reshape(rows, length, -1), tuple(updated)
