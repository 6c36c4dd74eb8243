"""Reading keras-hub preset folders without loading them (no Keras import)."""

import json
from dataclasses import dataclass
from pathlib import Path

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


def read_preset(path: Path) -> PresetInfo:
    """Name and family of a local preset folder, from its config.json."""
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} is not a keras-hub preset: it has no config.json.") from None
    class_name = config.get("registered_name", "").rsplit(">", 1)[-1] or config.get("class_name", "")
    family = BACKBONE_FAMILIES.get(class_name)
    if family is None:
        raise ValueError(f"{path}: unsupported backbone {class_name!r}.")
    return PresetInfo(name=path.name, family=family, path=path, quality=_demo_quality(path))


def _demo_quality(path: Path) -> str | None:
    try:
        metadata = json.loads((path / "metadata.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    arena = metadata.get("fix_arena") if isinstance(metadata, dict) else None
    quality = arena.get("quality") if isinstance(arena, dict) else None
    return quality if isinstance(quality, str) else None


def local_presets(directory: Path) -> list[PresetInfo]:
    if not directory.is_dir():
        return []
    return [read_preset(child) for child in sorted(directory.iterdir()) if (child / "config.json").is_file()]
