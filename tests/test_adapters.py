"""LoRA adapters served unmerged (inference/forward/adapters.py): factors of an adapter's change,
stacked over an engine's adapters; the families' passes with a different adapter on each row of
one batch, each row's logits those of its adapter merged into the kernels; the engine serving
them, each adapter's greedy text that of its merged model; a model host serving a fine-tuned
preset in its base's engine (inference/hosts/engines.py), reading its factors from beside its
preset where they were saved, the roster linking them, and ``bench_engine --memory --adapter``
measuring it."""

from __future__ import annotations

import json
import operator
import os
import shutil
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import keras_hub
import numpy as np
import pytest

from inference import services
from inference.building.checkpoints import write_arena_metadata
from inference.building.demo_models import SYSTEM_PROMPT
from inference.chat_templates import ChatTurn, render_prompt, stop_strings
from inference.engine import Engine
from inference.engine.adapter_engine import AdapterEngine
from inference.engine.prefix_cache import NO_MATCH, PrefixCache, PrefixMatch
from inference.forward import gemma3, llama
from inference.forward.adapters import Adapted, factors_of, save_factors, stack, stack_adapters
from inference.forward.attention import cache_shapes
from inference.hosts import engines
from inference.models import LLM
from inference.registry import read_preset

PRESETS = Path(__file__).resolve().parents[1] / "inference" / "presets"
LLAMA_PRESET, GEMMA_PRESET = PRESETS / "llama3-calendar", PRESETS / "gemma-calendar"
ENGINE_BUCKETS, ENGINE_WINDOWS = (128,), (128,)
NEW_TOKENS = 24
ROWS, LENGTH, POSITIONS = 3, 5, 8
# The kernels the arena's fixers change (query, value and the feed-forward's three), in the
# families' block_kernels order, and the rank of the tests' changes to them.
CHANGED = (0, 2, 4, 5, 6)
RANK = 4
# Each block's layers holding block_kernels's seven kernels, by family.
LLAMA_KERNELS = (
    "_self_attention_layer._query_dense",
    "_self_attention_layer._key_dense",
    "_self_attention_layer._value_dense",
    "_self_attention_layer._output_dense",
    "_feedforward_gate_dense",
    "_feedforward_intermediate_dense",
    "_feedforward_output_dense",
)
GEMMA3_KERNELS = (
    "attention.query_dense",
    "attention.key_dense",
    "attention.value_dense",
    "attention.output_dense",
    "gating_ffw",
    "gating_ffw_2",
    "ffw_linear",
)


def test_an_adapters_change_is_two_factors_of_its_rank() -> None:
    rng = np.random.default_rng(0)
    delta = (rng.normal(size=(20, 3)) @ rng.normal(size=(3, 30))).astype(np.float32)
    down, up = factors_of(delta)
    assert down.shape == (20, 3) and up.shape == (3, 30) and down.dtype == np.float32
    np.testing.assert_allclose(down @ up, delta, rtol=1e-5, atol=1e-5)
    down, up = factors_of(np.zeros((4, 6), np.float32))  # No change: one zero factor each.
    assert down.shape == (4, 1) and not down.any() and not up.any()


def test_stacked_factors_keep_adapter_zero_and_an_unchanged_kernel_at_zero() -> None:
    rng = np.random.default_rng(1)
    first = (rng.normal(size=(6, 2)).astype(np.float32), rng.normal(size=(2, 5)).astype(np.float32))
    third = (rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=(3, 5)).astype(np.float32))
    stacked = stack([first, None, third])
    assert stack([None, None]) is None  # No adapter changes the kernel.
    assert stacked is not None
    down, up = stacked
    assert down.shape == (4, 6, 3) and up.shape == (4, 3, 5)
    products = np.einsum("aik,ako->aio", down, up)
    assert not products[0].any() and not products[2].any()  # The base itself; an adapter that leaves it.
    np.testing.assert_allclose(products[1], first[0] @ first[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(products[3], third[0] @ third[1], rtol=1e-5, atol=1e-6)


def random_changes(kernels: list[tuple[Any, ...]], adapters: int, seed: int) -> list[list[list[np.ndarray | None]]]:
    """Per adapter, per block, per kernel: a change of rank RANK to the changed kernels of the
    upper blocks (None elsewhere), as large as a trained adapter's relative to its kernel."""
    rng = np.random.default_rng(seed)
    changes = []
    for _ in range(adapters):
        per_block = []
        for index, block in enumerate(kernels):
            per_kernel: list[np.ndarray | None] = []
            for which, kernel in enumerate(block):
                if which not in CHANGED or index < len(kernels) // 2:
                    per_kernel.append(None)
                    continue
                ins, outs = kernel.shape
                scale = 0.3 * float(np.std(np.asarray(kernel)))
                change = rng.normal(size=(ins, RANK)) @ rng.normal(size=(RANK, outs)) * scale / np.sqrt(RANK)
                per_kernel.append(change.astype(np.float32))
            per_block.append(per_kernel)
        changes.append(per_block)
    return changes


def factored(changes: list[list[list[np.ndarray | None]]]) -> list[list[list[tuple[np.ndarray, np.ndarray] | None]]]:
    """Each adapter's changes as factors (``factors_of``), per block, per kernel."""
    return [[[None if c is None else factors_of(c) for c in block] for block in adapter] for adapter in changes]


def adapted(rows: list[int], changes: list[list[list[np.ndarray | None]]]) -> Adapted:
    """Every adapter's factors stacked, kernel by kernel, and each row's adapter."""
    on_device = jax.tree_util.tree_map(jnp.asarray, stack_adapters(factored(changes)))
    return Adapted(jnp.asarray(rows, jnp.int32), on_device)


def kernel_variables(backbone: Any, layers: tuple[str, ...]) -> list[list[Any]]:
    """Per block, the variables of its seven kernels (the layers' own, without any LoRA)."""
    return [[operator.attrgetter(layer)(block)._kernel for layer in layers] for block in backbone.transformer_layers]


def zero_caches(layers: int, rows: int, kv_heads: int, head_dim: int) -> tuple[Any, ...]:
    key, value = cache_shapes(rows, kv_heads, head_dim, POSITIONS)
    return tuple(jnp.zeros(shape, jnp.float32) for _ in range(layers) for shape in (key, value))


def merged_logits(
    variables: list[list[Any]],
    unflatten: Callable[[np.ndarray, Any], np.ndarray],
    change: list[list[np.ndarray | None]],
    run: Callable[[], Any],
) -> Any:
    """``run()``'s logits with ``change`` added into the kernels' variables (then restored)."""
    saved = [[np.asarray(v.value) for v in block] for block in variables]
    try:
        for block, deltas in zip(variables, change, strict=True):
            for variable, delta in zip(block, deltas, strict=True):
                if delta is not None:
                    variable.assign(np.asarray(variable.value) + unflatten(delta, variable))
        return run()
    finally:
        for block, values in zip(variables, saved, strict=True):
            for variable, value in zip(block, values, strict=True):
                variable.assign(value)


def rows_match_their_merged_adapters(
    forward: Callable[[Adapted | None], Any],
    variables: list[list[Any]],
    unflatten: Callable[[np.ndarray, Any], np.ndarray],
    kernels: list[tuple[Any, ...]],
) -> None:
    """Rows 0, 1, 2 run the base, adapter 1 and adapter 2 in one batch; each row's logits are
    those of the batch run with its adapter merged, and the base's with none."""
    changes = random_changes(kernels, adapters=2, seed=3)
    together = np.asarray(forward(adapted([0, 1, 2], changes)))
    base = np.asarray(forward(None))
    np.testing.assert_allclose(together[0], base[0], rtol=1e-5, atol=1e-5)
    for row in (1, 2):
        merged = np.asarray(merged_logits(variables, unflatten, changes[row - 1], lambda: forward(None)))
        assert np.abs(merged[row] - base[row]).max() > 1e-2  # The change changes the logits...
        np.testing.assert_allclose(together[row], merged[row], rtol=2e-4, atol=2e-4)  # ...as merged.


@pytest.mark.parametrize("layout", ["token-major", "feature-major"])
def test_llama_rows_run_their_own_adapters_in_one_batch(layout: llama.Layout) -> None:
    lm = keras_hub.models.CausalLM.from_preset(str(LLAMA_PRESET))
    backbone = lm.backbone
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, backbone.vocabulary_size, (ROWS, LENGTH)), jnp.int32)
    head_dim = backbone.hidden_dim // backbone.num_query_heads

    def forward(adapters: Adapted | None) -> Any:
        caches = zero_caches(backbone.num_layers, ROWS, backbone.num_key_value_heads, head_dim)
        weights = llama.llama_weights(lm, layout)
        logits, _ = llama.llama_forward(lm, tokens, caches, jnp.zeros(ROWS, jnp.int32), weights, layout, adapters)
        return logits

    variables = kernel_variables(backbone, LLAMA_KERNELS)

    def unflatten(delta: np.ndarray, variable: Any) -> np.ndarray:  # block_kernels flattens by reshaping
        return delta.reshape(variable.shape)

    kernels = [tuple(np.asarray(k) for k in block) for block in llama.block_kernels(lm)]
    rows_match_their_merged_adapters(forward, variables, unflatten, kernels)


def test_gemma3_rows_run_their_own_adapters_in_one_batch() -> None:
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=64, image_size=None, num_layers=4, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=16, intermediate_dim=24, head_dim=8, use_post_ffw_norm=True, use_post_attention_norm=True,
        use_sliding_window_attention=True, sliding_window_size=4,
    )  # fmt: skip
    lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=None)
    tokens = jnp.asarray(np.random.default_rng(6).integers(0, 64, (ROWS, LENGTH)), jnp.int32)

    def forward(adapters: Adapted | None) -> Any:
        caches = zero_caches(backbone.num_layers, ROWS, backbone.num_key_value_heads, backbone.head_dim)
        logits, _ = gemma3.gemma3_forward(lm, tokens, caches, jnp.zeros(ROWS, jnp.int32), (), adapters)
        return logits

    variables = kernel_variables(backbone, GEMMA3_KERNELS)

    def unflatten(delta: np.ndarray, variable: Any) -> np.ndarray:
        if len(variable.shape) == 3 and variable.shape[1] == backbone.hidden_dim:  # [heads, in, head_dim]
            heads, ins, head_dim = variable.shape
            return delta.reshape(ins, heads, head_dim).transpose(1, 0, 2)
        return delta.reshape(variable.shape)

    kernels = [tuple(np.asarray(k) for k in block) for block in gemma3.block_kernels(lm)]
    rows_match_their_merged_adapters(forward, variables, unflatten, kernels)


def test_the_passes_trace_with_adapters_in_jit() -> None:
    """The engine runs the passes in jit: the adapters' indices are traced, not static."""
    lm = keras_hub.models.CausalLM.from_preset(str(LLAMA_PRESET))
    backbone = lm.backbone
    kernels = [tuple(np.asarray(k) for k in block) for block in llama.block_kernels(lm)]
    changes = random_changes(kernels, adapters=1, seed=4)
    head_dim = backbone.hidden_dim // backbone.num_query_heads
    tokens = jnp.ones((2, 1), jnp.int32)
    weights = llama.llama_weights(lm, "token-major")

    @jax.jit
    def step(rows: Any) -> Any:
        caches = zero_caches(backbone.num_layers, 2, backbone.num_key_value_heads, head_dim)
        together = adapted([0, 0], changes)._replace(rows=rows)
        logits, _ = llama.llama_forward(lm, tokens, caches, jnp.zeros(2, jnp.int32), weights, "token-major", together)
        return logits

    base, mixed = step(jnp.asarray([0, 0], jnp.int32)), step(jnp.asarray([0, 1], jnp.int32))
    np.testing.assert_allclose(mixed[0], base[0], rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(mixed[1] - base[1])).max() > 1e-3


def test_a_cached_prefix_serves_only_the_adapter_that_computed_it() -> None:
    cache = PrefixCache(entries=2, capacity=64, block=16)
    prompt = list(range(40))
    row = cache.store(prompt, NO_MATCH, adapter=1)
    assert row is not None
    assert cache.lookup(prompt, limit=40) == NO_MATCH  # The base's keys and values differ.
    assert cache.lookup(prompt, limit=40, adapter=2) == NO_MATCH
    assert cache.lookup(prompt, limit=40, adapter=1) == PrefixMatch(entry=row, length=32)
    assert cache.store(prompt, NO_MATCH, adapter=0) not in (None, row)  # The base's gets a row of its own.


def greedy(engine: Engine, prompt: str, adapter: int = 0) -> Any:
    """A greedy request of the demo model's reply length, stopping at its turn's end."""
    family = read_preset(LLAMA_PRESET).family
    return engine.submit(prompt, max_new_tokens=NEW_TOKENS, stop_strings=stop_strings(family), adapter=adapter)


def merged_text(lm: keras_hub.models.CausalLM, change: list[list[np.ndarray | None]], prompt: str) -> str:
    """The greedy text of an engine on ``lm`` with ``change`` merged into its kernels."""
    variables = kernel_variables(lm.backbone, LLAMA_KERNELS)

    def text() -> str:
        with Engine(lm, slots=1, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS) as engine:
            return greedy(engine, prompt).result()

    return merged_logits(variables, lambda delta, variable: delta.reshape(variable.shape), change, text)


def test_an_engine_serves_each_adapter_as_its_merged_model_in_one_batch() -> None:
    """The base and two adapters, one request each on the same prompt, decoded together: each
    text is what an engine on that adapter merged into the kernels writes; the prompt's cached
    prefix of one adapter is not another's."""
    lm = keras_hub.models.CausalLM.from_preset(str(LLAMA_PRESET))
    kernels = [tuple(np.asarray(k) for k in block) for block in llama.block_kernels(lm)]
    changes = random_changes(kernels, adapters=2, seed=7)
    prompt = render_prompt(
        read_preset(LLAMA_PRESET).family, SYSTEM_PROMPT, [ChatTurn("user", "Lunch with Ann at noon")]
    )
    with Engine(lm, slots=3, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS, adapters=factored(changes)) as engine:
        requests = [greedy(engine, prompt, adapter) for adapter in (0, 1, 2)]
        texts = [request.result() for request in requests]
        assert engine.peak_active_slots == 3  # All three in one batch.
    with Engine(lm, slots=1, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS) as base:
        assert texts[0] == greedy(base, prompt).result()
    for adapter in (1, 2):
        assert texts[adapter] == merged_text(lm, changes[adapter - 1], prompt)
    assert texts[1] != texts[0] or texts[2] != texts[0]  # The adapters write something else.


def test_adapters_are_refused_where_the_pass_or_the_request_cannot_take_them() -> None:
    lm = keras_hub.models.CausalLM.from_preset(str(LLAMA_PRESET))
    kernels = [tuple(np.asarray(k) for k in block) for block in llama.block_kernels(lm)]
    changes = factored(random_changes(kernels, adapters=1, seed=8))
    with pytest.raises(ValueError, match="blocks"):
        Engine(lm, slots=1, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS, adapters=[changes[0][:-1]])
    with pytest.raises(ValueError, match="architecture"):  # A host asked to serve another model as one.
        engines.adapter_factors(lm, str(PRESETS / "mistral-calendar"))
    gemma = keras_hub.models.CausalLM.from_preset(str(GEMMA_PRESET))
    with pytest.raises(ValueError, match="takes no LoRA adapters"):
        Engine(gemma, slots=1, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS, adapters=changes)
    engine = Engine(lm, slots=1, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS, adapters=changes)
    for adapter in (2, -1, True, "1"):
        with pytest.raises(ValueError, match="adapter must be"):
            engine.submit("Hi", max_new_tokens=4, adapter=adapter)  # type: ignore[arg-type]
    engine.shutdown()


@pytest.fixture(scope="module")
def tuned_preset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model fine-tuned, as the project's fixers are saved: its preset with a low-rank
    change merged into the upper blocks' kernels, and metadata naming the preset it came from."""
    lm = keras_hub.models.CausalLM.from_preset(str(LLAMA_PRESET))
    kernels = [tuple(np.asarray(k) for k in block) for block in llama.block_kernels(lm)]
    change = random_changes(kernels, adapters=1, seed=9)[0]
    for block, deltas in zip(kernel_variables(lm.backbone, LLAMA_KERNELS), change, strict=True):
        for variable, delta in zip(block, deltas, strict=True):
            if delta is not None:
                variable.assign(np.asarray(variable.value) + delta.reshape(variable.shape))
    path = tmp_path_factory.mktemp("presets") / "llama3-calendar-tuned"
    lm.save_to_preset(str(path))
    for name in ("config.json", "task.json"):  # As the fixers' presets are built.
        shutil.copy(LLAMA_PRESET / name, path / name)
    arena = json.loads((LLAMA_PRESET / "metadata.json").read_text())["fix_arena"]
    write_arena_metadata(path, {**arena, "fine_tuned": {"model": path.name, "base": LLAMA_PRESET.name}})
    return path


def test_a_host_serves_a_fine_tuned_model_in_its_base_s_engine(tuned_preset: Path) -> None:
    """The tuned model's requests run as an adapter of its base's engine, writing what the tuned
    preset writes in an engine of its own; stopping the base stops serving both."""
    family = read_preset(LLAMA_PRESET).family
    base = engines.ModelSpec("base", family, str(LLAMA_PRESET), slots=2, adapters=(str(tuned_preset),))
    tuned = engines.ModelSpec("tuned", family, str(tuned_preset), slots=2, adapter_of=base)
    prompt = render_prompt(family, SYSTEM_PROMPT, [ChatTurn("user", "Dinner with Bo on May 2 at 7pm")])
    try:
        view = engines.engine_for(tuned)
        assert isinstance(view, AdapterEngine) and view.engine is engines.engine_for(base)
        assert engines.engine_for(tuned) is view and engines.running_specs()["tuned"] == tuned
        served = view.submit(prompt, max_new_tokens=NEW_TOKENS, stop_strings=stop_strings(family)).result()
        as_base = greedy(view.engine, prompt).result()
        assert (view.active_slots, view.queued) == (0, 0)
        assert engines.shutdown_where(lambda spec: spec.name == "base") == ["base", "tuned"]
    finally:
        engines.shutdown_all()
    alone = keras_hub.models.CausalLM.from_preset(str(tuned_preset))
    with Engine(alone, slots=1, buckets=ENGINE_BUCKETS, windows=ENGINE_WINDOWS) as engine:
        assert served == greedy(engine, prompt).result()
    assert served != as_base  # The adapter writes its own text.


@pytest.mark.django_db
def test_a_fine_tuned_model_is_served_by_its_base_s_engine_where_both_are_hosted_together(
    tuned_preset: Path, settings: Any
) -> None:
    settings.ARENA_FIXERS_AS_ADAPTERS = True
    settings.GENERATION_BACKEND = "celery"  # An inference host's workers: the models of their queue.
    base = LLM.objects.create(name="demo", family="llama3", preset=str(LLAMA_PRESET), queue="q")
    tuned = LLM.objects.create(name="demo-tuned", family="llama3", preset=str(tuned_preset), queue="q")
    LLM.objects.create(name="mistral", family="mistral", preset=str(PRESETS / "mistral-calendar"), queue="q")
    assert services.model_spec(tuned).adapter_of == services.model_spec(base)
    assert services.model_spec(base).adapters == (str(tuned_preset),)
    # Slots for each model it serves: as many replies of each at once as engines of their own take.
    assert services.model_spec(base).slots == 2 * settings.ARENA_ENGINE_SLOTS
    tuned.queue = "elsewhere"  # Hosted by other workers: an engine of its own.
    tuned.save()
    assert services.model_spec(tuned).adapter_of is None and services.model_spec(base).adapters == ()
    assert services.model_spec(base).slots == settings.ARENA_ENGINE_SLOTS
    settings.GENERATION_BACKEND = "in-process"  # The embedded arena serves every model in one process.
    assert services.model_spec(tuned).adapter_of == services.model_spec(base)
    settings.ARENA_FIXERS_AS_ADAPTERS = False
    assert services.model_spec(tuned).adapter_of is None and services.model_spec(base).adapters == ()


def test_bench_engine_measures_a_base_serving_its_fine_tuned_model_as_an_adapter(
    tuned_preset: Path, tmp_path: Path
) -> None:
    """``bench_engine --memory --adapter``, as docs/models.md measures a fixer served by its
    base's engine: the engine serves the tuned preset as its adapter, with slots for each model.
    In a process of its own, as the command is run (it measures the whole process)."""
    repo = Path(__file__).resolve().parents[1]
    options = ["--memory", "--json", "--slots", "2", "--preset", str(LLAMA_PRESET), "--adapter", str(tuned_preset)]
    done = subprocess.run(
        [sys.executable, "manage.py", "bench_engine", *options],
        cwd=repo,
        env={**os.environ, "ARENA_VAR_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["preset"], result["adapters"], result["slots"]) == (LLAMA_PRESET.name, [tuned_preset.name], 4)
    assert result["compilations"] > 0 and result["model_mib"] > 0


def test_a_host_reads_an_adapter_s_factors_from_beside_its_preset(
    tuned_preset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a fine-tuned preset's build saved its factors (as build_fixer_preset does), a host
    reads them, not the whole tuned model; factors that do not fit the base are refused."""
    lm = keras_hub.models.CausalLM.from_preset(str(LLAMA_PRESET))
    computed = engines.adapter_factors(lm, str(tuned_preset))  # No file: from the merged preset.
    saved = tmp_path / tuned_preset.name
    shutil.copytree(tuned_preset, saved)
    save_factors(saved / engines.ADAPTER_FACTORS, computed)

    def unread(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("The tuned model was read.")

    monkeypatch.setattr(keras_hub.models.CausalLM, "from_preset", unread)
    read = engines.adapter_factors(lm, str(saved))
    assert [[pair is None for pair in block] for block in read] == [[p is None for p in block] for block in computed]
    for block, expected in zip(read, computed, strict=True):
        for pair, want in zip(block, expected, strict=True):
            if pair is not None:
                np.testing.assert_array_equal(pair[0], want[0])
                np.testing.assert_array_equal(pair[1], want[1])
    save_factors(saved / engines.ADAPTER_FACTORS, computed[:-1])  # One block short.
    with pytest.raises(ValueError, match="not this model's"):
        engines.adapter_factors(lm, str(saved))
