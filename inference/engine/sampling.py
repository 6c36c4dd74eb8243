"""Per-request sampling for the engine: the parameters a request decodes with, and the
jitted draw of every slot's next token from its logits (greedy exactly as keras-hub's
``GreedySampler``; temperature, top-k and top-p with a per-slot PRNG key). No Django."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Greedy decoding: logits at least this far below a row's largest one cannot win its softmax's
# argmax (see sample_tokens).
GREEDY_MARGIN = 1e-3
KEY_IMPL = "threefry2x32"  # Explicit, so the per-slot key layout (uint32[2]) never changes.
# A sampling step draws among this many most likely tokens, then among the second number, when
# the kept ones (top-k, top-p) lie among them; otherwise it sorts the whole vocabulary.
SAMPLING_CANDIDATES = (256, 4096)


@dataclass(frozen=True)
class SamplingParams:
    """How a request picks its tokens; the defaults are greedy decoding.

    ``temperature`` 0 is greedy (top_k/top_p are then ignored); above 0, logits are divided by
    it, then limited to the ``top_k`` most likely tokens (0: no limit), then to the smallest set
    whose probability reaches ``top_p`` (1.0: no limit), and a token is drawn with a PRNG seeded
    by ``seed``.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        def real(value: Any) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)

        def integer(value: Any) -> bool:
            return isinstance(value, numbers.Integral) and not isinstance(value, bool)

        if not real(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}.")
        if not integer(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: no limit), got {self.top_k!r}.")
        if not real(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1: no limit), got {self.top_p!r}.")
        if not integer(self.seed) or not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {self.seed!r}.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams()


def sample_tokens(
    logits: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    keys: Any,
    greedy_sampler: Any,
    candidates: Sequence[int] = SAMPLING_CANDIDATES,
) -> tuple[Any, Any]:
    """Next tokens int32[B] and advanced keys uint32[B, 2] for logits [B, V]; traced in jit.
    ``candidates``: how many most likely tokens a sampling step looks among before it sorts the
    whole vocabulary (``SAMPLING_CANDIDATES``; none: it always sorts)."""
    import jax
    import jax.numpy as jnp

    vocabulary = logits.shape[-1]
    rank = jnp.arange(vocabulary, dtype=jnp.int32)[None, :]

    def first_largest(values: Any, best: Any) -> Any:
        # The first index of the largest value, as a max and a min: XLA's CPU argmax, a
        # variadic reduce, is slower.
        return jnp.min(jnp.where(values == best, rank, vocabulary), axis=-1).astype(jnp.int32)

    def softmax_greedy() -> Any:  # Exactly GreedySampler's: its float32 softmax, then argmax.
        probabilities = greedy_sampler.compute_probabilities(logits)
        return first_largest(probabilities, jnp.max(probabilities, axis=-1, keepdims=True))

    # The softmax only decides between logits within a hair of the largest: one at least
    # GREEDY_MARGIN below it gets a probability at most exp(-GREEDY_MARGIN) = 0.999 times the
    # largest one's, a gap float32 rounding (6e-8) cannot close. Where every row's largest logit
    # is alone within the margin, its index is the sampler's token, without the softmax's passes
    # over the vocabulary (a SmolLM2 step of 8 slots over 256 positions, scratch A/B on 2 cores:
    # 29.7 ms against 32.7, median of 8 rounds).
    scaled_logits = logits.astype(jnp.float32) / greedy_sampler.temperature
    largest = jnp.max(scaled_logits, axis=-1, keepdims=True)
    contenders = jnp.sum(scaled_logits >= largest - GREEDY_MARGIN, axis=-1)
    clear = jnp.all((contenders == 1) & jnp.isfinite(largest[:, 0]))
    greedy = jax.lax.cond(clear, lambda: first_largest(scaled_logits, largest), softmax_greedy)
    sampling = temperature > 0
    # top_k 0 (or the whole vocabulary) keeps every token.
    k = jnp.where((top_k > 0) & (top_k < vocabulary), top_k, vocabulary)[:, None]

    def nucleus(descending: Any, scaled: Any) -> Any:
        """The smallest logit kept, per row ([B, 1]), from the ``n`` largest logits in descending
        order (``descending`` [B, n], all of them or the candidates): the top-k first, then the
        smallest prefix whose probability reaches top_p (top_p 1 keeps all: cumsum rounding could
        otherwise drop the tail; the best token is always kept). Probabilities are over the
        top-k, or over the whole vocabulary (``scaled``) when top-k keeps it all."""
        n = descending.shape[-1]
        position = jnp.arange(n, dtype=jnp.int32)[None, :]
        in_top_k = position < k
        masked = jnp.where(in_top_k, descending, -jnp.inf)
        # Reductions, not slices: XLA folds a slice into top_k's own (its sort and first k),
        # which then no longer reads as a top-k and sorts the whole row (390 ms against 3 here).
        largest = jnp.max(descending, axis=-1, keepdims=True)
        weights = jnp.exp(masked - largest)
        every_token = jnp.sum(jnp.exp(scaled - largest), axis=-1, keepdims=True)
        probabilities = weights / jnp.where(k <= n, jnp.sum(weights, axis=-1, keepdims=True), every_token)
        mass_before = jnp.cumsum(probabilities, axis=-1) - probabilities
        keep = in_top_k & ((mass_before < top_p[:, None]) | (top_p[:, None] >= 1.0) | (position == 0))
        last_kept = jnp.sum(keep, axis=-1, keepdims=True) - 1
        return jnp.take_along_axis(masked, last_kept, axis=-1)

    def sampled() -> tuple[Any, Any]:
        def split(key: Any) -> Any:
            return jax.random.key_data(jax.random.split(jax.random.wrap_key_data(key, impl=KEY_IMPL)))

        pairs = jax.vmap(split)(keys)  # One split per token and slot: reproducible per request.
        next_keys, subkeys = pairs[:, 0], pairs[:, 1]
        scaled = logits.astype(jnp.float32) / jnp.where(sampling, temperature, 1.0)[:, None]

        def draw(key: Any, row: Any) -> Any:
            return jax.random.categorical(jax.random.wrap_key_data(key, impl=KEY_IMPL), row)

        def from_the_vocabulary() -> Any:
            """The kept tokens found by sorting the whole vocabulary, drawn among all of it."""

            def sorted_threshold() -> Any:
                return nucleus(-jnp.sort(-scaled, axis=-1), scaled)

            # Rows that keep every token (top_p 1, no top-k) need no sort.
            keeps_all = jnp.all(~sampling | ((top_p >= 1.0) & (k[:, 0] >= vocabulary)))
            threshold = jax.lax.cond(keeps_all, lambda: jnp.full_like(scaled[:, :1], -jnp.inf), sorted_threshold)
            return jax.vmap(draw)(subkeys, jnp.where(scaled >= threshold, scaled, -jnp.inf)).astype(jnp.int32)

        def among(count: int, otherwise: Callable[[], Any]) -> Callable[[], Any]:
            """A draw among the ``count`` largest logits where every sampling row's kept tokens
            lie among them (its smallest kept logit above the ``count``-th: nothing further down
            ties with it); ``otherwise`` where one's do not."""

            def look() -> Any:
                values, indices = jax.lax.top_k(scaled, count)
                threshold = nucleus(values, scaled)
                inside = jnp.all(~sampling | (threshold[:, 0] > jnp.min(values, axis=-1)))

                def drawn() -> Any:
                    chosen = jax.vmap(draw)(subkeys, jnp.where(values >= threshold, values, -jnp.inf))
                    return jnp.take_along_axis(indices, chosen[:, None], axis=-1)[:, 0].astype(jnp.int32)

                return jax.lax.cond(inside, drawn, otherwise)

            return look

        # Sorting the whole vocabulary every step would cost more than the model's own step (4 rows
        # of Gemma 3's 262,144 logits: 281 ms here, SmolLM2's 49,152: 47 ms; `bench_engine
        # --sampling`), and so would drawing among all of it (Gemma 3: 21 ms). The kept tokens are
        # nearly always among the few most likely: the draw looks there first, then among more,
        # and sorts only when neither holds them. Same distribution either way.
        pick = from_the_vocabulary
        for count in sorted((n for n in candidates if n < vocabulary), reverse=True):
            pick = among(count, pick)
        return jnp.where(sampling, pick(), greedy), next_keys

    # A real branch (not a select): an all-greedy batch skips the sort and the key splits. Keys
    # only matter to sampling slots, and a batch with one takes the branch at every token, so
    # each sampling request's key is still split once per token (same seed, same text).
    return jax.lax.cond(jnp.any(sampling), sampled, lambda: (greedy, keys))


def slot_params(sampling: SamplingParams) -> tuple[Any, ...]:
    """Per-request prefill arguments as NumPy scalars: fixed dtypes, never a recompilation."""
    seed = int(sampling.seed)
    key = np.array([seed >> 32, seed & 0xFFFFFFFF], dtype=np.uint32)  # As jax.random.PRNGKey.
    return (
        np.float32(sampling.temperature),
        np.int32(min(sampling.top_k, 2**31 - 1)),
        np.float32(sampling.top_p),
        key,
    )
