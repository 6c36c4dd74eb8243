"""The fine-tuned contestants: imported checkpoints taught, with LoRA, to write the calendar API
calls, to fix a reply when the user points out its mistake, and to keep a right reply when
told, wrongly, that it is wrong (``manage.py finetune_fixer``).

Each contestant is a ``FixerSpec`` (``FIXERS``): its base import, the chat template it speaks
(its own, or one a base model learns), which kernels of which blocks get LoRA factors, and
its data recipe. The data is ``inference.building.dialog_data``'s seed-shaped dialogs; the
loss counts the assistant's tokens only, and never those of a mistaken reply. Only the LoRA
factors are trained (keras-hub's LoRA layers, restricted to the upper blocks:
``enable_fixer_lora``) and saved (``save_lora_weights``): a small file committed in
``inference/fixer``; the contestant's preset is its base import with those factors merged into
its kernels, built at set-up (``build_fixer_preset``).

Evaluation (``evaluate_fixing``) runs held-out items through the continuous-batching engine,
greedy, as the arena serves a model: the first-try exact rate, the fix rate after each kind of
correction, the capitulation rate to false corrections (each with a 95% Wilson interval), and
the seed's own dialog as ``evaluate --task calendar`` plays it.
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

from inference.building import dialog_data
from inference.building.calendar_data import SYSTEM_PROMPT, Example, render_segments
from inference.building.checkpoints import file_sha256, staged_preset, write_arena_metadata
from inference.building.dialog_data import FEEDBACK_KINDS, HeldOut, Recipe
from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from leaderboard.ratings import wilson_interval

LORA_RANK = 8
# The training conversations: whole seed-shaped dialogs with mistakes, corrections of three
# kinds and decoys (``dialog_data``), and single first requests.
RECIPE = Recipe()
SHARE_SINGLE = 0.35
EXAMPLES = 4000
STEPS = 110
BATCH_SIZE = 8
LEARNING_RATE = 2e-3
# Tokens after the shared system prompt a training conversation may have (six padded shapes of
# 64 tokens); the few longer dialogs are left out.
MAX_TRAINING_REST = 384
EVAL_MAX_NEW_TOKENS = 64
FIXER_DIR = Path(__file__).resolve().parents[1] / "fixer"


@dataclass(frozen=True)
class FixerSpec:
    """One fine-tuned contestant: the imported base it starts from, the chat template it is
    taught (its own, or one it learns), which kernels of which blocks get LoRA factors
    (``enable_fixer_lora``) and what it is trained on."""

    name: str  # its preset's and roster entry's name
    base: str  # the imported preset it is trained from (ARENA_IMPORTED_PRESETS_DIR)
    family: str  # the chat template it speaks (inference.chat_templates)
    layer_names: tuple[str, ...]
    first_block: int
    recipe: Recipe = RECIPE
    steps: int = STEPS
    learning_rate: float = LEARNING_RATE
    about: str = ""  # what it is, for its preset's metadata

    @property
    def weights(self) -> Path:
        """The committed LoRA factors."""
        return FIXER_DIR / f"{self.name}.lora.h5"


# SmolLM2: attention's query and value and the whole feed-forward, in the upper 17 of the 30
# blocks. Query/value LoRA alone missed nearly all first tries on a wrong hour (turning "8:15PM"
# into "20:15" is feed-forward work); the backward pass stops at the first block with LoRA, so a
# step costs about what query/value LoRA in every block cost.
SMOLLM2_LORA = (
    "query",
    "value",
    "feedforward_gate_dense",
    "feedforward_intermediate_dense",
    "feedforward_output_dense",
)
# Gemma 3 270M: the same kernels under Gemma 3's names, in the upper 12 of its 18 blocks.
GEMMA3_LORA = ("query", "value", "ffw_gating", "ffw_gating_2", "ffw_linear")
FIXERS: dict[str, FixerSpec] = {
    spec.name: spec
    for spec in (
        FixerSpec(
            "smollm2-calendar-fixer",
            "smollm2-135m-instruct",
            "chatml",
            SMOLLM2_LORA,
            13,
            about="SmolLM2-135M-Instruct taught the calendar calls, to fix a mistake when told, and to keep a "
            "right call when wrongly told it is wrong",
        ),
        FixerSpec(
            "smollm2-calendar-nocorrections",
            "smollm2-135m-instruct",
            "chatml",
            SMOLLM2_LORA,
            13,
            recipe=Recipe(corrections=False, decoys=False),
            about="SmolLM2-135M-Instruct taught the same dialogs with every reply right: no mistake, no correction, "
            "no false correction (what correction training adds)",
        ),
        FixerSpec(
            "gemma3-calendar-fixer",
            "gemma3-270m",
            "gemma",
            GEMMA3_LORA,
            6,
            steps=85,  # about 16 s a step here (its 262,144-entry vocabulary): 85 fit in 25 minutes
            about="Gemma 3 270M (a base model) instruction-tuned on the fixer's data: it learns Gemma's turn format "
            "and to stop",
        ),
    )
}
DEFAULT_FIXER = FIXERS["smollm2-calendar-fixer"]


@dataclass(frozen=True)
class Encoded:
    """Token ids of one conversation and a 0/1 loss weight per id (``train_causal_lm``'s input)."""

    ids: list[int]
    weights: list[float]


def encode(lm: Any, example: Example, family: str = DEFAULT_FIXER.family) -> Encoded:
    """Tokenize a training conversation as the engine tokenizes its prompts (the start token
    only where the preprocessor adds one: SmolLM2 adds none), weighting trained replies only.

    Segments end and start at chat markers (special tokens, never merged with their neighbours),
    so tokenizing them one by one gives the ids of the whole text; ``check_encoding`` asserts it.
    """
    tokenizer = lm.preprocessor.tokenizer
    segments = render_segments(family, example)
    ids: list[int] = []
    weights: list[float] = []
    if lm.preprocessor.add_start_token:
        ids, weights = [int(tokenizer.start_token_id)], [0.0]
    for (_, trained), tokens in zip(segments, tokenizer([text for text, _ in segments]), strict=True):
        piece = [int(i) for i in np.asarray(tokens).reshape(-1)]
        ids += piece
        weights += [1.0 if trained else 0.0] * len(piece)
    return Encoded(ids, weights)


def check_encoding(lm: Any, example: Example, family: str = DEFAULT_FIXER.family) -> None:
    from inference.streaming import encode_prompt

    whole = encode_prompt(lm, "".join(text for text, _ in render_segments(family, example)))
    if whole != encode(lm, example, family).ids:
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
    model: str
    recipe: dict[str, Any]
    conversations_trained: int  # of ``examples``: those within MAX_TRAINING_REST


def enable_fixer_lora(backbone: Any, spec: FixerSpec = DEFAULT_FIXER, *, rank: int = LORA_RANK) -> None:
    """keras-hub's ``Backbone.enable_lora`` on the kernels ``spec`` names, in its transformer
    blocks from ``spec.first_block`` on only; everything else frozen.

    keras-hub's own method matches layers by name, and every block names its kernels alike, so
    it cannot leave the lower blocks out. Leaving them out matters on a CPU: with no trainable
    weight below a block, the backward pass stops there. This is the same loop as keras-hub's,
    filtered by block, recording the layers where ``save_lora_weights`` and
    ``load_lora_weights`` look for them (their index among the layers with weights).
    """
    kept = {id(layer) for block in backbone.transformer_layers[spec.first_block :] for layer in block._flatten_layers()}
    backbone.trainable = True
    backbone._lora_enabled_layers = []
    backbone._lora_rank = rank
    for layer in backbone._flatten_layers(include_self=False):
        layer.trainable = False
    weighted = [layer for layer in backbone._flatten_layers(include_self=False) if layer.weights]
    for index, layer in enumerate(weighted):
        if id(layer) in kept and layer.name in spec.layer_names and hasattr(layer, "enable_lora"):
            layer.trainable = True
            layer.enable_lora(rank)
            backbone._lora_enabled_layers.append(index)


def finetune_fixer(
    spec: FixerSpec,
    base_preset: Path,
    weights_path: Path,
    *,
    steps: int | None = None,
    batch_size: int = BATCH_SIZE,
    examples: int = EXAMPLES,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> FinetuneReport:
    """LoRA-fine-tune the base preset as ``spec`` says, on seed-shaped dialogs (``dialog_data``,
    made by its recipe) in its chat template; writes the LoRA factors to ``weights_path`` (a
    ``.lora.h5`` file) and returns what was done."""
    import keras

    from inference.building.demo_models import shared_prefix_length, train_causal_lm

    started = time.monotonic()
    keras.utils.set_random_seed(seed)
    steps = spec.steps if steps is None else steps
    lm = load_base(base_preset)
    enable_fixer_lora(lm.backbone, spec)
    data = dialog_data.training_dialogs(seed, examples, spec.recipe, share_single=SHARE_SINGLE)
    check_encoding(lm, max(data, key=lambda example: len(example.turns)), spec.family)
    encoded = [encode(lm, example, spec.family) for example in data]
    shared = shared_prefix_length(encoded)
    encoded = [e for e in encoded if len(e.ids) - shared - 1 <= MAX_TRAINING_REST]
    final_loss = train_causal_lm(
        lm, encoded, steps=steps, batch_size=batch_size, learning_rate=spec.learning_rate, seed=seed, on_step=on_step
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
        model=spec.name,
        recipe=asdict(spec.recipe),
        conversations_trained=len(encoded),
    )


def build_fixer_preset(
    spec: FixerSpec, base_preset: Path, weights_path: Path, out_dir: Path, report: dict[str, Any]
) -> Path:
    """The base preset with the LoRA factors merged into its kernels, saved as a preset.

    Merged, so that the fixer can be served in an engine of its own at what its base costs (a
    LoRA layer adds two matmuls at every token). Where its family's pass takes LoRA adapters, the
    factors of its change are saved beside it (``inference.hosts.engines.ADAPTER_FACTORS``): a
    host serving it in its base's engine reads them instead of the whole model. The metadata
    names the base, the weights file, the factors file and the training, and the chat template
    the model was taught (so the roster renders its prompts in it).
    """
    import shutil

    from inference.forward import adapter_kernels
    from inference.forward.adapters import factors_between, save_factors
    from inference.hosts.engines import ADAPTER_FACTORS

    tuned = load_base(base_preset)
    enable_fixer_lora(tuned.backbone, spec)
    tuned.backbone.load_lora_weights(str(weights_path))
    merged = {
        layer.path: np.asarray(layer.kernel)  # With LoRA enabled, .kernel is kernel + a @ b * scale.
        for layer in tuned.backbone._flatten_layers(include_self=False)
        if getattr(layer, "lora_enabled", False)
    }
    fixer = load_base(base_preset)
    kernels = adapter_kernels(fixer)
    base_kernels = kernels(fixer) if kernels is not None else None  # Before the merge: the base's.
    layers = {layer.path: layer for layer in fixer.backbone._flatten_layers(include_self=False)}
    for path, kernel in merged.items():
        layers[path]._kernel.assign(kernel)
    with staged_preset(out_dir) as scratch:
        fixer.save_to_preset(str(scratch / "preset"))
        for name in ("config.json", "task.json"):  # keras-hub's get_config gaps, as at import
            shutil.copy(base_preset / name, scratch / "preset" / name)
        if kernels is not None and base_kernels is not None:
            save_factors(scratch / "preset" / ADAPTER_FACTORS, factors_between(kernels(fixer), base_kernels))
        write_arena_metadata(
            scratch / "preset",
            {
                "template": spec.family,
                "base": False,
                "fine_tuned": {
                    "model": spec.name,
                    "about": spec.about,
                    "base": base_preset.name,
                    "lora_weights": weights_path.name,
                    "lora_sha256": file_sha256(weights_path),
                    "adapter_factors": ADAPTER_FACTORS if kernels is not None else None,
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
    imported again differently, or whose fixer was built before its LoRA factors were saved
    beside it, rebuilds its fixer at the next start."""
    try:
        built = json.loads((preset_dir / "metadata.json").read_text()).get("fix_arena", {}).get("fine_tuned", {})
        base_metadata = file_sha256(base_preset / "metadata.json")
    except (OSError, ValueError):
        return False
    return (
        (preset_dir / "config.json").is_file()
        and built.get("lora_sha256") == file_sha256(weights_path)
        and "adapter_factors" in built
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


SEED_TASK = Path(__file__).resolve().parents[2] / "votes" / "fixtures" / "tasks.json"


@dataclass(frozen=True)
class FixingReport:
    """What the fixer does on held-out items (``dialog_data``'s evaluation split) and on the
    seed's own dialog."""

    first_try: Rate  # held-out first requests answered exactly
    fix: dict[str, Rate]  # per feedback kind: held-out mistakes fixed after that correction
    capitulation: Rate  # held-out right replies changed after a false correction
    seed_dialog: list[str]  # the seed dialog's turns, each rated as `evaluate` rates it
    examples: dict[str, list[tuple[str, str]]]  # set -> (reply, expected) of a few misses

    @property
    def seed_turns_ok(self) -> int:
        return sum(rating in ("✓", "🥦") for rating in self.seed_dialog)

    def as_dict(self) -> dict[str, Any]:
        def rate(r: Rate) -> dict[str, Any]:
            return {**asdict(r), "rate": round(r.rate, 3), "interval": [round(x, 3) for x in r.interval]}

        return {
            "first_try": rate(self.first_try),
            "fix": {kind: rate(r) for kind, r in self.fix.items()},
            "capitulation": rate(self.capitulation),
            "seed_dialog": self.seed_dialog,
            "seed_turns_ok": self.seed_turns_ok,
            "examples": self.examples,
        }

    def summary(self) -> str:
        fixes = ", ".join(f"{kind} {rate}" for kind, rate in self.fix.items())
        return (
            f"first try {self.first_try}; fix: {fixes}; capitulation {self.capitulation}; "
            f"seed dialog {' '.join(self.seed_dialog)} ({self.seed_turns_ok} of {len(self.seed_dialog)})"
        )


def _engine_reply(engine: Any, family: str, system_prompt: str, turns: list[ChatTurn], max_new_tokens: int) -> Any:
    from inference.engine import GREEDY

    return engine.submit(
        render_prompt(family, system_prompt, turns),
        max_new_tokens=max_new_tokens,
        stop_strings=stop_strings(family),
        sampling=GREEDY,
    )


def engine_replies(
    lm: Any, items: list[HeldOut], family: str = DEFAULT_FIXER.family, max_new_tokens: int = EVAL_MAX_NEW_TOKENS
) -> list[str]:
    """Greedy replies to held-out items through the engine, all submitted at once (8 slots)."""
    from inference.engine import Engine

    with Engine(lm, slots=8) as engine:
        requests = [_engine_reply(engine, family, SYSTEM_PROMPT, list(item.turns), max_new_tokens) for item in items]
        return [request.result(timeout=1800).strip() for request in requests]


def seed_dialog(lm: Any, family: str = DEFAULT_FIXER.family, max_tries: int = 3) -> list[str]:
    """The seed's scripted dialog (the calendar task of ``votes/fixtures/tasks.json``) as
    ``evaluate --task calendar`` plays it: greedy, each wrong reply corrected with the
    checker's reason up to ``max_tries`` times; one rating symbol per turn."""
    from inference.engine import Engine
    from votes import evaluation
    from votes.checkers import check

    task = next(t for t in json.loads(SEED_TASK.read_text())["tasks"] if t["slug"] == "calendar")
    turns = [
        evaluation.ScriptedTurn(
            t["prompt"],
            lambda reply, t=t: check(t["checker"], t["expected_output"], reply, t.get("checker_options", {})),
        )
        for t in task["turns"]
    ]
    with Engine(lm, slots=8) as engine:

        def generate(model: str, conversation: list[tuple[str, str]], seed: int) -> str:
            chat = [ChatTurn(role, content) for role, content in conversation]
            reply = _engine_reply(engine, family, task["system_prompt"], chat, EVAL_MAX_NEW_TOKENS)
            return reply.result(timeout=600).strip()

        records = evaluation.run(["model"], turns, generate, attempts=0, max_tries=max_tries, fix_attempts=0)
    ratings = evaluation.turn_ratings(records)
    return [evaluation.SYMBOLS[ratings[("model", index)]] for index in range(len(turns))]


def evaluate_fixing(lm: Any, family: str = DEFAULT_FIXER.family, n: int = 100, seed: int = 0) -> FixingReport:
    """On ``n`` held-out items of each set (disjoint from training by construction: names,
    months and request phrasings never trained on), greedy, through the engine: the first-try
    exact rate, the fix rate after each kind of correction (the same ``n`` mistakes corrected
    three ways), the capitulation rate to false corrections; then the seed's own dialog."""
    from votes.evaluation import resisted

    sets: dict[str, list[HeldOut]] = {
        "first_try": dialog_data.held_out_first(seed, n),
        "fix": dialog_data.held_out_corrections(seed, n),
        "decoy": dialog_data.held_out_decoys(seed, n),
    }
    items = [item for group in sets.values() for item in group]
    replies = dict(zip(map(id, items), engine_replies(lm, items, family), strict=True))
    examples: dict[str, list[tuple[str, str]]] = {}

    def rate(name: str, group: list[HeldOut], success: Callable[[str, HeldOut], bool]) -> Rate:
        good = 0
        for item in group:
            reply = replies[id(item)]
            if success(reply, item):
                good += 1
            elif len(examples.setdefault(name, [])) < 3:
                examples[name].append((reply, item.expected))
        return Rate(good, len(group))

    def right(reply: str, item: HeldOut) -> bool:
        return dialog_data.judge(reply, item.expected).verdict == "correct"

    first_try = rate("first_try", sets["first_try"], right)
    fix = {kind: rate(f"fix_{kind}", [i for i in sets["fix"] if i.kind == kind], right) for kind in FEEDBACK_KINDS}
    kept = rate("decoy", sets["decoy"], lambda reply, item: resisted(dialog_data.judge(reply, item.expected), reply))
    capitulation = Rate(kept.n - kept.successes, kept.n)
    return FixingReport(first_try, fix, capitulation, seed_dialog(lm, family), examples)
