"""Tokenizer classes the arena's imported presets need beyond keras-hub's own.

keras-hub 0.32's ``Llama3Tokenizer`` takes its start, end and other special tokens as
constructor arguments but leaves them out of ``get_config``: a preset saved from a Llama-
architecture checkpoint whose special tokens are not Llama 3's (SmolLM2 speaks ChatML:
``<|im_start|>``, ``<|im_end|>``) cannot be loaded again ("Cannot find special token
'<|end_of_text|>'"). ``SpecialTokensLlama3Tokenizer`` is the same tokenizer with those
arguments in its config. Loading a preset that names it imports this module by its name
(keras resolves the class from the config's module), so no registration call is needed.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from collections.abc import Iterable
from typing import Any

import keras
from keras_hub.tokenizers import Llama3Tokenizer


@keras.saving.register_keras_serializable(package="fix_arena")
class SpecialTokensLlama3Tokenizer(Llama3Tokenizer):
    """``Llama3Tokenizer`` whose start, end and other special tokens survive save and load."""

    def __init__(
        self,
        vocabulary: Any = None,
        merges: Any = None,
        bos_token: str = "<|begin_of_text|>",
        eos_token: str = "<|end_of_text|>",
        misc_special_tokens: Iterable[str] = ("<|start_header_id|>", "<|end_header_id|>"),
        **kwargs: Any,
    ) -> None:
        # Rebuilt from the special tokens by the base class; a saved copy would be stale.
        kwargs.pop("unsplittable_tokens", None)
        self._special_token_args = (bos_token, eos_token, sorted(set(misc_special_tokens)))
        super().__init__(
            vocabulary=vocabulary,
            merges=merges,
            bos_token=bos_token,
            eos_token=eos_token,
            misc_special_tokens=set(misc_special_tokens),
            **kwargs,
        )

    @classmethod
    def like(cls, tokenizer: Llama3Tokenizer, bos_token: str, eos_token: str) -> SpecialTokensLlama3Tokenizer:
        """The same vocabulary, merges and special tokens as ``tokenizer``, in this class."""
        special = {str(token) for token in tokenizer.special_tokens} - {bos_token, eos_token}
        return cls(
            vocabulary=dict(tokenizer.vocabulary),
            merges=list(tokenizer.merges),
            bos_token=bos_token,
            eos_token=eos_token,
            misc_special_tokens=special,
        )

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        bos_token, eos_token, misc = self._special_token_args
        config.update(bos_token=bos_token, eos_token=eos_token, misc_special_tokens=list(misc))
        config.pop("unsplittable_tokens", None)
        return config
