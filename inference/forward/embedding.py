"""The token embedding in the families' passes: looking tokens up, and the logits of the last
hidden states (the output projection, the embedding itself where tied). An embedding kept
narrower than the model computes (bfloat16: ``inference.engine.stored_dtype``) needs both done
with care on a CPU, where XLA widens what its CPU backend has no bfloat16 kernel for: the whole
table, at every dispatch, for a plain lookup. Plain JAX and the layer's own arithmetic."""

from __future__ import annotations

from typing import Any


def token_rows(layer: Any, tokens: Any, dtype: Any) -> Any:
    """``layer``'s embedding rows of ``tokens`` (any shape), in ``dtype`` (the model's compute
    dtype): the layer's own lookup (keras's ``Embedding``). A narrower table is looked up as its bits
    (16-bit integers, which XLA's CPU backend gathers as they are) and only the rows widened:
    gathered as bfloat16, XLA widened Gemma 3's whole 671 MB table at every dispatch first
    (its decode step of 8 slots: 317 ms against 151 ms with a float32 table, scratch timing)."""
    import jax
    import jax.numpy as jnp
    from keras import ops

    table = ops.convert_to_tensor(layer.embeddings)
    if table.dtype == jnp.dtype(dtype) or table.dtype.itemsize != 2:
        return ops.cast(layer(tokens), dtype)  # The layer's own lookup.
    bits = jnp.take(jax.lax.bitcast_convert_type(table, jnp.uint16), tokens, axis=0)
    return jax.lax.bitcast_convert_type(bits, table.dtype).astype(dtype)


def output_logits(output: Any, hidden: Any) -> Any:
    """``output [vocabulary, width] @ hidden.T`` for ``hidden [tokens, width]``: the logits
    ``[vocabulary, tokens]``, in the hidden states' dtype.

    An output matrix kept narrower than the model computes (a token embedding in bfloat16:
    ``inference.engine.stored_dtype``) is multiplied as it lies, by the hidden states rounded to
    its dtype, the products summed in theirs (float32). On a CPU XLA runs that product at the
    narrow matrix's memory speed: Gemma 3's logits at 8 rows took 16 ms, against 53 ms from a
    float32 matrix, and 210 ms from the narrow matrix times float32 rows (XLA then widens it
    first). One row alone takes a slower kernel (210 ms), so it is multiplied as two (scratch
    timings, this project's Intel Xeon).
    """
    import jax
    import jax.numpy as jnp

    if output.dtype == hidden.dtype:
        return jnp.dot(output, jnp.transpose(hidden))
    rows = hidden.shape[0]
    narrow = hidden.astype(output.dtype)
    if rows == 1:
        narrow = jnp.concatenate([narrow, narrow])
    contract_width = (((1,), (1,)), ((), ()))
    logits = jax.lax.dot_general(output, narrow, contract_width, preferred_element_type=hidden.dtype)
    return logits[:, :rows]
