"""The engine's in-place forward pass for Llama 3 and Mistral decoders (SmolLM2 included).

The pass runs its projections in one of two layouts: on a CPU, whichever multiplies a decode
step's rows faster on the machine the engine is built on (``faster_layout``;
``inference.forward.layout`` says why it depends on the machine); on an accelerator, and in an
engine with compact shapes (the embedded arena's: ``relayout`` False, its weights held once),
token-major:

* token-major (keras-hub's): the residual stream is ``[tokens, hidden]`` and every projection
  is ``activations [tokens, in] @ kernel [in, out]``, the model's kernels used as they lie;
* feature-major: the residual stream is ``[hidden, tokens]`` and every projection is ``kernel
  [out, in] @ activations [in, tokens]``, the block kernels laid out ``[out, in]`` once per
  engine (a second copy of them: 425 MB for SmolLM2).

Both compute the same arithmetic in the same order; only the matmuls' kernels differ.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Literal

from inference.forward import InPlaceDecoder
from inference.forward.adapters import Adapted, row_delta
from inference.forward.attention import grouped_attention, write_keys, write_values
from inference.forward.embedding import output_logits, token_rows

Layout = Literal["token-major", "feature-major"]
# How many rows the layouts are timed at: a decode step of the engine's default 8 slots.
TIMED_ROWS = 8
TIMED_BYTES = 512 * 1024 * 1024  # At most this much of the kernels is timed (then whole blocks).
# Feature-major holds a second copy of the block kernels: it must pay for it, its products at
# least this much faster than token-major's. Where the two time within it (docs/inference.md
# names such hosts), the copy would cost SmolLM2 425 MB for steps a few per cent faster or slower
# from run to run.
FEATURE_MAJOR_GAIN = 0.10
_timed_layouts: weakref.WeakKeyDictionary[Any, dict[int, Layout]] = weakref.WeakKeyDictionary()


def in_place_decoder(lm: Any, context: int, *, relayout: bool = True) -> InPlaceDecoder | None:
    """This pass, in the faster layout (``relayout``; else token-major, the kernels as they lie),
    for a Llama 3 or Mistral decoder whose sliding window, if any, covers the context. Vicuna
    (LlamaCausalLM) has the same blocks but no engine test yet: it keeps the generic step."""
    import keras_hub

    backbone = lm.backbone
    if type(lm) not in (keras_hub.models.Llama3CausalLM, keras_hub.models.MistralCausalLM) or type(backbone) not in (
        keras_hub.models.Llama3Backbone,
        keras_hub.models.MistralBackbone,
    ):
        return None
    window = getattr(backbone, "sliding_window", None)
    if (window is not None and window < context) or getattr(backbone, "dropout", 0):
        return None
    layout = faster_layout(lm) if relayout else "token-major"
    return InPlaceDecoder(
        functools.partial(llama_forward, layout=layout), functools.partial(llama_weights, layout=layout), layout
    )


def block_kernels(model: Any) -> list[tuple[Any, ...]]:
    """Per block, its seven kernels as keras-hub keeps them, flattened to ``[in, out]``:
    query, key, value, attention output, gate, intermediate, feed-forward output (q/k/v are
    ``[hidden, heads, head_dim]``, the attention output ``[heads, head_dim, hidden]``)."""
    from keras import ops

    hidden = model.backbone.hidden_dim

    def in_out(kernel: Any, inputs: int) -> Any:
        return ops.convert_to_tensor(kernel).reshape(inputs, -1)

    blocks = []
    for block in model.backbone.transformer_layers:
        attention = block._self_attention_layer
        output = attention._output_dense.kernel
        blocks.append(
            (
                in_out(attention._query_dense.kernel, hidden),
                in_out(attention._key_dense.kernel, hidden),
                in_out(attention._value_dense.kernel, hidden),
                in_out(output, output.shape[0] * output.shape[1]),
                in_out(block._feedforward_gate_dense.kernel, hidden),
                in_out(block._feedforward_intermediate_dense.kernel, hidden),
                in_out(block._feedforward_output_dense.kernel, model.backbone.intermediate_dim),
            )
        )
    return blocks


def faster_layout(model: Any, rows: int = TIMED_ROWS, seconds: float = 0.3) -> Layout:
    """The layout whose block projections at ``rows`` rows run faster here (best of repeated
    runs of the products, each layout for about ``seconds``; feature-major only where it is
    ``FEATURE_MAJOR_GAIN`` faster, as it holds a second copy of the kernels), timed once per
    model and row count: every engine of a model runs the same layout, and only the first one
    waits for it.

    Timed on a CPU only, over the first blocks' kernels up to ``TIMED_BYTES`` (all of SmolLM2's:
    more than any cache, as in a step, without copying a large model's weights). An
    accelerator gets token-major, the model's kernels as they lie: XLA chooses its own layouts
    there, and a second copy of the weights would cost its memory.
    """
    import jax
    import numpy as np

    from inference.forward.layout import products_seconds

    if jax.default_backend() != "cpu":
        return "token-major"
    known = _timed_layouts.setdefault(model, {})
    if rows not in known:
        kernels: list[np.ndarray] = []
        for block in block_kernels(model):
            if sum(kernel.nbytes for kernel in kernels) >= TIMED_BYTES:
                break
            kernels += [np.asarray(kernel) for kernel in block]
        token_major = products_seconds(kernels, rows, columns=False, seconds=seconds)
        feature_major = products_seconds(kernels, rows, columns=True, seconds=seconds)
        known[rows] = "feature-major" if feature_major < (1 - FEATURE_MAJOR_GAIN) * token_major else "token-major"
    return known[rows]


def llama_weights(model: Any, layout: Layout) -> tuple[Any, ...]:
    """What the pass multiplies by that the model does not hold as the pass needs it:
    feature-major, every block's seven kernels (``block_kernels``) laid out ``[out, in]``
    (token-major, none: the pass reads the model's own); in both, after them, an untied output
    projection as ``[vocabulary, hidden]`` (a tied embedding, SmolLM2's, is already that)."""
    import jax.numpy as jnp
    from keras import ops

    blocks = []
    if layout == "feature-major":
        blocks = [tuple(jnp.transpose(kernel) for kernel in block) for block in block_kernels(model)]
    embedding = model.backbone.token_embedding
    untied = () if embedding.tie_weights else (jnp.transpose(ops.convert_to_tensor(embedding.reverse_embeddings)),)
    return (*blocks, *untied)


def _rms_norm(layer: Any, x: Any, axis: int) -> Any:
    """keras-hub's ``LlamaLayerNorm`` (and ``MistralLayerNormalization``, the same arithmetic)
    over ``axis`` of ``x``, the hidden axis: float32, mean of squares, rsqrt with the layer's
    epsilon, its scale, cast back. Feature-major, not the layer on ``x.T``: XLA folds such
    transposes into the neighbouring matmuls and picks the other orientation again."""
    import jax
    import jax.numpy as jnp
    from keras import ops

    x = x.astype(jnp.float32)
    variance = jnp.mean(jnp.square(x), axis=axis, keepdims=True)
    scale = ops.convert_to_tensor(layer.scale)
    scale = scale[:, None] if axis == 0 else scale
    return (x * jax.lax.rsqrt(variance + layer.epsilon) * scale).astype(layer.compute_dtype)


def llama_forward(
    model: Any,
    tokens: Any,
    caches: tuple[Any, ...],
    starts: Any,
    weights: tuple[Any, ...],
    layout: Layout,
    adapted: Adapted | None = None,
) -> tuple[Any, tuple[Any, ...]]:
    """``inference.forward.gemma.gemma_forward`` for a Llama 3 or Mistral model.

    ``call_with_cache`` of those families, block by block, with the model's own norm epsilons
    and scales, rotary embedding and kernels (laid out by ``llama_weights`` for ``layout``): per
    block, pre-attention norm, rotary query and key, attention over the cache up to each token's
    position (scaled by 1/sqrt(head_dim), float32 softmax), output projection and residual;
    feed-forward norm, SiLU-gated feed-forward (the activation in float32, as the decoder block
    runs it), residual; final norm, logits. Each layer's keys and values are separate
    arrays in the engine's cache layout (``inference.forward.attention``), written in place.
    ``adapted``: LoRA adapters per row, unmerged (``inference.forward.adapters``; the factors
    of ``block_kernels``'s seven kernels). Traced in jit.
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
    half = head_dim // 2
    query_positions = starts[:, None] + jnp.arange(length)[None, :]  # [rows, T]
    x = token_rows(backbone.token_embedding, tokens, backbone.compute_dtype).reshape(count, -1)  # [tokens, hidden]
    # Every block's rotary layer has the backbone's settings: cos and sin once, by the layer's
    # own computation ([tokens, 1, head_dim]).
    cos, sin = first.rotary_embedding_layer._compute_cos_sin_embedding(
        jnp.zeros((count, 1, head_dim), x.dtype), positions=query_positions.reshape(count, 1)
    )
    cos, sin = cos.reshape(count, 1, head_dim), sin.reshape(count, 1, head_dim)

    if layout == "feature-major":
        x = jnp.transpose(x)  # [hidden, tokens]
        cos, sin = jnp.transpose(cos, (1, 2, 0)), jnp.transpose(sin, (1, 2, 0))  # [1, head_dim, tokens]
        hidden_axis, head_dim_axis = 0, 1

        def project(kernel: Any, activations: Any) -> Any:
            return jnp.dot(kernel, activations)

        def split_heads(projected: Any, count_heads: int) -> Any:  # -> [heads, head_dim, tokens]
            return projected.reshape(count_heads, head_dim, count)

        def heads_last(t: Any) -> Any:  # [heads, head_dim, tokens] -> [rows, T, heads, head_dim]
            return jnp.transpose(t.reshape(t.shape[0], head_dim, rows, length), (2, 3, 0, 1))

        def merge_heads(attended: Any) -> Any:  # [rows, T, heads * head_dim] -> [in, tokens]
            return jnp.transpose(attended.reshape(count, -1))

    else:
        hidden_axis, head_dim_axis = -1, -1

        def project(kernel: Any, activations: Any) -> Any:
            return jnp.dot(activations, kernel)

        def split_heads(projected: Any, count_heads: int) -> Any:  # -> [tokens, heads, head_dim]
            return projected.reshape(count, count_heads, head_dim)

        def heads_last(t: Any) -> Any:
            return t.reshape(rows, length, t.shape[1], head_dim)

        def merge_heads(attended: Any) -> Any:
            return attended.reshape(count, -1)

    def rope(t: Any) -> Any:  # As RotaryEmbedding._apply_rotary_pos_emb, along head_dim.
        first_half, second_half = jnp.split(t, [half], axis=head_dim_axis)
        rotated = jnp.concatenate([-second_half, first_half], axis=head_dim_axis)
        return t * cos + rotated * sin

    kernels = weights[: len(blocks)] if layout == "feature-major" else block_kernels(model)
    updated = []
    for index, block in enumerate(blocks):
        attention = block._self_attention_layer
        query_kernel, key_kernel, value_kernel, output_kernel, gate_kernel, up_kernel, down_kernel = kernels[index]
        keys, values = caches[2 * index], caches[2 * index + 1]
        changes = (None,) * 7 if adapted is None else adapted.factors[index]

        def projected(which: int, kernel: Any, activations: Any, changes: Any = changes) -> Any:
            """The projection by the block's kernel ``which`` (``block_kernels``'s order), with
            each row's adapter's change where it has one."""
            out = project(kernel, activations)
            if changes[which] is None:
                return out
            assert adapted is not None
            delta = row_delta(activations, changes[which], adapted.rows, feature_major=layout == "feature-major")
            return out + delta.astype(out.dtype)

        residual = x
        normalized = _rms_norm(block._self_attention_layernorm, x, hidden_axis)
        query = rope(split_heads(projected(0, query_kernel, normalized), heads))
        key = rope(split_heads(projected(1, key_kernel, normalized), kv_heads))
        value = split_heads(projected(2, value_kernel, normalized), kv_heads)
        keys = write_keys(keys, heads_last(key), starts)
        values = write_values(values, heads_last(value), starts)
        updated += [keys, values]

        attended = grouped_attention(
            heads_last(query), keys, values, query_positions, logit_scale=attention._inv_norm_factor
        )  # [rows, T, heads * head_dim]
        x = projected(3, output_kernel, merge_heads(attended)) + residual

        residual = x
        normalized = _rms_norm(block._feedforward_layernorm, x, hidden_axis)
        gate = ops.cast(
            block.activation(ops.cast(projected(4, gate_kernel, normalized), "float32")), block.compute_dtype
        )
        x = projected(6, down_kernel, projected(5, up_kernel, normalized) * gate) + residual
    x = _rms_norm(backbone.layer_norm, x, hidden_axis)
    embedding = backbone.token_embedding
    output = ops.convert_to_tensor(embedding.embeddings) if embedding.tie_weights else weights[-1]
    # The output projection is [vocabulary, hidden] in both layouts, and multiplied as it lies.
    logits = output_logits(output, jnp.transpose(x) if layout == "feature-major" else x)  # [vocabulary, tokens]
    # Left to itself, XLA folds the transpose below into this product, as ``x.T [tokens,
    # hidden] @ output.T``, which its CPU backend runs through a generic kernel at a quarter of
    # the speed: 30 ms against 8 ms a decode step for SmolLM2's 49152 x 576 embedding at 8 rows
    # (profiled). The barrier keeps the product as written; the transpose then moves only the
    # logits.
    logits = jax.lax.optimization_barrier(logits)
    return jnp.transpose(logits).reshape(rows, length, -1), tuple(updated)
