"""The fine-tuned fixer: SmolLM2-135M-Instruct taught, with LoRA, to write the calendar API
calls and to fix a reply when the user points out its mistake (``manage.py finetune_fixer``).

The data is the project's synthetic calendar data (``inference.building.calendar_data``): first requests
and dialogs in which an earlier reply carries a realistic mistake, the user says so in one
short sentence from the scenario's list, and the next reply fixes it. The loss counts the
assistant's tokens only, and never those of the mistaken replies (the model learns the fix,
not the mistake). Only the LoRA factors are trained (keras-hub's LoRA layers, on the query and
value projections and the feed-forward of the upper blocks: ``enable_fixer_lora``) and saved
(``save_lora_weights``): a small file committed in ``inference/fixer``; the fixer's
preset is the base import with those factors merged into its kernels, built at set-up
(``build_fixer_preset``).

Evaluation (``evaluate_fixing``) runs held-out items through the continuous-batching engine,
greedy, as the arena serves a model: the first-try exact rate (held-out first requests) and the
fix rate (held-out correction dialogs: a wrong reply, the correction; the fix expected), each
with a 95% Wilson interval.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.building.calendar_data import (
    SYSTEM_PROMPT,
    EvalItem,
    Example,
    Mixture,
    eval_corrections,
    eval_first_requests,
    judge_reply,
    render_segments,
    training_examples,
)
from inference.building.checkpoints import file_sha256, staged_preset, write_arena_metadata
from inference.chat_templates import render_prompt, stop_strings
from leaderboard.ratings import wilson_interval

FAMILY = "chatml"
LORA_RANK = 8
# Which kernels get LoRA factors, in which blocks (``enable_fixer_lora``): attention's query and
# value and the whole feed-forward, in the upper 17 of the 30 blocks. The first-try misses of
# query/value LoRA in every block were nearly all a wrong hour (turning "8:15PM" into "20:15"
# is feed-forward work); the backward pass stops at the first block with LoRA, so a step costs
# about what query/value LoRA everywhere cost, and the loss falls about twice as fast. The
# docs/models.md's fixer section has the runs compared.
LORA_LAYER_NAMES = (
    "query",
    "value",
    "feedforward_gate_dense",
    "feedforward_intermediate_dense",
    "feedforward_output_dense",
)
LORA_FIRST_BLOCK = 13
# More correction dialogs than the demo models' mixture (fixing is what this model is for), and
# more first requests (the first-try misses are nearly all a wrong hour in the time).
MIXTURE = Mixture(share_first=0.6, share_followup=0.05)
EXAMPLES = 4000
STEPS = 160
BATCH_SIZE = 8
LEARNING_RATE = 1.5e-3
EVAL_MAX_NEW_TOKENS = 48


@dataclass(frozen=True)
class Encoded:
    """Token ids of one conversation and a 0/1 loss weight per id (``train_causal_lm``'s input)."""

    ids: list[int]
    weights: list[float]


def encode(lm: Any, example: Example) -> Encoded:
    """Tokenize a training conversation as the engine tokenizes its prompts (the start token
    only where the preprocessor adds one: SmolLM2 adds none), weighting trained replies only.

    Segments end and start at chat markers (special tokens, never merged with their neighbours),
    so tokenizing them one by one gives the ids of the whole text; ``check_encoding`` asserts it.
    """
    tokenizer = lm.preprocessor.tokenizer
    segments = render_segments(FAMILY, example)
    ids: list[int] = []
    weights: list[float] = []
    if lm.preprocessor.add_start_token:
        ids, weights = [int(tokenizer.start_token_id)], [0.0]
    for (_, trained), tokens in zip(segments, tokenizer([text for text, _ in segments]), strict=True):
        piece = [int(i) for i in np.asarray(tokens).reshape(-1)]
        ids += piece
        weights += [1.0 if trained else 0.0] * len(piece)
    return Encoded(ids, weights)


def check_encoding(lm: Any, example: Example) -> None:
    from inference.streaming import encode_prompt

    whole = encode_prompt(lm, "".join(text for text, _ in render_segments(FAMILY, example)))
    if whole != encode(lm, example).ids:
        raise AssertionError("Segment-wise tokenization differs from the whole conversation's.")


def load_base(preset: Path) -> Any:
    import keras_hub

    import inference.tokenizers  # noqa: F401  (the imported preset's tokenizer class)

    return keras_hub.models.CausalLM.from_preset(str(preset))


@dataclass
class FinetuneReport:
    steps: int
    batch_size: int
    examples: int
    seed: int
    lora_rank: int
    trainable_parameters: int
    final_loss: float
    seconds: float


def enable_fixer_lora(
    backbone: Any,
    *,
    rank: int = LORA_RANK,
    layer_names: tuple[str, ...] = LORA_LAYER_NAMES,
    first_block: int = LORA_FIRST_BLOCK,
) -> None:
    """keras-hub's ``Backbone.enable_lora`` on the kernels named ``layer_names`` of the
    transformer blocks from ``first_block`` on only; everything else frozen.

    keras-hub's own method matches layers by name, and every block names its kernels alike, so
    it cannot leave the lower blocks out. Leaving them out matters on a CPU: with no trainable
    weight below a block, the backward pass stops there. This is the same loop as keras-hub's,
    filtered by block, recording the layers where ``save_lora_weights`` and
    ``load_lora_weights`` look for them (their index among the layers with weights).
    """
    kept = {id(layer) for block in backbone.transformer_layers[first_block:] for layer in block._flatten_layers()}
    backbone.trainable = True
    backbone._lora_enabled_layers = []
    backbone._lora_rank = rank
    for layer in backbone._flatten_layers(include_self=False):
        layer.trainable = False
    weighted = [layer for layer in backbone._flatten_layers(include_self=False) if layer.weights]
    for index, layer in enumerate(weighted):
        if id(layer) in kept and layer.name in layer_names and hasattr(layer, "enable_lora"):
            layer.trainable = True
            layer.enable_lora(rank)
            backbone._lora_enabled_layers.append(index)


def finetune_fixer(
    base_preset: Path,
    weights_path: Path,
    *,
    steps: int = STEPS,
    batch_size: int = BATCH_SIZE,
    examples: int = EXAMPLES,
    learning_rate: float = LEARNING_RATE,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> FinetuneReport:
    """LoRA-fine-tune the base preset on the calendar data; writes the LoRA factors to
    ``weights_path`` (a ``.lora.h5`` file) and returns what was done."""
    import keras

    from inference.building.demo_models import train_causal_lm

    started = time.monotonic()
    keras.utils.set_random_seed(seed)
    lm = load_base(base_preset)
    enable_fixer_lora(lm.backbone)
    data = training_examples(seed, examples, mixture=MIXTURE)
    check_encoding(lm, data[0])
    encoded = [encode(lm, example) for example in data]
    final_loss = train_causal_lm(
        lm, encoded, steps=steps, batch_size=batch_size, learning_rate=learning_rate, seed=seed, on_step=on_step
    )
    weights_path.parent.mkdir(parents=True, exist_ok=True)
    lm.backbone.save_lora_weights(str(weights_path))
    trainable = sum(int(np.prod(v.shape)) for v in lm.trainable_variables)
    return FinetuneReport(
        steps=steps,
        batch_size=batch_size,
        examples=examples,
        seed=seed,
        lora_rank=LORA_RANK,
        trainable_parameters=trainable,
        final_loss=final_loss,
        seconds=time.monotonic() - started,
    )


def build_fixer_preset(base_preset: Path, weights_path: Path, out_dir: Path, report: dict[str, Any]) -> Path:
    """The base preset with the LoRA factors merged into its kernels, saved as a preset.

    Merged, so that serving the fixer costs what serving its base costs (a LoRA layer adds two
    matmuls at every token). The metadata names the base, the weights file and the training.
    """
    import shutil

    tuned = load_base(base_preset)
    enable_fixer_lora(tuned.backbone)
    tuned.backbone.load_lora_weights(str(weights_path))
    merged = {
        layer.path: np.asarray(layer.kernel)  # With LoRA enabled, .kernel is kernel + a @ b * scale.
        for layer in tuned.backbone._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    }
    fixer = load_base(base_preset)
    layers = {layer.path: layer for layer in fixer.backbone._flatten_layers(include_self=False)}
    for path, kernel in merged.items():
        layers[path]._kernel.assign(kernel)
    with staged_preset(out_dir) as scratch:
        fixer.save_to_preset(str(scratch / "preset"))
        for name in ("config.json", "task.json"):  # keras-hub's get_config gaps, as at import
            shutil.copy(base_preset / name, scratch / "preset" / name)
        base_arena = json.loads((base_preset / "metadata.json").read_text()).get("fix_arena", {})
        write_arena_metadata(
            scratch / "preset",
            {
                "template": base_arena.get("template", FAMILY),
                "base": False,
                "fine_tuned": {
                    "base": base_preset.name,
                    "lora_weights": weights_path.name,
                    "lora_sha256": file_sha256(weights_path),
                    "base_metadata_sha256": file_sha256(base_preset / "metadata.json"),
                    **report,
                },
            },
        )
    return out_dir


def is_built_from(preset_dir: Path, base_preset: Path, weights_path: Path) -> bool:
    """Whether ``preset_dir`` is a fixer preset built from exactly this base import and these
    LoRA weights (by the sha256 of the weights and of the base's metadata, which names its
    checkpoint and context): a checkout whose committed weights changed, or whose base was
    imported again differently, rebuilds its fixer at the next start."""
    try:
        built = json.loads((preset_dir / "metadata.json").read_text()).get("fix_arena", {}).get("fine_tuned", {})
        base_metadata = file_sha256(base_preset / "metadata.json")
    except (OSError, ValueError):
        return False
    return (
        (preset_dir / "config.json").is_file()
        and built.get("lora_sha256") == file_sha256(weights_path)
        and built.get("base_metadata_sha256") == base_metadata
    )


# --- Evaluation ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    successes: int
    n: int

    @property
    def rate(self) -> float:
        return self.successes / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    def __str__(self) -> str:
        low, high = self.interval
        return f"{self.rate:.0%} [{low:.0%}, {high:.0%}] ({self.successes}/{self.n})"


@dataclass(frozen=True)
class FixingReport:
    first_try: Rate
    fix: Rate
    examples: dict[str, list[tuple[str, str]]]  # set -> (reply, expected) of a few misses

    def as_dict(self) -> dict[str, Any]:
        def rate(r: Rate) -> dict[str, Any]:
            return {**asdict(r), "rate": round(r.rate, 3), "interval": [round(x, 3) for x in r.interval]}

        return {"first_try": rate(self.first_try), "fix": rate(self.fix), "examples": self.examples}


def engine_replies(lm: Any, items: list[EvalItem], max_new_tokens: int = EVAL_MAX_NEW_TOKENS) -> list[str]:
    """Greedy replies to held-out items through the engine, all submitted at once (8 slots)."""
    from inference.engine import GREEDY, Engine

    stops = stop_strings(FAMILY)
    with Engine(lm, slots=8) as engine:
        requests = [
            engine.submit(
                render_prompt(FAMILY, SYSTEM_PROMPT, list(item.turns)),
                max_new_tokens=max_new_tokens,
                stop_strings=stops,
                sampling=GREEDY,
            )
            for item in items
        ]
        return [request.result(timeout=1800).strip() for request in requests]


def evaluate_fixing(lm: Any, n: int = 100, seed: int = 0) -> FixingReport:
    """First-try exact rate and fix rate on ``n`` held-out items each (never trained on: the
    held-out entries are never generated for training, whatever the seeds)."""
    sets = {"first_try": eval_first_requests(seed, n), "fix": eval_corrections(seed, n)}
    items = [item for group in sets.values() for item in group]
    replies = engine_replies(lm, items)
    rates: dict[str, Rate] = {}
    examples: dict[str, list[tuple[str, str]]] = {}
    position = 0
    for name, group in sets.items():
        correct = 0
        for item in group:
            reply = replies[position]
            position += 1
            if judge_reply(reply, item.expected).verdict == "correct":
                correct += 1
            elif len(examples.setdefault(name, [])) < 3:
                examples[name].append((reply, item.expected))
        rates[name] = Rate(correct, len(group))
    return FixingReport(first_try=rates["first_try"], fix=rates["fix"], examples=examples)
