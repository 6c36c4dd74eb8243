"""Token embeddings kept in bfloat16 (inference/engine/stored_dtype.py, the embedded arena's
``ARENA_ENGINE_EMBEDDING_DTYPE``): half their memory, the engine's greedy text that of
keras-hub's generate() on the same narrowed model, for a tied embedding (tiny-gemma) and an
untied output projection (tiny-llama3), Gemma 3 on a model host; the host narrowing them only
where the family's pass runs them faster (Gemma 3's), before it shares equal weights between
models; and the logits from a narrow output matrix."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras_hub
import pytest

import inference.tokenizers  # noqa: F401  (the tiny presets' tokenizer class)
from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from inference.engine import Engine
from inference.engine.stored_dtype import embedding_variables, narrow_embeddings
from inference.hosts import engines
from inference.registry import read_preset
from inference.streaming import encode_prompt
from tests.conftest import BATTLE_PRESETS, PRESETS_DIR

REQUESTS = ("Add a meeting with Fred on Nov 11 at 5PM", "Cancel the meeting with Fred.")
NEW_TOKENS = 24


@pytest.fixture(scope="module", params=BATTLE_PRESETS)
def narrowed(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str, int]]:
    """A tiny preset's model with its embeddings narrowed: (model, family, bytes spared)."""
    path = PRESETS_DIR / request.param
    lm = keras_hub.models.CausalLM.from_preset(str(path))
    lm.compile(sampler="greedy")
    wide = sum(variable.value.nbytes for variable in embedding_variables(lm))
    assert {str(variable.dtype) for variable in embedding_variables(lm)} == {"float32"}
    spared = narrow_embeddings(lm, "bfloat16")
    assert spared == wide // 2
    yield lm, read_preset(path).family, spared


def test_the_embeddings_are_kept_in_bfloat16_and_hold_half(narrowed: tuple[Any, str, int]) -> None:
    lm, _, spared = narrowed
    variables = embedding_variables(lm)
    tied = lm.backbone.token_embedding.tie_weights
    assert len(variables) == (1 if tied else 2)  # Untied: the output projection too.
    for variable in variables:
        assert str(variable.dtype) == "bfloat16" and str(variable.value.dtype) == "bfloat16"
    # The model's own weights list holds them narrowed; every other variable is as it was.
    assert {str(v.dtype) for v in lm.weights if any(v is mine for mine in variables)} == {"bfloat16"}
    assert {str(v.dtype) for v in lm.weights if not any(v is mine for mine in variables)} == {"float32"}
    assert narrow_embeddings(lm, "bfloat16") == 0  # Already narrow: nothing more to spare.
    assert narrow_embeddings(lm, "float32") == 0  # Never widened.
    assert spared > 0


def generate_reply(lm: Any, family: str, prompt: str) -> str:
    """keras-hub generate()'s greedy reply to ``prompt`` (NEW_TOKENS at most), cut where the
    engine stops."""
    stops = stop_strings(family)
    tokenizer = lm.preprocessor.tokenizer
    stop_ids = tuple(sorted({tokenizer.token_to_id(s) for s in stops} | {tokenizer.end_token_id}))
    start = tokenizer.start_token if lm.preprocessor.add_start_token else ""
    length = len(encode_prompt(lm, prompt)) + NEW_TOKENS
    text = lm.generate(prompt.removeprefix(start), max_length=length, stop_token_ids=stop_ids, strip_prompt=True)
    for stop in stops:
        text = text.removesuffix(stop)
    return text


def test_the_engine_writes_what_generate_writes_with_them(narrowed: tuple[Any, str, int]) -> None:
    lm, family, _ = narrowed
    with Engine(lm, slots=2, buckets=(128,), windows=(128,)) as engine:
        for request in REQUESTS:
            prompt = render_prompt(family, None, [ChatTurn("user", request)])
            served = engine.submit(prompt, max_new_tokens=NEW_TOKENS, stop_strings=stop_strings(family)).result()
            assert served == generate_reply(lm, family, prompt)


def test_a_host_narrows_gemma3_before_it_shares_equal_weights(gemma3_preset: Path) -> None:
    """Two models of the real Gemma 3 preset with ``embedding_dtype`` set: each engine's model
    keeps its embedding in bfloat16, the second holding the first's narrowed array (the host
    narrows right after loading, then shares), and writes generate()'s greedy text of it. A
    family whose pass is not faster so (tiny-gemma's, Gemma's) keeps its own."""
    family = read_preset(gemma3_preset).family  # Its chat template's.
    specs = [
        engines.ModelSpec(name, family, str(gemma3_preset), slots=1, embedding_dtype="bfloat16")
        for name in ("narrow-one", "narrow-two")
    ]
    tiny = str(PRESETS_DIR / "tiny-gemma")
    wide = engines.ModelSpec("narrow-not", "gemma", tiny, slots=1, embedding_dtype="bfloat16")
    try:
        first, second = (engines.engine_for(spec) for spec in specs)
        tables = [engine.lm.backbone.token_embedding.embeddings for engine in (first, second)]
        assert str(tables[0].dtype) == str(tables[1].dtype) == "bfloat16"
        assert tables[0].value is tables[1].value
        prompt = render_prompt(family, None, [ChatTurn("user", REQUESTS[0])])
        served = first.submit(prompt, max_new_tokens=NEW_TOKENS, stop_strings=stop_strings(family)).result()
        first.lm.compile(sampler="greedy")
        assert served == generate_reply(first.lm, family, prompt)
        assert str(engines.engine_for(wide).lm.backbone.token_embedding.embeddings.dtype) == "float32"
    finally:
        engines.shutdown_where(lambda spec: spec.name.startswith("narrow-"))


@pytest.mark.parametrize("rows", [1, 8])
def test_logits_from_a_narrow_output_matrix_are_the_wide_ones_within_its_rounding(rows: int) -> None:
    """``inference.forward.embedding.output_logits``: from a bfloat16 matrix (one row multiplied as
    two), the float32 matrix's logits within bfloat16's rounding, in float32; a matrix of the
    hidden states' own dtype multiplied as before."""
    import jax.numpy as jnp
    import numpy as np

    from inference.forward.embedding import output_logits

    rng = np.random.default_rng(rows)
    output = jnp.asarray(rng.standard_normal((4096, 64), dtype=np.float32) * 0.05)
    hidden = jnp.asarray(rng.standard_normal((rows, 64), dtype=np.float32))
    wide = output_logits(output, hidden)
    np.testing.assert_array_equal(np.asarray(wide), np.asarray(jnp.dot(output, hidden.T)))
    narrow = output_logits(output.astype(jnp.bfloat16), hidden)
    assert narrow.shape == (4096, rows) and narrow.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(narrow), np.asarray(wide), atol=0.02 * float(jnp.abs(wide).max()))
