"""Perplexity of a causal LM on a text: the check that an imported checkpoint is the model."""

from __future__ import annotations

from typing import Any

import numpy as np


def perplexity(lm: Any, text: str) -> float:
    """exp(mean negative log-likelihood) of ``text``'s tokens, each given the ones before it.

    The text is tokenized as the model's preprocessor would (its start token first where it adds
    one) and scored in one forward pass of the backbone, in float64 on the host.
    """
    preprocessor = lm.preprocessor
    tokenizer = preprocessor.tokenizer
    ids = [int(i) for i in np.asarray(tokenizer(text)).reshape(-1)]
    if preprocessor.add_start_token and getattr(tokenizer, "start_token_id", None) is not None:
        ids.insert(0, int(tokenizer.start_token_id))
    if len(ids) < 2:
        raise ValueError("Perplexity needs a text of at least two tokens.")
    tokens = np.asarray([ids], dtype=np.int32)
    hidden = lm.backbone({"token_ids": tokens, "padding_mask": np.ones_like(tokens)})
    logits = np.asarray(lm.backbone.token_embedding(hidden, reverse=True), dtype=np.float64)[0, :-1]
    logits -= logits.max(axis=-1, keepdims=True)
    log_probabilities = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    targets = np.asarray(ids[1:])
    return float(np.exp(-log_probabilities[np.arange(len(targets)), targets].mean()))
