"""What one sampling step costs: the engine's draw of every slot's next token
(``inference.engine.sampling.sample_tokens``) at given sampling settings, on a model's own
next-token logits for calendar prompts, looking among the most likely candidates first (as the
engine does) against sorting the whole vocabulary every step, and greedy decoding, timed in one
process. No Django (``bench_engine --sampling`` runs it)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np

from inference.engine.sampling import SAMPLING_CANDIDATES, sample_tokens
from inference.forward.layout import best_seconds


def next_token_logits(lm: Any, prompts: list[str]) -> np.ndarray:
    """The model's logits for the token after each prompt, float32 [prompts, vocabulary]: its
    backbone over the prompt's tokens, the last position through the output embedding."""
    from keras import ops

    from inference.streaming import encode_prompt

    rows = []
    for prompt in prompts:
        ids = np.asarray([encode_prompt(lm, prompt)], np.int32)
        hidden = lm.backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
        logits = lm.backbone.token_embedding(hidden[:, -1:, :], reverse=True)
        rows.append(ops.convert_to_numpy(logits)[0, 0].astype(np.float32))
    return np.stack(rows)


def kept_tokens(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> list[int]:
    """How many tokens each row's draw chooses among (top-k, then top-p)."""
    counts = []
    for row in np.asarray(logits, np.float64) / temperature:
        descending = np.sort(row)[::-1]
        if 0 < top_k < descending.size:
            descending = descending[:top_k]
        probabilities = np.exp(descending - descending[0])
        probabilities /= probabilities.sum()
        before = np.cumsum(probabilities) - probabilities
        counts.append(int(np.sum((before < top_p) | (top_p >= 1.0))))
    return counts


def sampling_step(
    lm: Any, prompts: list[str], *, temperature: float, top_k: int, top_p: float, seconds: float = 1.0
) -> dict[str, Any]:
    """Milliseconds of one draw of every row's next token (best of repeated runs, each way for
    about ``seconds``): among ``SAMPLING_CANDIDATES`` first, by sorting the whole vocabulary,
    and greedy; with how many tokens the rows' draws choose among."""
    import jax
    import keras_hub

    logits = next_token_logits(lm, prompts)
    rows, vocabulary = logits.shape
    keys = np.stack([np.zeros(rows, np.uint32), np.arange(rows, dtype=np.uint32)], axis=1)
    sampler = keras_hub.samplers.GreedySampler()

    def step_ms(temperature: float, candidates: tuple[int, ...]) -> float:
        settings = (
            np.full(rows, temperature, np.float32),
            np.full(rows, top_k, np.int32),
            np.full(rows, top_p, np.float32),
        )
        draw = jax.jit(lambda logits, keys: sample_tokens(logits, *settings, keys, sampler, candidates))
        return 1000 * best_seconds(lambda: jax.block_until_ready(draw(logits, keys)), seconds)

    candidates_ms = step_ms(temperature, tuple(SAMPLING_CANDIDATES))
    sorted_ms = step_ms(temperature, ())
    kept = kept_tokens(logits, temperature, top_k, top_p)
    return {
        "rows": rows,
        "vocabulary": vocabulary,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "candidates": list(SAMPLING_CANDIDATES),
        "kept_tokens_median": statistics.median(kept),
        "kept_tokens_max": max(kept),
        "candidates_ms": candidates_ms,
        "sorted_ms": sorted_ms,
        "greedy_ms": step_ms(0.0, tuple(SAMPLING_CANDIDATES)),
        "sorted_over_candidates": sorted_ms / candidates_ms,
    }


def format_sampling(preset: Path, result: dict[str, Any]) -> str:
    return (
        f"{preset.name}: a sampling step of {result['rows']} rows over {result['vocabulary']:,} tokens "
        f"(temperature {result['temperature']}, top-k {result['top_k']}, top-p {result['top_p']}; the draws "
        f"chose among {result['kept_tokens_median']:g} tokens, median, {result['kept_tokens_max']} at most): "
        f"{result['candidates_ms']:.1f} ms among the {' then '.join(map(str, result['candidates']))} most "
        f"likely, {result['sorted_ms']:.1f} ms sorting the whole vocabulary "
        f"({result['sorted_over_candidates']:.1f}x), greedy {result['greedy_ms']:.1f} ms"
    )
