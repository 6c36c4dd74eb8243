"""Shard a keras-hub causal LM's weights over every local accelerator (tensor/model parallelism).

A contestant too big for one chip is loaded with its weights split across all local devices:
a 2D ``keras.distribution.DeviceMesh`` with axes ``("batch", "model")`` (default ``(1, N)``:
pure model parallelism over N devices), a ``LayoutMap`` from variable paths to shardings, and a
``ModelParallel`` distribution active while the model is created, so that every variable is
*created* sharded (keras' jax backend looks the layout up when a variable initialises and
again when the preset's weights are assigned): no full copy of a big model ever lands on one
device. The same call works for a local preset folder, a ``kaggle://`` or an ``hf://`` handle.

Layouts per family (variable paths and shapes read from keras-hub 0.32's sources):

* ``gemma``: ``GemmaBackbone.get_layout_map`` as is. Its attention kernels are
  ``(heads, hidden, head_dim)`` and it shards ``heads`` on "model", the FFN on its wide
  dimension, the (tied) token embedding on the vocabulary.
* ``llama3`` / ``vicuna`` (``Llama3Backbone`` / ``LlamaBackbone``): ``LlamaBackbone.get_layout_map``
  with the q/k/v kernel layout fixed, as the original Keras chatbot arena did. See
  ``_LLAMA_QKV_KERNEL``.
* every family: a key/value head count the model axis does not divide (multi-query attention,
  as Gemma 2B's single key/value head and the strong demo model) keeps those kernels whole on
  every device, as Megatron-style tensor parallelism does with a shared key/value head: each
  device computes the shared keys and values itself, the query heads stay split.
* ``mistral``: keras-hub has no ``MistralBackbone.get_layout_map``; its decoder uses the very
  same variable paths and kernel shapes as Llama (``transformer_layer_N/self_attention/...``,
  ``feedforward_{intermediate,gate,output}_dense``), so it gets the fixed Llama map, written
  out here.

For the Llama family the untied LM head (``token_embedding/reverse_embeddings``,
``(hidden, vocab)``) is sharded on the vocabulary too: keras-hub's map leaves it replicated,
which for Llama 3 8B is 0.5 B parameters copied onto every chip.

Divisibility: every dimension mapped to a mesh axis must be divisible by that axis' size —
vocabulary (embedding and LM head), query heads, key/value heads, FFN width on "model";
hidden size and head size on "batch" — else JAX refuses the sharding (``IndivisibleError``,
whose message names no variable). ``load_sharded_causal_lm`` checks every variable against its
layout as it is created and raises :class:`ShardingError` naming the variable, the dimension
(e.g. ``num_key_value_heads``) and the mesh axis instead. Real checkpoints have padded
vocabularies (Gemma 256000, Llama 3 128256, Mistral 32768) and head counts that are powers of
two, so a model axis of 2, 4 or 8 fits them, as it fits the trained demo presets (8 query heads,
8 key/value heads or one shared one, hidden 128, vocabulary 1024); the tiny test presets (4
query heads) do not divide by 8.

Simulating devices on a CPU: ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be in
the environment *before jax is imported* (jax reads it once, at backend initialisation).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras

if TYPE_CHECKING:
    import keras_hub

BATCH_AXIS = "batch"
MODEL_AXIS = "model"

# Which keras-hub backbone class each arena family uses (Vicuna is a Llama 2 fine-tune).
FAMILY_BACKBONES: dict[str, str] = {
    "gemma": "GemmaBackbone",
    "llama3": "Llama3Backbone",
    "mistral": "MistralBackbone",
    "vicuna": "LlamaBackbone",
}
_LLAMA_FAMILIES = frozenset({"llama3", "mistral", "vicuna"})

# Llama/Mistral attention kernels (keras-hub 0.32, llama_attention.py / mistral_attention.py):
#   query            EinsumDense "bqm,muh->bquh"  kernel (hidden, num_query_heads, head_dim)
#   key, value       EinsumDense "bkm,mvh->bkvh"  kernel (hidden, num_key_value_heads, head_dim)
#   attention_output EinsumDense "bquh,uhm->bqm"  kernel (num_query_heads, head_dim, hidden)
# LlamaBackbone.get_layout_map copies Gemma's q/k/v tuple ("model", "batch", None) unchanged,
# but Gemma's kernels are (heads, hidden, head_dim): on Llama that tuple splits the *hidden*
# (contracted) dimension on "model" instead of the heads. Sharding the heads axis instead,
# (None, "model", "batch"), is Megatron-style attention: q/k/v are split by head (column
# parallel), every device attends over its own heads with no communication, and
# attention_output, whose kernel is already split by head ("model", None, "batch"), sums the
# partial results (one all-reduce per block). It also makes the head counts, not the hidden
# size, what must divide the model axis (Llama 3 8B: 32 query / 8 kv heads -> up to 8 devices).
_LLAMA_QKV_PATTERN = "transformer_layer.*self_attention.*(query|key|value).kernel"
_LLAMA_QKV_KERNEL = (None, MODEL_AXIS, BATCH_AXIS)

# Names of each dimension of the sharded kernels, for error messages: (path regex, names).
_GEMMA_DIMENSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"token_embedding/embeddings", ("vocabulary_size", "hidden_dim")),
    (r".*attention/query/kernel", ("num_query_heads", "hidden_dim", "head_dim")),
    (r".*attention/(key|value)/kernel", ("num_key_value_heads", "hidden_dim", "head_dim")),
    (r".*attention_output/kernel", ("num_query_heads", "head_dim", "hidden_dim")),
    (r".*ffw_gating(_2)?/kernel", ("hidden_dim", "intermediate_dim // 2")),
    (r".*ffw_linear/kernel", ("intermediate_dim // 2", "hidden_dim")),
)
_LLAMA_DIMENSIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (r"token_embedding/embeddings", ("vocabulary_size", "hidden_dim")),
    (r"token_embedding/reverse_embeddings", ("hidden_dim", "vocabulary_size")),
    (r".*self_attention/query/kernel", ("hidden_dim", "num_query_heads", "head_dim")),
    (r".*self_attention/(key|value)/kernel", ("hidden_dim", "num_key_value_heads", "head_dim")),
    (r".*attention_output/kernel", ("num_query_heads", "head_dim", "hidden_dim")),
    (r".*feedforward_(intermediate|gate)_dense/kernel", ("hidden_dim", "intermediate_dim")),
    (r".*feedforward_output_dense/kernel", ("intermediate_dim", "hidden_dim")),
)


class ShardingError(ValueError):
    """A model or mesh that cannot be sharded as asked (the message says which dimension)."""


def _check_family(family: str) -> None:
    if family not in FAMILY_BACKBONES:
        raise ValueError(f"Unknown model family {family!r}; expected one of {sorted(FAMILY_BACKBONES)}.")


def device_count() -> int:
    """Number of local devices keras (jax) sees."""
    return len(keras.distribution.list_devices())


def mesh_for(mesh_shape: tuple[int, int] | None = None) -> keras.distribution.DeviceMesh:
    """A ("batch", "model") mesh over ALL local devices; default ``(1, device count)``."""
    devices = keras.distribution.list_devices()
    shape = (1, len(devices)) if mesh_shape is None else tuple(int(n) for n in mesh_shape)
    if len(shape) != 2 or min(shape) < 1:
        raise ShardingError(f"Mesh shape must be two positive sizes (batch, model), got {mesh_shape!r}.")
    if math.prod(shape) != len(devices):
        raise ShardingError(
            f"Mesh shape {shape} (batch x model) covers {math.prod(shape)} devices, but there are "
            f"{len(devices)} local devices: the sizes must multiply to exactly {len(devices)} "
            f"(e.g. (1, {len(devices)})). On a CPU, simulate devices with "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N set before jax is imported."
        )
    return keras.distribution.DeviceMesh(shape=shape, axis_names=(BATCH_AXIS, MODEL_AXIS), devices=devices)


def _llama_layout_map(mesh: keras.distribution.DeviceMesh) -> keras.distribution.LayoutMap:
    """Keras-hub's Llama layout (model-axis splits) with the q/k/v fix, for backbones without one."""
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["token_embedding/embeddings"] = (MODEL_AXIS, BATCH_AXIS)
    layout_map[_LLAMA_QKV_PATTERN] = _LLAMA_QKV_KERNEL
    layout_map["transformer_layer.*attention_output.kernel"] = (MODEL_AXIS, None, BATCH_AXIS)
    layout_map["transformer_layer.*feedforward_intermediate_dense.kernel"] = (BATCH_AXIS, MODEL_AXIS)
    layout_map["transformer_layer.*feedforward_gate_dense.kernel"] = (BATCH_AXIS, MODEL_AXIS)
    layout_map["transformer_layer.*feedforward_output_dense.kernel"] = (MODEL_AXIS, BATCH_AXIS)
    return layout_map


def layout_map_for(
    family: str, backbone_class: type, mesh: keras.distribution.DeviceMesh
) -> keras.distribution.LayoutMap:
    """The ``LayoutMap`` for a family's backbone on ``mesh`` (see the module docstring)."""
    _check_family(family)
    own_map = getattr(backbone_class, "get_layout_map", None)
    if family == "gemma":
        if own_map is None:
            # Gemma 3 (Gemma3Backbone, not a GemmaBackbone subclass) has none in keras-hub 0.32.
            raise ShardingError(f"{backbone_class.__name__} has no get_layout_map; only Gemma 1/2 are supported.")
        return own_map(mesh, model_parallel_dim_name=MODEL_AXIS, data_parallel_dim_name=BATCH_AXIS)
    if own_map is not None:  # Llama / Llama 3 (Vicuna): keras-hub's map, q/k/v fixed.
        layout_map = own_map(mesh, model_parallel_dim_name=MODEL_AXIS, data_parallel_dim_name=BATCH_AXIS)
        _replace(layout_map, _LLAMA_QKV_PATTERN, _LLAMA_QKV_KERNEL)
    else:  # Mistral: same paths and shapes as Llama.
        layout_map = _llama_layout_map(mesh)
    # The untied LM head (vocabulary last); absent (never looked up) when embeddings are tied.
    _replace(layout_map, "token_embedding/reverse_embeddings", (BATCH_AXIS, MODEL_AXIS))
    return layout_map


def _replace(layout_map: keras.distribution.LayoutMap, key: str, axes: tuple[str | None, ...]) -> None:
    # LayoutMap refuses to overwrite a key, and ``key in layout_map`` is always true (its
    # __getitem__ regex-matches and returns None instead of raising KeyError): test its keys.
    if key in set(layout_map):
        del layout_map[key]
    layout_map[key] = axes


def _dimension_name(family: str, path: str, axis: int) -> str:
    table = _GEMMA_DIMENSIONS if family == "gemma" else _LLAMA_DIMENSIONS
    for pattern, names in table:
        if re.fullmatch(pattern, path) and axis < len(names):
            return names[axis]
    return f"dimension {axis}"


def _spec_axes(entry: str | Sequence[str] | None) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def check_divisible(
    family: str, path: str, shape: Sequence[int], axes: Sequence[Any], mesh_sizes: dict[str, int]
) -> None:
    """Raise :class:`ShardingError` if a dimension of ``shape`` doesn't divide by its mesh axes."""
    for axis, (size, entry) in enumerate(zip(shape, axes, strict=False)):
        names = _spec_axes(entry)
        parts = math.prod(mesh_sizes[name] for name in names)
        if parts > 1 and size % parts:
            dimension = _dimension_name(family, path, axis)
            if dimension == "vocabulary_size":
                advice = f"pad the vocabulary to a multiple of {parts}"
            else:
                devices = math.prod(mesh_sizes.values())
                fits = [k for k in range(1, devices + 1) if devices % k == 0 and size % k == 0]
                advice = f"{'x'.join(names)!r} axis sizes that fit: {', '.join(map(str, fits))}"
            raise ShardingError(
                f"Cannot shard {path} {tuple(shape)} over mesh axis {'x'.join(names)!r} of size {parts}: "
                f"its {dimension} ({size}) is not divisible by {parts}. Every sharded dimension "
                "(vocabulary, query heads, key/value heads, FFN width on 'model'; hidden and head "
                f"sizes on 'batch') must divide by its mesh axis: {advice}."
            )


def replicate_shared_kv_heads(
    family: str, path: str, shape: Sequence[int], axes: Sequence[Any], mesh_sizes: dict[str, int]
) -> tuple[Any, ...]:
    """``axes`` with a key/value head dimension its mesh axes do not divide left unsplit.

    With fewer key/value heads than devices (multi-query attention) the heads cannot be split:
    every device keeps them whole and computes the shared keys and values itself.
    """
    replicated = list(axes)
    for axis, (size, entry) in enumerate(zip(shape, axes, strict=False)):
        parts = math.prod(mesh_sizes[name] for name in _spec_axes(entry))
        if parts > 1 and size % parts and _dimension_name(family, path, axis) == "num_key_value_heads":
            replicated[axis] = None
    return tuple(replicated)


class _CheckedModelParallel(keras.distribution.ModelParallel):
    """``ModelParallel`` that names the offending variable/dimension instead of JAX's bare error."""

    def __init__(self, *, family: str, layout_map: keras.distribution.LayoutMap, batch_dim_name: str) -> None:
        super().__init__(layout_map=layout_map, batch_dim_name=batch_dim_name)
        self._family = family
        self._mesh_sizes = dict(zip(self.device_mesh.axis_names, self.device_mesh.shape, strict=True))

    def get_variable_layout(self, variable: Any) -> Any:
        layout = super().get_variable_layout(variable)
        axes = replicate_shared_kv_heads(self._family, variable.path, variable.shape, layout.axes, self._mesh_sizes)
        if axes != tuple(layout.axes):
            layout = keras.distribution.TensorLayout(axes, self.device_mesh)
        check_divisible(self._family, variable.path, variable.shape, layout.axes, self._mesh_sizes)
        return layout


def distribution_for(
    family: str, backbone_class: type, mesh: keras.distribution.DeviceMesh
) -> keras.distribution.ModelParallel:
    """The ``ModelParallel`` distribution (with divisibility checks) for a family on ``mesh``."""
    layout_map = layout_map_for(family, backbone_class, mesh)
    return _CheckedModelParallel(family=family, layout_map=layout_map, batch_dim_name=BATCH_AXIS)


def backbone_class_for(family: str) -> type:
    """The keras-hub backbone class a family's presets are expected to hold."""
    import keras_hub

    _check_family(family)
    return getattr(keras_hub.models, FAMILY_BACKBONES[family])


def preset_backbone_class(preset: str) -> type:
    """The backbone class ``from_preset`` will build, read from the preset's config.json only.

    keras-hub's own preset loader (the one ``Task.from_preset`` uses), so this works for local
    folders, Kaggle handles and Hugging Face (transformers-format) repositories alike.
    """
    from keras_hub.src.utils.preset_utils import get_preset_loader

    return get_preset_loader(preset).check_backbone_class()


def layout_family(family: str, backbone_class: type) -> str:
    """The family whose layout map shards ``backbone_class``. Chat template families that are
    not architectures (ChatML, completion) take their backbone's: SmolLM2 speaks ChatML on a
    Llama 3 backbone."""
    if family in FAMILY_BACKBONES:
        return family
    for architecture, class_name in FAMILY_BACKBONES.items():
        if backbone_class.__name__ == class_name:
            return architecture
    raise ShardingError(f"{backbone_class.__name__} has no layout map here; serve it on one device (mesh 1,1).")


def _family_base(family: str) -> type:
    # Llama 3 and Vicuna share LlamaBackbone's variables and map: accept either class for both.
    import keras_hub

    return keras_hub.models.LlamaBackbone if family in ("llama3", "vicuna") else backbone_class_for(family)


def load_sharded_causal_lm(
    preset: str,
    *,
    family: str,
    mesh_shape: tuple[int, int] | None = None,
    dtype: str | None = None,
) -> keras_hub.models.CausalLM:
    """``CausalLM.from_preset(preset)`` with its weights sharded over all local devices.

    ``mesh_shape`` is (batch, model), default (1, device count). On one device (mesh (1, 1))
    this is a plain ``from_preset``. The distribution is active only while loading (keras keeps
    it per thread): the variables keep their shardings, and ``generate()`` later runs as one
    SPMD program over the mesh. Raises :class:`ShardingError` when the mesh doesn't match the
    device count, the preset isn't of ``family``'s architecture, or a sharded dimension
    (vocabulary, heads, FFN width...) doesn't divide by its mesh axis.
    """
    from inference.keras_build import causal_lm_from_preset

    mesh = mesh_for(mesh_shape)
    kwargs: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    if math.prod(mesh.shape) == 1:
        return causal_lm_from_preset(preset, **kwargs)
    backbone_class = preset_backbone_class(preset)
    family = layout_family(family, backbone_class)
    if not issubclass(backbone_class, _family_base(family)):
        # Checked before any weight exists: with another family's map nothing would match and
        # every device would get a full copy of the model.
        raise ShardingError(
            f"{preset} holds a {backbone_class.__name__}, not a {_family_base(family).__name__} "
            f"(family {family!r}): its variables would not match the {family} layout map."
        )
    distribution = distribution_for(family, backbone_class, mesh)
    try:
        with distribution.scope():
            return causal_lm_from_preset(preset, **kwargs)
    except ValueError as error:
        # jax.errors doesn't export IndivisibleError (jax._src.sharding); our layout check runs
        # first and names the variable, this only catches a shape it could not see.
        if type(error).__name__ != "IndivisibleError":
            raise
        raise ShardingError(f"Cannot shard {preset} over mesh {tuple(mesh.shape)}: {error}") from error


def first_block(lm: keras_hub.models.CausalLM) -> keras.layers.Layer:
    """The first transformer layer (``decoder_block_0`` / ``transformer_layer_0``)."""
    return lm.backbone.transformer_layers[0]


def describe_block_shardings(lm: keras_hub.models.CausalLM) -> list[tuple[str, tuple[int, ...], str]]:
    """(path, shape, sharding spec) for the token embedding and every variable of the first block."""
    variables = [*lm.backbone.get_layer("token_embedding").weights, *first_block(lm).weights]
    rows = []
    for variable in variables:
        sharding = variable.value.sharding
        spec = getattr(sharding, "spec", None)
        rows.append((variable.path, tuple(variable.shape), str(spec) if spec is not None else f"{sharding}"))
    return rows
