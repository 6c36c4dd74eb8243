"""Reading keras-hub preset folders without loading them (no Keras import)."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.chat_templates import FAMILIES, family_from_special_tokens

# keras-hub backbone class -> chat template family. Vicuna is a Llama (1/2) backbone.
BACKBONE_FAMILIES = {
    "GemmaBackbone": "gemma",
    "Gemma3Backbone": "gemma",
    "Llama3Backbone": "llama3",
    "MistralBackbone": "mistral",
    "LlamaBackbone": "vicuna",
}


@dataclass(frozen=True)
class PresetInfo:
    name: str
    family: str
    path: Path
    # "strong", "medium" or "weak" for the trained demo presets (their metadata.json says so,
    # with the measured quality); None for any other preset.
    quality: str | None = None
    # A pretrained base model (no chat tuning): it gets the completion template and is labelled
    # "base" in the roster and on the leaderboard.
    base: bool = False
    # Tokens of prompt plus reply the preset is set up for (inference.streaming.context_length):
    # its preprocessor's sequence_length, lowered to the backbone's max_sequence_length where it
    # has one. None when the preset does not say.
    context: int | None = None
    # For a model the project fine-tuned (inference.building.fixer): the folder name of the
    # imported preset it was trained from, which can serve it as a LoRA adapter. None otherwise.
    fine_tuned_from: str | None = None


def read_preset(path: Path) -> PresetInfo:
    """Name and chat template family of a local preset folder.

    The family comes from the preset itself: the ``fix_arena.template`` its import recorded in
    metadata.json, else the chat markers among its tokenizer's special tokens (SmolLM2 is a
    Llama 3 backbone that speaks ChatML), else its backbone class.
    """
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} is not a keras-hub preset: it has no config.json.") from None
    class_name = config.get("registered_name", "").rsplit(">", 1)[-1] or config.get("class_name", "")
    if class_name not in BACKBONE_FAMILIES:
        raise ValueError(f"{path}: unsupported backbone {class_name!r}.")
    arena = _arena_metadata(path)
    recorded = arena.get("template")
    if recorded is not None and recorded not in FAMILIES:
        raise ValueError(f"{path}: metadata.json names an unknown template family {recorded!r}.")
    family = recorded or family_from_special_tokens(_special_tokens(path)) or BACKBONE_FAMILIES[class_name]
    quality = arena.get("quality")
    return PresetInfo(
        name=path.name,
        family=family,
        path=path,
        quality=quality if isinstance(quality, str) else None,
        base=arena.get("base") is True,
        context=_context_length(path, config),
        fine_tuned_from=_fine_tuned_from(arena),
    )


def _fine_tuned_from(arena: dict[str, Any]) -> str | None:
    tuned = arena.get("fine_tuned")
    base = tuned.get("base") if isinstance(tuned, dict) else None
    return base if isinstance(base, str) and base else None


def _context_length(path: Path, config: dict[str, Any]) -> int | None:
    """As keras-hub's CausalLM.from_preset sets it up: task.json's preprocessor where the preset
    has one, else preprocessor.json."""
    preprocessor: Any = None
    try:
        task = json.loads((path / "task.json").read_text())
        preprocessor = task.get("config", {}).get("preprocessor") if isinstance(task, dict) else None
    except (FileNotFoundError, ValueError):
        pass
    if not isinstance(preprocessor, dict):
        try:
            preprocessor = json.loads((path / "preprocessor.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
    length = preprocessor.get("config", {}).get("sequence_length") if isinstance(preprocessor, dict) else None
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        return None
    backbone_limit = config.get("config", {}).get("max_sequence_length")
    if isinstance(backbone_limit, int) and not isinstance(backbone_limit, bool) and backbone_limit > 0:
        return min(length, backbone_limit)
    return length


def _arena_metadata(path: Path) -> dict[str, Any]:
    try:
        metadata = json.loads((path / "metadata.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    arena = metadata.get("fix_arena") if isinstance(metadata, dict) else None
    return arena if isinstance(arena, dict) else {}


def _special_tokens(path: Path) -> list[str]:
    """The tokens a byte-pair tokenizer never splits (its special tokens), from tokenizer.json."""
    try:
        tokenizer = json.loads((path / "tokenizer.json").read_text())
    except (FileNotFoundError, ValueError):
        return []
    tokens = tokenizer.get("config", {}).get("unsplittable_tokens") if isinstance(tokenizer, dict) else None
    return [token for token in tokens if isinstance(token, str)] if isinstance(tokens, list) else []


def local_presets(directory: Path) -> list[PresetInfo]:
    if not directory.is_dir():
        return []
    # Dot-folders are work in progress (an import's scratch folder, a fine-tune's evaluation copy).
    children = sorted(child for child in directory.iterdir() if not child.name.startswith("."))
    return [read_preset(child) for child in children if (child / "config.json").is_file()]
