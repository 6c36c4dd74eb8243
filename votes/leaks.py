"""Identity leaks: a reply that names a model, a model family or its maker.

A voter who reads "As Gemma, I..." knows a side before voting, so the battle's votes are kept but
excluded from the leaderboard. Pure Python: the worker calls it on every finished reply.
"""

import functools
import re
from collections.abc import Iterable

# Families and makers of the models an arena like this one serves, and of well-known others a
# model may claim to be. Matched as whole words, case-insensitively.
IDENTITY_TERMS: tuple[str, ...] = (
    "Gemma",
    "CodeGemma",
    "Gemini",
    "Google",
    "DeepMind",
    "Llama",
    "Meta AI",
    "Facebook",
    "Mistral",
    "Mixtral",
    "Vicuna",
    "LMSYS",
    "OpenAI",
    "ChatGPT",
    "GPT-3",
    "GPT-4",
    "Claude",
    "Anthropic",
    "Qwen",
    "Alibaba",
    "Phi-3",
    "Microsoft",
    "SmolLM",
    "SmolLM2",
    "Hugging Face",
    "HuggingFace",
    "HuggingFaceTB",
)


def find_identity_leak(text: str, model_names: Iterable[str] = ()) -> str | None:
    """The first model name, family or maker that ``text`` names, as written there, or None.

    ``model_names`` are the battle's own roster names (e.g. "gemma-calendar"), matched whole.
    """
    match = _pattern(frozenset(name for name in model_names if name)).search(text)
    return match.group(0) if match else None


@functools.lru_cache(maxsize=256)
def _pattern(model_names: frozenset[str]) -> re.Pattern[str]:
    """Compiled once per roster pair (every finished reply is searched). Longest terms first."""
    terms = sorted({*IDENTITY_TERMS, *model_names}, key=len, reverse=True)
    return re.compile(r"(?<!\w)(" + "|".join(re.escape(term) for term in terms) + r")(?!\w)", re.IGNORECASE)
