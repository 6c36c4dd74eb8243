"""The fine-tuned fixer (inference.building.fixer): its data, its loss mask, its preset built from
the committed LoRA weights, and that it fixes more held-out mistakes than its base model.

The full training and its measured rates are ``manage.py finetune_fixer`` (a 25-minute run, not a
test); its report is committed beside the weights (inference/fixer/*.report.json).
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from django.core.management import CommandError, call_command

from inference.building import dialog_data, fixer
from inference.forward import llama
from inference.forward.adapters import load_factors
from inference.hosts.engines import ADAPTER_FACTORS
from inference.management.commands.finetune_fixer import DEFAULT_WEIGHTS

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword")


def test_rate_reads_as_share_interval_and_counts() -> None:
    assert str(fixer.Rate(79, 100)) == "79% [70%, 86%] (79/100)"


def test_the_loss_counts_the_assistants_fixes_only(smollm2_preset: Path) -> None:
    lm = fixer.load_base(smollm2_preset)
    tokenizer = lm.preprocessor.tokenizer
    dialogs = dialog_data.training_dialogs(0, 200, fixer.RECIPE)
    example = next(e for e in dialogs if not all(e.trained) and len(e.turns) > 6)  # Mistakes amid a dialog.
    fixer.check_encoding(lm, example)  # Segment-wise ids are the whole conversation's ids.
    encoded = fixer.encode(lm, example)
    assert encoded.ids[0] == tokenizer.token_to_id("<|im_start|>")  # SmolLM2: no start token added.
    trained = [i for i, w in zip(encoded.ids, encoded.weights, strict=True) if w]
    replies = [t.content for t in example.turns if t.role == "assistant"]
    kept = [reply for reply, flag in zip(replies, example.trained, strict=True) if flag]
    assert tokenizer.detokenize(np.asarray(trained)) == "".join(f"{reply}<|im_end|>" for reply in kept)
    mistaken = next(reply for reply, flag in zip(replies, example.trained, strict=True) if not flag)
    assert mistaken not in tokenizer.detokenize(np.asarray(trained))


def test_lora_goes_to_the_named_kernels_of_the_upper_blocks_only(smollm2_preset: Path) -> None:
    lm = fixer.load_base(smollm2_preset)
    fixer.enable_fixer_lora(lm.backbone, fixer.DEFAULT_FIXER)
    blocks = lm.backbone.transformer_layers
    enabled = [
        (index, layer.name)
        for index, block in enumerate(blocks)
        for layer in block._flatten_layers()
        if getattr(layer, "lora_enabled", False)
    ]
    expected_blocks = range(fixer.DEFAULT_FIXER.first_block, len(blocks))
    assert sorted(enabled) == sorted((i, name) for i in expected_blocks for name in fixer.DEFAULT_FIXER.layer_names)
    # Only the LoRA factors train: two per enabled kernel.
    assert len(lm.trainable_variables) == 2 * len(enabled)
    assert len(lm.backbone._lora_enabled_layers) == len(enabled)  # Where save/load_lora_weights look.


def test_the_fixer_preset_is_the_base_with_the_committed_lora_merged(smollm2_preset: Path, fixer_preset: Path) -> None:
    assert DEFAULT_WEIGHTS.stat().st_size < 8_000_000  # Small and committed: the LoRA factors only.
    metadata = json.loads((fixer_preset / "metadata.json").read_text())["fix_arena"]
    assert metadata["template"] == "chatml" and metadata["base"] is False
    assert metadata["fine_tuned"]["lora_weights"] == DEFAULT_WEIGHTS.name
    assert metadata["fine_tuned"]["about"] == fixer.DEFAULT_FIXER.about
    base, tuned = fixer.load_base(smollm2_preset), fixer.load_base(fixer_preset)

    def kernels(lm: Any, index: int) -> dict[str, np.ndarray]:
        block = lm.backbone.transformer_layers[index]
        return {layer.name: np.asarray(layer.kernel) for layer in block._flatten_layers() if hasattr(layer, "kernel")}

    first, names = fixer.DEFAULT_FIXER.first_block, fixer.DEFAULT_FIXER.layer_names
    for index, lora in ((0, ()), (first - 1, ()), (first, names)):
        before, after = kernels(base, index), kernels(tuned, index)
        assert "key" in before and set(lora) < set(before)
        for name in before:
            assert (not np.array_equal(before[name], after[name])) == (name in lora), (index, name)
    merged = tuned.backbone.transformer_layers[fixer.DEFAULT_FIXER.first_block]._self_attention_layer._query_dense
    assert not getattr(merged, "lora_enabled", False)  # Merged into the kernel, served as the base is.
    # Beside it, the factors of its change, which a host serving it as its base's adapter reads
    # instead of the whole model: those of the merged kernels less the base's.
    assert metadata["fine_tuned"]["adapter_factors"] == ADAPTER_FACTORS
    shapes = [[tuple(kernel.shape) for kernel in block] for block in llama.block_kernels(base)]
    saved = load_factors(fixer_preset / ADAPTER_FACTORS, shapes)
    for block, (mine, theirs, changes) in enumerate(
        zip(llama.block_kernels(tuned), llama.block_kernels(base), saved, strict=True)
    ):
        assert (changes[0] is not None) == (block >= first)  # The query kernel, from the first tuned block.
        for tuned_kernel, base_kernel, pair in zip(mine, theirs, changes, strict=True):
            change = np.asarray(tuned_kernel) - np.asarray(base_kernel)
            if pair is None:
                assert not change.any()
            else:
                np.testing.assert_allclose(pair[0] @ pair[1], change, atol=1e-5)


def test_the_fixer_is_rebuilt_only_when_its_weights_change(
    smollm2_preset: Path, fixer_preset: Path, tmp_path: Path
) -> None:
    assert fixer.is_built_from(fixer_preset, smollm2_preset, DEFAULT_WEIGHTS)
    changed = tmp_path / "changed.lora.h5"
    changed.write_bytes(DEFAULT_WEIGHTS.read_bytes() + b"\0")
    assert not fixer.is_built_from(fixer_preset, smollm2_preset, changed)
    assert not fixer.is_built_from(tmp_path / "missing", smollm2_preset, DEFAULT_WEIGHTS)
    reimported = tmp_path / "reimported"  # The base imported again, with another context.
    reimported.mkdir()
    metadata = json.loads((smollm2_preset / "metadata.json").read_text())
    metadata["fix_arena"]["imported"]["context"] = 4096
    (reimported / "metadata.json").write_text(json.dumps(metadata))
    assert not fixer.is_built_from(fixer_preset, reimported, DEFAULT_WEIGHTS)
    earlier = tmp_path / "earlier"  # Built before the factors were saved beside the preset.
    shutil.copytree(fixer_preset, earlier)
    metadata = json.loads((earlier / "metadata.json").read_text())
    del metadata["fix_arena"]["fine_tuned"]["adapter_factors"]
    (earlier / "metadata.json").write_text(json.dumps(metadata))
    assert not fixer.is_built_from(earlier, smollm2_preset, DEFAULT_WEIGHTS)
    out = io.StringIO()
    options = (
        "--model",
        fixer.DEFAULT_FIXER.name,
        "--base",
        str(smollm2_preset),
        "--out",
        str(fixer_preset),
        "--if-stale",
    )
    call_command("build_fixer_preset", *options, stdout=out)
    assert "is up to date" in out.getvalue()


def test_contestants_are_built_one_by_one_or_all_together(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="give --model too"):
        call_command("build_fixer_preset", "--base", str(tmp_path))
    with pytest.raises(CommandError, match="is not a preset"):
        call_command("build_fixer_preset", "--model", fixer.DEFAULT_FIXER.name, "--base", str(tmp_path))
    assert {spec.weights.parent for spec in fixer.FIXERS.values()} == {DEFAULT_WEIGHTS.parent}
    assert {spec.family for spec in fixer.FIXERS.values()} == {"chatml", "gemma"}  # Gemma 3 learns Gemma's turns.


def test_the_fixer_fixes_more_held_out_mistakes_than_its_base(smollm2_preset: Path, fixer_preset: Path) -> None:
    # Never trained on: held-out names, dates and templates; eight mistakes, each corrected three ways.
    items = dialog_data.held_out_corrections(seed=1, count=8)

    def fixed(preset: Path) -> int:
        replies = fixer.engine_replies(fixer.load_base(preset), items)
        verdicts = [dialog_data.judge(reply, item.expected).verdict for reply, item in zip(replies, items, strict=True)]
        return verdicts.count("correct")

    base, tuned = fixed(smollm2_preset), fixed(fixer_preset)
    assert tuned > base, (base, tuned)
    assert tuned >= len(items) // 3, tuned  # The fixer fixes 53-77% of held-out mistakes, its base 7-11%.


def test_gemma3_training_forward_pass_with_shared_prefix_equals_full_forward() -> None:
    """Gemma 3's cache is per layer and its cache functions take image inputs: the trainer's
    shared-prefix pass (``forward_after_prefix``) gives it the same hidden states as a full
    forward pass over whole rows, sliding-window layers included."""
    import keras
    import keras_hub

    from inference.building.demo_models import forward_after_prefix

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=64, image_size=None, num_layers=3, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=32, intermediate_dim=64, head_dim=16, sliding_window_size=12, vision_encoder=None,
    )  # fmt: skip
    lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)
    rng = np.random.default_rng(0)
    prefix = rng.integers(1, 64, size=(1, 9)).astype("int32")
    rest = rng.integers(1, 64, size=(2, 11)).astype("int32")
    full = np.concatenate([np.repeat(prefix, 2, axis=0), rest], axis=1)
    reference = lm({"token_ids": full, "padding_mask": np.ones_like(full, dtype=bool)})
    hidden = forward_after_prefix(lm, prefix, rest)
    logits = lm.backbone.token_embedding(hidden, reverse=True)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference)[:, prefix.shape[1] :], atol=1e-4)
