"""Token embeddings kept in a narrower dtype than the model computes in. No Django.

A small model's embedding is most of its weights (Gemma 3 270M: 262,144 entries x 640, 671 MB
of its 1.07 GB in float32; SmolLM2-135M: 113 MB of 538), and a decode step reads all of it for
the logits (tied: the same matrix). Kept in bfloat16 it holds half the memory; the lookup casts
the rows it takes to the compute dtype (keras's ``Embedding``). bfloat16 keeps float32's
range, and its 8-bit mantissa is finer than the imported checkpoints' own precision (their GGUF
files hold 4-bit quantised weights with 16-bit scales). The logits are then summed in float32
from the hidden states rounded to bfloat16 (``inference.forward.embedding``), which XLA runs at the
narrow matrix's memory speed on a CPU: Gemma 3's logits at 8 rows took 16 ms against 53 ms in
float32 (scratch timing, this project's Intel Xeon).
"""

from __future__ import annotations

from typing import Any


def embedding_variables(lm: Any) -> list[Any]:
    """The backbone's token embedding variables: the embedding, and an untied output projection
    where the model has one (``reverse_embeddings``)."""
    layer = lm.backbone.token_embedding
    names = ("embeddings", "reverse_embeddings")
    return [variable for name in names if (variable := getattr(layer, name, None)) is not None]


def narrow_embeddings(lm: Any, dtype: str) -> int:
    """Keep ``lm``'s token embedding variables in ``dtype`` (e.g. "bfloat16") where they are
    wider; the bytes this spares. The variables' dtype is theirs from then on (the engine's
    programs take them as they are), their values rounded once. Call it right after loading,
    before anything else holds the wider arrays (``share_weights``, an engine)."""
    import jax.numpy as jnp

    narrow = jnp.dtype(dtype)
    spared = 0
    for variable in embedding_variables(lm):
        value = variable.value
        if jnp.dtype(value.dtype).itemsize <= narrow.itemsize:
            continue
        # Keras fixes a variable's dtype when it is made; no public call changes it. The JAX
        # backend's variable holds its dtype and its array, both set here together.
        narrowed = value.astype(narrow)
        variable._dtype = narrow.name
        variable._direct_assign(narrowed)
        spared += value.nbytes - narrowed.nbytes
    return spared
