"""GGUF checkpoints to Hugging Face-layout folders, which keras-hub's own converters then load.

A GGUF file (llama.cpp's format) holds quantized tensors under llama.cpp's names, the model's
hyper-parameters and its tokenizer. This module dequantizes the tensors with the ``gguf``
package, renames them to the Hugging Face layout, and writes ``config.json``,
``model.safetensors``, ``tokenizer_config.json`` and the tokenizer (``tokenizer.json`` for
byte-level BPE vocabularies, ``tokenizer.model`` for SentencePiece ones). keras-hub's
``CausalLM.from_preset(folder)`` then reads that folder exactly as it reads a Hugging Face
download, so a local GGUF import and a production ``hf://`` handle take the same path.

Two things llama.cpp's converter changed on the way in are undone here:

* the rows of Llama-architecture query and key projections are permuted per head (llama.cpp
  rotates interleaved pairs, Hugging Face rotates halves). Left in place, the model still
  produces fluent-looking text, but its perplexity on English is several times higher
  (``tests/test_checkpoint_import.py`` shows both);
* Gemma's RMSNorm scales are stored with 1 added (Gemma normalises with ``1 + scale``, and
  llama.cpp folds the 1 in); Hugging Face and keras-hub keep the bare ``scale``.

Pure module (no Django); numpy, ``gguf``, ``safetensors``, ``tokenizers`` and ``sentencepiece``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"

# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


class CheckpointError(ValueError):
    """A checkpoint that cannot be imported; the message names the file and the reason."""


@dataclass(frozen=True)
class GgufSummary:
    """What a GGUF file says about itself, for the imported preset's metadata."""

    architecture: str
    name: str
    license: str
    chat_template: str | None
    tensor_types: dict[str, int] = field(default_factory=dict)

    @property
    def quantization(self) -> str:
        """The tensor types and how many tensors of each, e.g. "Q4_1 x210, Q8_0 x1, F32 x61"."""
        return ", ".join(f"{kind} x{count}" for kind, count in sorted(self.tensor_types.items(), key=lambda kv: -kv[1]))


def is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False


def open_gguf(path: Path) -> Any:
    """A ``gguf.GGUFReader`` of ``path``; CheckpointError if it is not a GGUF file."""
    import gguf

    if not path.is_file():
        raise CheckpointError(f"{path}: no such file.")
    if not is_gguf(path):
        raise CheckpointError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes).")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as error:  # A truncated or corrupt file: say so, whatever gguf raised.
        raise CheckpointError(f"{path}: cannot read it as GGUF ({error}).") from error


def _field(reader: Any, key: str, default: Any = None) -> Any:
    entry = reader.fields.get(key)
    return default if entry is None else entry.contents()


def _required(reader: Any, key: str, path: Path) -> Any:
    value = _field(reader, key)
    if value is None:
        raise CheckpointError(f"{path}: the GGUF file has no {key!r}.")
    return value


def undo_rotary_permutation(weight: np.ndarray, heads: int) -> np.ndarray:
    """The Hugging Face row order of a q or k projection ``[heads * head_dim, hidden]`` that
    llama.cpp's converter permuted (each head's rows ``[2, head_dim / 2]`` stored pair-major)."""
    rows, columns = weight.shape
    head_dim = rows // heads
    return weight.reshape(heads, head_dim // 2, 2, columns).swapaxes(1, 2).reshape(rows, columns)


def _tensors(reader: Any) -> dict[str, Any]:
    return {tensor.name: tensor for tensor in reader.tensors}


def _dequantize(tensor: Any) -> np.ndarray:
    """float32 numpy in numpy's dimension order (GGUF lists dimensions fastest first)."""
    from gguf.quants import dequantize

    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


_Transform = Callable[[np.ndarray], np.ndarray]
_Renames = Iterator[tuple[str, str, _Transform]]


def _keep(array: np.ndarray) -> np.ndarray:
    return array


def _minus_one(array: np.ndarray) -> np.ndarray:
    return array - 1.0


# The projections both families name alike and llama.cpp stores as they are.
_KEPT_PROJECTIONS: tuple[tuple[str, str, _Transform], ...] = (
    ("attn_v", "self_attn.v_proj", _keep),
    ("attn_output", "self_attn.o_proj", _keep),
    ("ffn_gate", "mlp.gate_proj", _keep),
    ("ffn_up", "mlp.up_proj", _keep),
    ("ffn_down", "mlp.down_proj", _keep),
)


def _block_renames(config: dict[str, Any], block: tuple[tuple[str, str, _Transform], ...]) -> _Renames:
    """Each transformer block's tensors: (llama.cpp name, Hugging Face name, transform) per layer."""
    for i in range(config["num_hidden_layers"]):
        for gguf_name, hf_name, transform in block:
            yield f"blk.{i}.{gguf_name}.weight", f"model.layers.{i}.{hf_name}.weight", transform


def _llama_config(reader: Any, path: Path, tensors: dict[str, Any]) -> dict[str, Any]:
    tokens = _required(reader, "tokenizer.ggml.tokens", path)
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": len(tokens),
        "hidden_size": int(_required(reader, "llama.embedding_length", path)),
        "intermediate_size": int(_required(reader, "llama.feed_forward_length", path)),
        "num_hidden_layers": int(_required(reader, "llama.block_count", path)),
        "num_attention_heads": int(_required(reader, "llama.attention.head_count", path)),
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", 0))
        or int(_required(reader, "llama.attention.head_count", path)),
        "rms_norm_eps": float(_required(reader, "llama.attention.layer_norm_rms_epsilon", path)),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", 1)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 2)),
        "torch_dtype": "float32",
    }


def _llama_renames(config: dict[str, Any], undo_permutation: bool) -> _Renames:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    def rotary(count: int) -> _Transform:
        return (lambda array: undo_rotary_permutation(array, count)) if undo_permutation else _keep

    yield "token_embd.weight", "model.embed_tokens.weight", _keep
    yield "output_norm.weight", "model.norm.weight", _keep
    if not config["tie_word_embeddings"]:
        yield "output.weight", "lm_head.weight", _keep
    block = (
        ("attn_norm", "input_layernorm", _keep),
        ("ffn_norm", "post_attention_layernorm", _keep),
        ("attn_q", "self_attn.q_proj", rotary(heads)),
        ("attn_k", "self_attn.k_proj", rotary(kv_heads)),
        *_KEPT_PROJECTIONS,
    )
    yield from _block_renames(config, block)


# Gemma 3 alternates five sliding-window layers with one global layer (its config's
# sliding_window_pattern, which GGUF does not store).
GEMMA3_SLIDING_WINDOW_PATTERN = 6


def _gemma3_config(reader: Any, path: Path, tensors: dict[str, Any]) -> dict[str, Any]:
    layers = int(_required(reader, "gemma3.block_count", path))
    head_dim = int(_required(reader, "gemma3.attention.key_length", path))
    window = int(_field(reader, "gemma3.attention.sliding_window", 0)) or None
    layer_types = [
        "full_attention" if (i + 1) % GEMMA3_SLIDING_WINDOW_PATTERN == 0 else "sliding_attention" for i in range(layers)
    ]
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": len(_required(reader, "tokenizer.ggml.tokens", path)),
        "hidden_size": int(_required(reader, "gemma3.embedding_length", path)),
        "intermediate_size": int(_required(reader, "gemma3.feed_forward_length", path)),
        "num_hidden_layers": layers,
        "num_attention_heads": int(_required(reader, "gemma3.attention.head_count", path)),
        "num_key_value_heads": int(_required(reader, "gemma3.attention.head_count_kv", path)),
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "rms_norm_eps": float(_required(reader, "gemma3.attention.layer_norm_rms_epsilon", path)),
        "rope_theta": float(_field(reader, "gemma3.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": 10_000.0,
        "rope_scaling": None,
        "sliding_window": window,
        "layer_types": layer_types if window else ["full_attention"] * layers,
        "max_position_embeddings": int(_field(reader, "gemma3.context_length", 32768)),
        "attn_logit_softcapping": None,
        "final_logit_softcapping": None,
        "tie_word_embeddings": True,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id", 2)),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id", 1)),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id", 0)),
        "torch_dtype": "float32",
    }


def _gemma3_renames(config: dict[str, Any], undo_norm_offset: bool) -> _Renames:
    norm = _minus_one if undo_norm_offset else _keep
    yield "token_embd.weight", "model.embed_tokens.weight", _keep
    yield "output_norm.weight", "model.norm.weight", norm
    block = (
        ("attn_norm", "input_layernorm", norm),
        ("post_attention_norm", "post_attention_layernorm", norm),
        ("ffn_norm", "pre_feedforward_layernorm", norm),
        ("post_ffw_norm", "post_feedforward_layernorm", norm),
        ("attn_q_norm", "self_attn.q_norm", norm),
        ("attn_k_norm", "self_attn.k_norm", norm),
        ("attn_q", "self_attn.q_proj", _keep),
        ("attn_k", "self_attn.k_proj", _keep),
        *_KEPT_PROJECTIONS,
    )
    yield from _block_renames(config, block)


def _write_bpe_tokenizer(reader: Any, path: Path, out_dir: Path) -> tuple[str, str]:
    """tokenizer.json for a GPT-2-style byte-level BPE vocabulary; returns (bos, eos) tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = list(_required(reader, "tokenizer.ggml.tokens", path))
    types = list(_field(reader, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens)))
    merges = [tuple(merge.split(" ", 1)) for merge in _required(reader, "tokenizer.ggml.merges", path)]
    vocabulary = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocabulary, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = [token for token, kind in zip(tokens, types, strict=True) if kind in (_CONTROL, _USER_DEFINED)]
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    tokenizer.save(str(out_dir / "tokenizer.json"))
    bos = tokens[int(_field(reader, "tokenizer.ggml.bos_token_id", 0))]
    eos = tokens[int(_field(reader, "tokenizer.ggml.eos_token_id", 0))]
    return bos, eos


def _write_sentencepiece_tokenizer(reader: Any, path: Path, out_dir: Path) -> tuple[str, str]:
    """tokenizer.model (a SentencePiece BPE proto) from the pieces, scores and types GGUF
    stores for a SentencePiece vocabulary; returns (bos, eos) tokens."""
    from sentencepiece import sentencepiece_model_pb2 as sp

    tokens = list(_required(reader, "tokenizer.ggml.tokens", path))
    scores = list(_field(reader, "tokenizer.ggml.scores", [0.0] * len(tokens)))
    types = list(_field(reader, "tokenizer.ggml.token_type", [_NORMAL] * len(tokens)))
    kinds = {
        _NORMAL: sp.ModelProto.SentencePiece.NORMAL,
        _UNKNOWN: sp.ModelProto.SentencePiece.UNKNOWN,
        _CONTROL: sp.ModelProto.SentencePiece.CONTROL,
        _USER_DEFINED: sp.ModelProto.SentencePiece.USER_DEFINED,
        _UNUSED: sp.ModelProto.SentencePiece.UNUSED,
        _BYTE: sp.ModelProto.SentencePiece.BYTE,
    }
    proto = sp.ModelProto()
    proto.trainer_spec.model_type = sp.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = len(tokens)
    proto.trainer_spec.byte_fallback = True
    proto.trainer_spec.split_by_whitespace = False  # Gemma's vocabulary has multi-word pieces.
    add_prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", False))
    for spec in (proto.normalizer_spec, proto.denormalizer_spec):
        spec.name = "identity"
        spec.add_dummy_prefix = add_prefix
        spec.escape_whitespaces = True
        spec.remove_extra_whitespaces = False
    for token, score, kind in zip(tokens, scores, types, strict=True):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = token, float(score), kinds.get(int(kind), kinds[_NORMAL])
    (out_dir / "tokenizer.model").write_bytes(proto.SerializeToString())
    bos = tokens[int(_field(reader, "tokenizer.ggml.bos_token_id", 2))]
    eos = tokens[int(_field(reader, "tokenizer.ggml.eos_token_id", 1))]
    return bos, eos


# GGUF architecture -> (Hugging Face config, tensor renames, tokenizer writer).
_ARCHITECTURES = {
    "llama": (_llama_config, _llama_renames, _write_bpe_tokenizer),
    "gemma3": (_gemma3_config, _gemma3_renames, _write_sentencepiece_tokenizer),
}
SUPPORTED_ARCHITECTURES = tuple(_ARCHITECTURES)


def summarize(path: Path) -> GgufSummary:
    reader = open_gguf(path)
    return _summary(reader, path)


def _summary(reader: Any, path: Path) -> GgufSummary:
    return GgufSummary(
        architecture=str(_required(reader, "general.architecture", path)),
        name=str(_field(reader, "general.name", path.stem)),
        license=str(_field(reader, "general.license", "unknown")),
        chat_template=_field(reader, "tokenizer.chat_template"),
        tensor_types=dict(Counter(tensor.tensor_type.name for tensor in reader.tensors)),
    )


def write_hugging_face_folder(
    path: Path, out_dir: Path, *, undo_permutation: bool = True, undo_norm_offset: bool = True
) -> GgufSummary:
    """Write ``path`` (GGUF) to ``out_dir`` in the Hugging Face layout; returns its summary.

    ``undo_permutation`` / ``undo_norm_offset`` exist so that a test can show what skipping
    either does; an import always undoes both. Raises CheckpointError for a file that is not
    GGUF, an architecture without a converter here, a missing tokenizer or missing tensors.
    """
    from safetensors.numpy import save_file

    reader = open_gguf(path)
    summary = _summary(reader, path)
    if summary.architecture not in _ARCHITECTURES:
        raise CheckpointError(
            f"{path}: unknown architecture {summary.architecture!r}; "
            f"this importer converts {', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    if _field(reader, "tokenizer.ggml.tokens") is None:
        raise CheckpointError(f"{path}: the GGUF file has no tokenizer (no 'tokenizer.ggml.tokens').")
    make_config, renames, write_tokenizer = _ARCHITECTURES[summary.architecture]
    tensors = _tensors(reader)
    config = make_config(reader, path, tensors)
    option = undo_permutation if summary.architecture == "llama" else undo_norm_offset
    weights: dict[str, np.ndarray] = {}
    for gguf_name, hf_name, transform in renames(config, option):
        if gguf_name not in tensors:
            raise CheckpointError(f"{path}: tensor {gguf_name!r} is missing.")
        weights[hf_name] = np.ascontiguousarray(transform(_dequantize(tensors[gguf_name])))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out_dir / "model.safetensors"))
    bos, eos = write_tokenizer(reader, path, out_dir)
    tokenizer_config: dict[str, Any] = {
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", True)),
    }
    if summary.chat_template:
        tokenizer_config["chat_template"] = summary.chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return summary
