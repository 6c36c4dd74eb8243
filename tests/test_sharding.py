"""Sharding contestants over all local devices (inference/hosts/sharding.py), on 8 simulated CPU devices.

``XLA_FLAGS=--xla_force_host_platform_device_count=8`` only works if it is set before jax is
imported, and the pytest process may already have jax loaded (other tests generate text). So
the checks run in ONE subprocess, this very module run as ``python -m tests.test_sharding OUT``
(``_worker``): for every family it builds a tiny random model whose sharded dimensions divide
by 8 (hidden 64, 8 query and 8 key/value heads, vocabularies of 1024 or 256), saves it with
``save_to_preset`` so loading goes through the real ``from_preset``, generates greedily
unsharded, loads it again sharded and generates again, and writes what it saw as JSON. The
tests below assert on that JSON, one test per family and check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "tests" / "fixtures" / "presets"
STRONG_PRESET = REPO / "inference" / "presets" / "gemma-calendar"
FAMILIES = ("gemma", "llama3", "mistral", "vicuna")
DEVICES = 8
PROMPT = "Add a meeting with Omar"
MAX_LENGTH = 12  # prompt tokens + a few generated ones: each generate() compiles once (~3 s)
WORKER_TIMEOUT = 240  # seconds; ~50 s on 2 idle cores

# Per family: (path suffix, index of the dimension that must be split on "model").
# Gemma's attention kernels are (heads, hidden, head_dim); Llama/Mistral's q/k/v kernels are
# (hidden, heads, head_dim): the fixed layout splits the heads (dimension 1), not the hidden size.
_GEMMA_SPLITS = {
    "token_embedding/embeddings": 0,
    "attention/query/kernel": 0,
    "attention/key/kernel": 0,
    "attention/value/kernel": 0,
    "attention/attention_output/kernel": 0,
    "ffw_gating/kernel": 1,
    "ffw_gating_2/kernel": 1,
    "ffw_linear/kernel": 0,
}
_LLAMA_SPLITS = {
    "token_embedding/embeddings": 0,
    "token_embedding/reverse_embeddings": 1,
    "self_attention/query/kernel": 1,
    "self_attention/key/kernel": 1,
    "self_attention/value/kernel": 1,
    "self_attention/attention_output/kernel": 0,
    "feedforward_intermediate_dense/kernel": 1,
    "feedforward_gate_dense/kernel": 1,
    "feedforward_output_dense/kernel": 0,
}
EXPECTED_SPLITS = {"gemma": _GEMMA_SPLITS, "llama3": _LLAMA_SPLITS, "mistral": _LLAMA_SPLITS, "vicuna": _LLAMA_SPLITS}


# --- The subprocess side (runs with 8 simulated devices) --------------------------------------


def _tiny_causal_lm(family: str, work: Path) -> Any:
    """A seeded, random 2-layer CausalLM of ``family`` whose sharded dimensions divide by 8."""
    import keras
    import keras_hub

    dims = {"num_layers": 2, "num_query_heads": 8, "num_key_value_heads": 8, "hidden_dim": 64, "dtype": "float32"}
    if family == "gemma":
        tokenizer = keras_hub.models.GemmaTokenizer.from_preset(str(PRESETS / "tiny-gemma"))  # vocab 1024
        preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer=tokenizer, sequence_length=64)
        keras.utils.set_random_seed(1)
        # Gemma's FFN kernels are (hidden, intermediate_dim // 2).
        backbone = keras_hub.models.GemmaBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), intermediate_dim=256, head_dim=8, **dims
        )
        return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=preprocessor)
    if family == "llama3":
        tokenizer = keras_hub.models.Llama3Tokenizer.from_preset(str(PRESETS / "tiny-llama3"))  # vocab 1024
        preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(tokenizer=tokenizer, sequence_length=64)
        keras.utils.set_random_seed(2)
        backbone = keras_hub.models.Llama3Backbone(
            vocabulary_size=tokenizer.vocabulary_size(), intermediate_dim=128, **dims
        )
        return keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=preprocessor)
    proto = _llama_sentencepiece(work)  # Mistral and Llama 2 (Vicuna) tokenizers want <s> and </s>.
    keras.utils.set_random_seed(3 if family == "mistral" else 4)
    if family == "mistral":
        tokenizer = keras_hub.models.MistralTokenizer(proto=proto)
        preprocessor = keras_hub.models.MistralCausalLMPreprocessor(tokenizer=tokenizer, sequence_length=64)
        backbone = keras_hub.models.MistralBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), intermediate_dim=128, **dims
        )
        return keras_hub.models.MistralCausalLM(backbone=backbone, preprocessor=preprocessor)
    tokenizer = keras_hub.models.LlamaTokenizer(proto=proto)
    preprocessor = keras_hub.models.LlamaCausalLMPreprocessor(tokenizer=tokenizer, sequence_length=64)
    backbone = keras_hub.models.LlamaBackbone(vocabulary_size=tokenizer.vocabulary_size(), intermediate_dim=128, **dims)
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=preprocessor)


def _llama_sentencepiece(work: Path) -> str:
    """A 256-piece SentencePiece model with Llama's ids (<unk> 0, <s> 1, </s> 2), trained once."""
    path = work / "llama.spm"
    if not path.exists():
        import sentencepiece

        from inference.building.demo_models import calendar_corpus

        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(calendar_corpus("mistral", seed=0, size=200)),
            model_prefix=str(path.with_suffix("")),
            vocab_size=256,  # a multiple of 8: the vocabulary is split on the model axis
            model_type="bpe",
            character_coverage=1.0,
            num_threads=1,
            minloglevel=2,
        )
        path.with_suffix(".model").rename(path)
    return str(path)


def _generate(lm: Any) -> str:
    lm.compile(sampler="greedy")
    return str(lm.generate(PROMPT, max_length=MAX_LENGTH))


def _check_family(family: str, work: Path) -> dict[str, Any]:
    preset = work / family
    _tiny_causal_lm(family, work).save_to_preset(str(preset))
    return _check_preset(preset, family)


def _check_preset(preset: Path, family: str) -> dict[str, Any]:
    import keras_hub

    from inference.hosts import sharding

    started = time.monotonic()
    reference = _generate(keras_hub.models.CausalLM.from_preset(str(preset)))  # unsharded, device 0
    lm = sharding.load_sharded_causal_lm(str(preset), family=family)
    variables = {
        variable.path: variable
        for variable in [*lm.backbone.get_layer("token_embedding").weights, *sharding.first_block(lm).weights]
    }
    rows = []
    for path, shape, spec in sharding.describe_block_shardings(lm):
        value = variables[path].value
        rows.append(
            {
                "path": path,
                "shape": list(shape),
                "spec": spec,
                "axes": [list(a) if isinstance(a, tuple) else a for a in value.sharding.spec],
                "shard_shape": list(value.addressable_shards[0].data.shape),
                "devices": len(value.sharding.device_set),
            }
        )
    return {
        "backbone": type(lm.backbone).__name__,
        "rows": rows,
        "reference": reference,
        "sharded": _generate(lm),
        "seconds": round(time.monotonic() - started, 1),
    }


def _capture(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"ok": True, **check()}
    except Exception as error:
        return {"ok": False, "type": type(error).__name__, "message": str(error), "traceback": traceback.format_exc()}


def _worker(out: Path) -> None:
    import keras

    from inference.hosts import sharding

    results: dict[str, Any] = {}

    def mesh() -> dict[str, Any]:
        default = sharding.mesh_for()
        return {
            "devices": len(keras.distribution.list_devices()),
            "shape": list(default.shape),
            "axis_names": list(default.axis_names),
        }

    results["mesh"] = _capture(mesh)
    results["mesh_1x3"] = _capture(lambda: {"mesh": str(sharding.mesh_for((1, 3)))})
    # The bundled demo preset has 4 query heads and 1 key/value head: they can't split 8 ways.
    results["tiny_gemma_8"] = _capture(
        lambda: {"lm": str(sharding.load_sharded_causal_lm(str(PRESETS / "tiny-gemma"), family="gemma"))}
    )
    results["wrong_family"] = _capture(
        lambda: {"lm": str(sharding.load_sharded_causal_lm(str(PRESETS / "tiny-llama3"), family="gemma"))}
    )
    for family in FAMILIES:
        results[family] = _capture(lambda family=family: _check_family(family, out))
    # The strong demo model: 8 query heads and one shared key/value head (multi-query).
    results["strong_gemma"] = _capture(lambda: _check_preset(STRONG_PRESET, "gemma"))
    (out / "results.json").write_text(json.dumps(results, indent=1))


# --- The pytest side ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("sharding")
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}",
        "KERAS_BACKEND": "jax",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": str(REPO),
    }
    completed = subprocess.run(
        [sys.executable, "-m", "tests.test_sharding", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=WORKER_TIMEOUT,
        check=False,
    )
    assert completed.returncode == 0, f"sharding worker failed:\n{completed.stdout[-4000:]}\n{completed.stderr[-8000:]}"
    return json.loads((out / "results.json").read_text())


def _ok(results: dict[str, Any], key: str) -> dict[str, Any]:
    result = results[key]
    assert result["ok"], f"{key}: {result['type']}: {result['message']}\n{result['traceback']}"
    return result


def test_mesh_spans_all_devices_on_the_model_axis(results: dict[str, Any]) -> None:
    mesh = _ok(results, "mesh")
    assert mesh["devices"] == DEVICES
    assert mesh["axis_names"] == ["batch", "model"]
    assert mesh["shape"] == [1, DEVICES]


def test_mesh_that_does_not_cover_the_devices_is_refused(results: dict[str, Any]) -> None:
    result = results["mesh_1x3"]
    assert not result["ok"] and result["type"] == "ShardingError"
    assert "(1, 3)" in result["message"] and "8 local devices" in result["message"]


def test_indivisible_heads_fail_with_a_named_dimension(results: dict[str, Any]) -> None:
    result = results["tiny_gemma_8"]
    assert not result["ok"] and result["type"] == "ShardingError", result
    message = result["message"]
    assert "num_query_heads (4) is not divisible by 8" in message, message
    assert "decoder_block_0/attention/query/kernel" in message


def test_preset_of_another_family_is_refused_before_loading(results: dict[str, Any]) -> None:
    result = results["wrong_family"]
    assert not result["ok"] and result["type"] == "ShardingError", result
    assert "Llama3Backbone" in result["message"] and "GemmaBackbone" in result["message"]


@pytest.mark.parametrize("family", FAMILIES)
def test_weights_are_split_across_the_model_axis(results: dict[str, Any], family: str) -> None:
    result = _ok(results, family)
    rows = {row["path"]: row for row in result["rows"]}
    expected = EXPECTED_SPLITS[family]
    for suffix, dim in expected.items():
        matches = [row for path, row in rows.items() if path.endswith(suffix)]
        assert len(matches) == 1, f"{family}: no single variable ending in {suffix}: {sorted(rows)}"
        row = matches[0]
        assert "model" in row["spec"], row
        assert row["axes"][dim] == "model", f"{family}: {row['path']} splits {row['axes']}, expected dim {dim}"
        assert row["devices"] == DEVICES
        # Each device holds 1/8 of the split dimension and all of the others (batch axis is 1).
        want = [size // DEVICES if i == dim else size for i, size in enumerate(row["shape"])]
        assert row["shard_shape"] == want, row
    # Norm scales are small: replicated.
    for path, row in rows.items():
        if path.endswith("/scale"):
            assert row["shard_shape"] == row["shape"], row


@pytest.mark.parametrize("family", FAMILIES)
def test_sharded_greedy_generation_matches_unsharded(results: dict[str, Any], family: str) -> None:
    result = _ok(results, family)
    assert result["sharded"].startswith(PROMPT)
    assert len(result["sharded"]) > len(PROMPT)
    assert result["sharded"] == result["reference"]


def test_a_shared_key_value_head_stays_whole_on_every_device(results: dict[str, Any]) -> None:
    result = _ok(results, "strong_gemma")
    rows = {row["path"].split("/", 1)[-1]: row for row in result["rows"]}
    query, key, value = (rows[f"attention/{name}/kernel"] for name in ("query", "key", "value"))
    assert key["shape"][0] == value["shape"][0] == 1  # One key/value head...
    assert key["shard_shape"] == key["shape"] and value["shard_shape"] == value["shape"]  # ...on every device,
    assert key["devices"] == value["devices"] == DEVICES
    assert query["shard_shape"][0] == query["shape"][0] // DEVICES  # while the query heads are split.
    assert result["sharded"] == result["reference"]


def test_single_device_load_is_a_plain_from_preset() -> None:
    """In this process (no XLA_FLAGS): one CPU device, so no distribution is involved."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax

    from inference.hosts import sharding

    if jax.device_count() != 1:
        pytest.skip("the test process sees several devices")
    lm = sharding.load_sharded_causal_lm(str(PRESETS / "tiny-gemma"), family="gemma")
    rows = sharding.describe_block_shardings(lm)
    assert rows[0][0] == "token_embedding/embeddings"
    assert any(path.startswith("decoder_block_0/") for path, _, _ in rows)
    assert not any(path.startswith("decoder_block_1/") for path, _, _ in rows)
    assert all("SingleDeviceSharding" in spec for _, _, spec in rows)


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
