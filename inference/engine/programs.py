"""The jitted functions of one model architecture and configuration (``Programs``): init,
prefill, store, insert, resize and the generate step that advances every slot; shared by every
engine with the same architecture and configuration (``programs_for``), whatever its weights. The decode thread
(``inference.engine.scheduler``) calls them; the family's in-place forward pass, where there is
one, comes from ``inference.forward``."""

from __future__ import annotations

import collections
import contextlib
import json
import threading
import weakref
from typing import TYPE_CHECKING, Any

from inference.engine.sampling import sample_tokens
from inference.streaming import _model_state, stateless_model

if TYPE_CHECKING:
    import keras_hub

# After the chunk in prefill_chunk's integer argument: last, start, length, slot, the pool row
# read, top_k, the two words of the PRNG key and the request's LoRA adapter (0: none).
CHUNK_FIELDS = 9


def _adapted(adapters: Any, rows: Any) -> dict[str, Any]:
    """The forward pass's ``adapted`` keyword, to splat: the engine's stacked LoRA factors and
    each row's adapter; nothing for an engine without adapters (its programs trace as they
    would without them)."""
    from inference.forward.adapters import Adapted

    return {"adapted": Adapted(rows, adapters)} if adapters else {}


class Programs:
    """The jitted functions for one model and configuration: init, prefill (keras-hub's or a
    chunk after a cached prefix, into the staging row), store (staging row into a prefix pool
    row), insert (staging row into a slot), resize (the slot caches to another window) and
    generate.

    The slot caches are a tuple of parts, each with its positions on one axis
    (``position_axes``): for the in-place families, per layer, keys and values in
    ``inference.forward.attention``'s layout; otherwise one array shaped like keras-hub's cache
    with a leading slot axis. Shared by every Engine with the same (slots, steps per dispatch,
    context, prefix rows and capacity) and the same architecture, so a second engine of the
    same model, or of a model with other weights in the same architecture (a fine-tuned fixer
    and its base), compiles nothing new: the functions take the variables as arguments. A real
    model's programs hold tens of megabytes each (docs/models.md).
    """

    def __init__(
        self,
        lm: keras_hub.models.CausalLM,
        slots: int,
        steps: int,
        context: int,
        prefix_rows: int,
        capacity: int,
        cache_dtype: str | None = None,
        relayout: bool = True,
    ) -> None:
        import jax
        import jax.numpy as jnp
        import keras_hub

        from inference.engine.stored_dtype import embedding_variables
        from inference.forward import adapter_kernels, in_place_decoder
        from inference.forward.attention import KEY_POSITION_AXIS, VALUE_POSITION_AXIS, cache_shapes

        if not (hasattr(lm, "_build_cache") and hasattr(lm, "call_with_cache")):
            raise TypeError(f"{type(lm).__name__} has no cached decoding (_build_cache).")
        # The models of the engines sharing these programs, weakly: any of them traces.
        self._models: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.attach(lm)
        model_ref = self.model
        # Where the token embedding's variables lie in the model's state (trainable, then
        # non-trainable): the same in every model of the architecture.
        tables = embedding_variables(lm)
        self._tables = [
            (part, index)
            for part, variables in enumerate((lm.trainable_variables, lm.non_trainable_variables))
            for index, variable in enumerate(variables)
            if any(variable is table for table in tables)
        ]
        greedy_sampler = keras_hub.samplers.GreedySampler()
        # Python bodies run only when jax traces them: traces per function, for diagnostics.
        self.traces: collections.Counter[str] = collections.Counter()

        def stateless(state: tuple[list[Any], list[Any]]) -> tuple[Any, Any]:
            return stateless_model(model_ref, state)

        def cache_spec(length: int) -> Any:
            def build(state: Any) -> Any:
                model, scope = stateless(state)
                with scope:
                    return model._build_cache(jnp.zeros((1, length), jnp.int32))[1]

            return jax.eval_shape(build, _model_state(lm))

        # Gemma, Gemma 3, Llama 3 and Mistral get a forward pass of the engine's own that updates
        # per-layer caches in place (inference.forward); other families go through keras-hub's
        # call_with_cache and _build_cache.
        # ``relayout``: whether the pass may multiply by the kernels laid out a second time where
        # that is faster (the Llama pass's feature-major; False for compact engines).
        decoder = in_place_decoder(lm, context, relayout=relayout)
        if decoder is not None and decoder.cache_layout is not None:
            # Gemma 3's _build_cache and call_with_cache also take image inputs: it only runs
            # through its own forward pass (keras-hub's layout here: the engine lays it out).
            layers, kv_heads, head_dim, dtype = decoder.cache_layout(lm)
            one = two = jax.ShapeDtypeStruct((1, layers, 2, 2, kv_heads, head_dim), dtype)
            length_axes = [2]
        else:
            # keras-hub caches are [1, layers, 2, length, kv_heads, head_dim]; find the length
            # axis rather than assume it, by building (abstractly) caches of two lengths.
            one, two = cache_spec(2), cache_spec(3)  # Not 1: keras warns about a softmax over 1 key.
            length_axes = [i for i, (a, b) in enumerate(zip(one.shape, two.shape, strict=True)) if a != b]
        if len(length_axes) != 1:
            raise TypeError(f"Cannot find the sequence axis of {type(lm).__name__}'s cache {one.shape}.")
        if one.shape != (1, lm.backbone.num_layers, 2, 2, *one.shape[4:]):  # Not keras-hub's layout.
            decoder = None
        self.in_place = in_place = decoder is not None
        # Whether the pass takes LoRA adapters per row (an engine may then serve some).
        self.adapters = in_place and adapter_kernels(lm) is not None
        forward, prepare, self.layout = decoder[:3] if decoder is not None else (None, None, None)
        if in_place:
            _, layers, _, _, kv_heads, head_dim = one.shape
            self.position_axes = (KEY_POSITION_AXIS, VALUE_POSITION_AXIS) * layers
        else:
            self.position_axes = (length_axes[0] + 1,)  # In keras-hub's cache after the slot axis.
        axes = self.position_axes
        # The in-place caches' dtype: ``cache_dtype`` where given (inference.forward.attention),
        # else the model's; keras-hub's own caches stay in the model's.
        self.cache_dtype = jnp.dtype(cache_dtype if in_place and cache_dtype else one.dtype)

        def caches(rows: int, length: int) -> tuple[Any, ...]:
            """Zeroed caches of ``rows`` rows and ``length`` positions."""
            if in_place:
                key, value = cache_shapes(rows, kv_heads, head_dim, length)
                return tuple(jnp.zeros(shape, self.cache_dtype) for _ in range(layers) for shape in (key, value))
            shape = tuple(length if i == length_axes[0] else n for i, n in enumerate(one.shape))
            return (jnp.zeros((rows, *shape), one.dtype),)

        def fitted_one(part: Any, length: int, axis: int) -> Any:
            """``part`` cut or zero-padded to ``length`` positions along ``axis``."""
            have = part.shape[axis]
            if length <= have:
                return jax.lax.slice_in_dim(part, 0, length, axis=axis)
            pad = [(0, 0)] * part.ndim
            pad[axis] = (0, length - have)
            return jnp.pad(part, pad)

        def fitted(parts: tuple[Any, ...], length: int) -> tuple[Any, ...]:
            """Each part cut or zero-padded to ``length`` positions."""
            return tuple(fitted_one(part, length, axis) for part, axis in zip(parts, axes, strict=True))

        def put_row(parts: tuple[Any, ...], rows: tuple[Any, ...], index: Any) -> tuple[Any, ...]:
            """``rows`` (one row each) written into row ``index`` of ``parts``, from position 0."""
            return tuple(
                jax.lax.dynamic_update_slice(part, row, (index,) + (0,) * (part.ndim - 1))
                for part, row in zip(parts, rows, strict=True)
            )

        def init(state: Any, window: int) -> tuple[Any, ...]:
            # Takes the variables so that the arrays land on the devices they live on.
            self.traces["init"] += 1
            pool: Any = None
            if in_place:
                pool = caches(max(prefix_rows, 1), capacity)  # A row to read even when off.
            slot_state = {
                "tokens": jnp.zeros((slots,), jnp.int32),
                "positions": jnp.zeros((slots,), jnp.int32),
                "keys": jnp.zeros((slots, 2), jnp.uint32),
                "temperature": jnp.zeros((slots,), jnp.float32),
                "top_k": jnp.zeros((slots,), jnp.int32),
                "top_p": jnp.ones((slots,), jnp.float32),
                "adapter": jnp.zeros((slots,), jnp.int32),  # Each slot's LoRA adapter (0: none).
            }
            return caches(slots, window), caches(1, context), slot_state, pool

        def start(
            slot_state: dict[str, Any], slot: Any, last: Any, length: Any, key: Any, *params: Any, adapter: Any = 0
        ) -> Any:
            # The slot starts from the prompt's last token, at its own index: the first decode
            # step runs it and samples the first new token, as keras-hub's generate loop does
            # after _build_cache (so greedy output stays generate()'s).
            temperature, top_k, top_p = params
            updates = {
                "tokens": last,
                "positions": length - 1,
                "keys": key,
                "temperature": temperature,
                "top_k": top_k,
                "top_p": top_p,
                "adapter": adapter,
            }
            return {name: value.at[slot].set(updates[name]) for name, value in slot_state.items()}

        def prefill(
            state: Any,
            staging: Any,
            slot_state: dict[str, Any],
            token_ids: Any,
            length: Any,
            slot: Any,
            temperature: Any,
            top_k: Any,
            top_p: Any,
            key: Any,
        ) -> tuple[Any, dict[str, Any]]:
            """keras-hub's own prefill (families without an in-place forward): its cache of the
            whole prompt at the start of the staging row (beyond the prompt, whatever an earlier
            request left, masked by the causal mask until overwritten)."""
            self.traces[f"prefill[{token_ids.shape[1]}]"] += 1
            model, scope = stateless(state)
            with scope:
                _, prompt_cache = model._build_cache(token_ids)
            staging = put_row(staging, (prompt_cache[None].astype(staging[0].dtype),), 0)
            last = jax.lax.dynamic_index_in_dim(token_ids[0], length - 1, keepdims=False)
            slot_state = start(slot_state, slot, last, length, key, temperature, top_k, top_p)
            return staging, slot_state

        def prefill_chunk(
            state: Any,
            weights: tuple[Any, ...],
            adapters: Any,
            staging: Any,
            slot_state: dict[str, Any],
            pool: Any,
            integers: Any,
            reals: Any,
            prefix: int,
        ) -> tuple[Any, dict[str, Any]]:
            """Prefill after a cached prefix (in-place families), into the staging row.

            ``integers`` (uint32, filled by ``Engine._prefill``: one transfer instead of ten) holds
            the chunk, then ``last``, ``start``, ``length``, ``slot``, the pool row to read,
            ``top_k``, the PRNG key and the request's adapter; ``reals`` the temperature and
            top-p. ``adapters``: the engine's stacked LoRA factors (``Adapted.factors``), or ()
            for none. The prompt's first positions come from the row read (its first ``start``
            positions hold the prompt's cached prefix; 0 for none), and the chunk (the prompt's
            tokens after it but the last, padded) runs at ``start`` onwards. Its positions are
            then copied into the staging row (``insert`` takes them to the slot, ``store`` to a
            pool row); the slot starts from ``last``. ``prefix`` (static: one of
            ``SHORT_PREFIXES`` or the pool's capacity) bounds ``start``: the chunk attends over
            ``prefix`` + its own positions. The pool
            is only read here: a program that reads a row and writes another of the same pool
            made XLA copy the whole pool first (about 380 MB a prefill for SmolLM2).
            """
            size = integers.shape[0] - CHUNK_FIELDS
            self.traces[f"prefill[{size}, {prefix}]"] += 1
            fields = integers[size:]
            chunk = integers[None, :size].astype(jnp.int32)
            last, begin, length, slot, read_row, top_k = (fields[i].astype(jnp.int32) for i in range(6))
            key, (temperature, top_p) = fields[6:8], (reals[0], reals[1])
            adapter = fields[8].astype(jnp.int32)
            # The positions the prefill touches: the host keeps begin (at most the prefix) + size
            # within the context.
            span = min(prefix + size, context)
            kept = min(prefix, span)  # Pool positions the prefill can use.
            model, scope = stateless(state)
            with scope:
                row = tuple(jax.lax.dynamic_index_in_dim(part, read_row, axis=0) for part in pool)
                _, local = forward(
                    model,
                    chunk,
                    fitted(fitted(row, kept), span),
                    begin[None],
                    weights,
                    **_adapted(adapters, adapter[None]),
                )
            # Beyond the prompt, the staging row keeps padding's keys and values: masked until
            # overwritten.
            staging = put_row(staging, local, 0)
            slot_state = start(slot_state, slot, last, length, key, temperature, top_k, top_p, adapter=adapter)
            return staging, slot_state

        def fit_part(part: Any, length: int, axis: int) -> Any:
            """One part cut or zero-padded to ``length`` positions along ``axis``."""
            self.traces[f"fit[{part.shape[axis]}->{length}]"] += 1
            return fitted_one(part, length, axis)

        def put_part(target: Any, source: Any, index: Any, length: int, axis: int) -> Any:
            """The first ``length`` positions of ``source`` (one row) written into row ``index``
            of ``target``, from position 0."""
            self.traces[f"put[{length}]"] += 1
            return jax.lax.dynamic_update_slice(
                target, fitted_one(source, length, axis), (index,) + (0,) * (target.ndim - 1)
            )

        def generate(
            state: Any,
            weights: tuple[Any, ...],
            adapters: Any,
            cache: Any,
            slot_state: dict[str, Any],
            active: Any,
            count: Any,
        ) -> tuple[Any, dict[str, Any], Any]:
            # `count` steps (at most `steps`): a traced bound, so that the engine can change how
            # many steps a dispatch runs without compiling anything.
            # The slot caches hold `window` positions: every active slot's positions in this
            # dispatch are below it (the host resizes them to fit), so a step costs in
            # proportion to slots x window, not slots x context.
            window = cache[0].shape[axes[0]]
            self.traces[f"generate[{window}]"] += 1
            model, scope = stateless(state)
            # Token embeddings kept narrower than the model computes (inference.engine.
            # stored_dtype) go through the loop as values of their own, behind a barrier: read
            # as loop-invariant, XLA hoisted out of the loop a widened or bit-cast copy of the
            # whole table for the lookup, made at every dispatch (Gemma 3's decode step of 8
            # slots took 194 ms so, 144 ms with a float32 table, 105 ms carried: the lookup
            # then reads only its rows; scratch timings).
            narrow = [at for at in self._tables if state[at[0]][at[1]].dtype.itemsize < 4] if in_place else []

            def loop_model(tables: list[Any]) -> tuple[Any, Any]:
                """The model bound to ``state`` with the carried tables in their place."""
                if not narrow:
                    return model, contextlib.nullcontext()
                parts = [list(part) for part in state]
                for (part, index), table in zip(narrow, tables, strict=True):
                    parts[part][index] = table
                return stateless((parts[0], parts[1]))

            def one_slot(token: Any, slot_cache: Any, position: Any) -> tuple[Any, Any]:
                # Batch 1 inside, one cache index per slot outside (vmap).
                logits, _, slot_cache = model.call_with_cache(token[None, None], slot_cache, position)
                return logits[0, 0], slot_cache

            all_slots = jax.vmap(one_slot)

            def body(step: Any, carry: tuple[Any, ...]) -> tuple[Any, ...]:
                cache, tokens, positions, keys, out, tables = carry
                # Free slots keep running: clamp their index into the window (active slots are
                # below it); their writes are never read.
                clamped = jnp.minimum(positions, window - 1)
                if in_place:
                    tokens, tables = jax.lax.optimization_barrier((tokens, tables))
                    in_loop, binding = loop_model(tables)
                    adapted = _adapted(adapters, slot_state["adapter"])
                    with binding:
                        logits, cache = forward(in_loop, tokens[:, None], cache, clamped, weights, **adapted)
                    logits = logits[:, 0]
                else:
                    logits, only = all_slots(tokens, cache[0], clamped)
                    cache = (only,)
                tokens, keys = sample_tokens(
                    logits,
                    # A free slot keeps its last request's parameters: never let it sample.
                    jnp.where(active, slot_state["temperature"], 0.0),
                    slot_state["top_k"],
                    slot_state["top_p"],
                    keys,
                    greedy_sampler,
                )
                out = jax.lax.dynamic_update_slice(out, tokens[:, None], (0, step))
                positions = jnp.minimum(positions + 1, context)  # Bounded for free slots.
                return cache, tokens, positions, keys, out, tables

            out = jnp.zeros((slots, steps), jnp.int32)
            tables = [state[part][index] for part, index in narrow]
            carry = (cache, slot_state["tokens"], slot_state["positions"], slot_state["keys"], out, tables)
            with scope:
                cache, tokens, positions, keys, out, _ = jax.lax.fori_loop(0, count, body, carry)
            slot_state = {**slot_state, "tokens": tokens, "positions": positions, "keys": keys}
            return cache, slot_state, out

        def lay_out(state: Any) -> tuple[Any, ...]:
            model, scope = stateless(state)
            with scope:
                return prepare(model) if in_place else ()

        self.init = jax.jit(init, static_argnums=(1,))
        self._lay_out = jax.jit(lay_out)
        # The laid-out weights of the engines using these programs, weakly, by position
        # (``laid_out`` shares the equal ones).
        self._laid_out: list[list[weakref.ref[Any]]] = []
        # One compilation per prefill length (bucket).
        self.prefill = jax.jit(prefill, donate_argnums=(1, 2))
        # One compilation per chunk length and prefix bound (Engine._prefixes).
        self.prefill_chunk = jax.jit(prefill_chunk, donate_argnums=(3, 4), static_argnums=(8,))
        # Store, insert and resize copy the caches part by part, each part by a program of its
        # own shape: one program copying every layer's keys and values (60 arrays for SmolLM2)
        # held about 10 MB on XLA's CPU backend, as its copies are unrolled, and there is one
        # per stored length, window and pair of neighbouring windows; a part's program holds
        # a few hundred kilobytes, and the same program copies every layer's part of the shape.
        self._fit_part = jax.jit(fit_part, static_argnums=(1, 2))
        self._put_part = jax.jit(put_part, donate_argnums=(0,), static_argnums=(3, 4))
        # One compilation per window.
        self.generate = jax.jit(generate, donate_argnums=(3, 4))

    def store(self, pool: tuple[Any, ...], staging: tuple[Any, ...], row: Any, positions: int) -> tuple[Any, ...]:
        """The staging row's first ``positions`` positions into pool ``row`` (donating the
        pool). The rest of the row keeps what it held: a prefill reads a row only below the
        prefix it matched, so what lies past the stored prefix is never read."""
        return self._put_parts(pool, staging, row, positions)

    def insert(self, cache: tuple[Any, ...], staging: tuple[Any, ...], slot: Any) -> tuple[Any, ...]:
        """The staging row's first positions (as many as the window has) into ``slot``
        (donating the slot caches)."""
        return self._put_parts(cache, staging, slot, cache[0].shape[self.position_axes[0]])

    def resize(self, cache: tuple[Any, ...], window: int) -> tuple[Any, ...]:
        """The slot caches cut or zero-padded to ``window`` positions: every running request's
        positions are below both lengths (the host resizes only then)."""
        return tuple(self._fit_part(part, window, axis) for part, axis in zip(cache, self.position_axes, strict=True))

    def _put_parts(
        self, targets: tuple[Any, ...], sources: tuple[Any, ...], index: Any, length: int
    ) -> tuple[Any, ...]:
        return tuple(
            self._put_part(target, source, index, length, axis)
            for target, source, axis in zip(targets, sources, self.position_axes, strict=True)
        )

    def laid_out(self, state: Any) -> tuple[Any, ...]:
        """The matmul weights the forward pass multiplies by, laid out from the variables
        ``state`` (the in-place families' ``prepare``: for the Llama pass feature-major, a
        transposed copy of every block kernel), each array shared with another engine of these
        programs whose array there is equal: a fine-tuned fixer's untouched kernels are its
        base's, so their copy is laid out once per process, not once per engine."""
        import jax

        from inference.engine.shared_weights import equal_arrays

        arrays, structure = jax.tree_util.tree_flatten(self._lay_out(state))
        with _programs_lock:
            while len(self._laid_out) < len(arrays):
                self._laid_out.append([])
            for index, array in enumerate(arrays):
                known = self._laid_out[index]
                known[:] = [ref for ref in known if ref() is not None]
                same = next((ref() for ref in known if equal_arrays(ref(), array)), None)
                if same is not None:
                    arrays[index] = same
                else:
                    known.append(weakref.ref(array))
        return jax.tree_util.tree_unflatten(structure, arrays)

    def attach(self, lm: keras_hub.models.CausalLM) -> None:
        """Another engine's model uses these programs: it can trace them once the first is gone."""
        self._models[id(lm)] = lm

    def model(self) -> Any:
        """A live model of the architecture (the variables come as arguments); None if none is."""
        return next(iter(self._models.values()), None)


_programs: dict[tuple[Any, ...], Programs] = {}
_programs_lock = threading.Lock()


def architecture(lm: keras_hub.models.CausalLM) -> str:
    """What the compiled functions depend on besides the variables' values: the task's class and
    the backbone's configuration (layers, widths, vocabulary, dtype)."""
    return json.dumps({"task": type(lm).__name__, "backbone": lm.backbone.get_config()}, sort_keys=True, default=str)


def programs_for(
    lm: keras_hub.models.CausalLM,
    slots: int,
    steps: int,
    context: int,
    prefix_rows: int,
    capacity: int,
    cache_dtype: str | None = None,
    relayout: bool = True,
) -> Programs:
    """The programs of ``lm``'s architecture and this configuration: made at the first engine,
    then shared (programs whose models are all gone are dropped)."""
    key = (architecture(lm), slots, steps, context, prefix_rows, capacity, cache_dtype, relayout)
    with _programs_lock:
        for stale in [known for known, programs in _programs.items() if programs.model() is None]:
            del _programs[stale]
        programs = _programs.get(key)
        if programs is None:
            programs = _programs[key] = Programs(
                lm, slots, steps, context, prefix_rows, capacity, cache_dtype, relayout
            )
        else:
            programs.attach(lm)
        return programs
