"""The arena's own limit on a conversation's length, the same whichever models are in the battle.

A model refuses a conversation that outgrows its context, and the models of a battle outgrow
theirs at different lengths: their templates and tokenizers differ. A refusal that came with
some pairs and not with others would name the pair (a 1,998-character prompt was refused exactly
when the 512-token demo model was in the battle). So the arena measures a conversation itself,
without any model's tokenizer, and refuses what is over its limit before a model sees it; and an
anonymous battle draws only models whose context holds any conversation within that limit plus
a whole reply (``LLM.objects.anonymous()``). A model's own limit is then never reached there.

The measure (``conversation_size``) counts the UTF-8 bytes of every text the model is given (the
task's system prompt, the task's context, the side's prompts and replies), ``MESSAGE_ALLOWANCE``
for each of them and ``CONVERSATION_ALLOWANCE`` once. It bounds the tokens of the rendered prompt
for every template of ``inference.chat_templates`` with any tokenizer that

- splits no text into more tokens than it has bytes (byte-level BPE, as Llama 3 and SmolLM2 use,
  and SentencePiece with byte fallback, as Gemma uses: an unknown character falls back to its
  bytes, one token each), and
- keeps the template's markers (``<start_of_turn>``, ``<|eot_id|>``, ``<|im_start|>``…) as
  single tokens, as the checkpoints that speak those templates do.

The allowances are the largest per-message and per-conversation tokens of any template under
those two conditions (the Vicuna template's default system sentence is most of the second).
``tests/test_context_fit.py`` checks the bound with every tokenizer of the roster and the tests,
on adversarial texts (emoji, scripts without merges, injected markers, empty messages).
"""

from collections.abc import Iterable

# Tokens a template adds around one message, at most: markers, role names, separators (the
# Llama 3 assistant header and end of turn are 14; ChatML's 13; Gemma's 9; the completion
# template's 12; Vicuna's 15; Mistral's 15).
MESSAGE_ALLOWANCE = 16
# Tokens a template adds once, at most: the start token, the header of the reply to come, and
# Vicuna's default system sentence (154 bytes) when the task has no system prompt.
CONVERSATION_ALLOWANCE = 192


def text_size(text: str) -> int:
    return len(text.encode("utf-8"))


def conversation_size(system_prompt: str | None, texts: Iterable[str]) -> int:
    """The conversation's size as the arena counts it: an upper bound on its tokens, with any
    model of the arena, once rendered for the next reply. ``texts`` are the messages the model is
    given, in order (task context, then the side's prompts and replies)."""
    messages = ([system_prompt] if system_prompt else []) + list(texts)
    return CONVERSATION_ALLOWANCE + sum(text_size(text) + MESSAGE_ALLOWANCE for text in messages)


def context_needed(limit: int, max_new_tokens: int) -> int:
    """The context (prompt plus reply, in tokens) a model needs to be drawn into anonymous
    battles: any conversation the arena accepts, and a whole reply after it."""
    return limit + max_new_tokens
