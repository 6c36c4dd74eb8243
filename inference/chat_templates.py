"""Chat templates for the model families the arena serves.

keras-hub presets carry no chat template (unlike Hugging Face tokenizers), so the arena renders
the conversation to one prompt string itself. The prompt ends exactly where the assistant's next
reply starts, so it can be fed to ``CausalLM.generate()`` or ``inference.streaming`` unchanged.
Pure Python on purpose: the web process renders prompts without importing keras or Django.

Exact formats (``{s}`` system text, ``{u1}`` first user turn, ``{a1}`` first assistant reply,
``\\n`` a newline):

Gemma (no system role: the system text is prepended to the first user turn, separated by a
blank line; no ``<bos>``, which the keras-hub preprocessor adds)::

    <start_of_turn>user\\n{s}\\n\\n{u1}<end_of_turn>\\n
    <start_of_turn>model\\n{a1}<end_of_turn>\\n
    <start_of_turn>user\\n{u2}<end_of_turn>\\n
    <start_of_turn>model\\n

Llama 3 (system role supported; omitted when there is no system text)::

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n{s}<|eot_id|>
    <|start_header_id|>user<|end_header_id|>\\n\\n{u1}<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n{a1}<|eot_id|>
    <|start_header_id|>user<|end_header_id|>\\n\\n{u2}<|eot_id|>
    <|start_header_id|>assistant<|end_header_id|>\\n\\n

Mistral (no system role: prepended to the first user turn, separated by a blank line)::

    <s>[INST] {s}\\n\\n{u1} [/INST] {a1}</s>[INST] {u2} [/INST]

ChatML (SmolLM2, Qwen; system role supported, omitted when there is no system text: the
checkpoints' own templates would then insert a default system sentence that names the model,
which the arena's anonymity cannot have)::

    <|im_start|>system\n{s}<|im_end|>\n
    <|im_start|>user\n{u1}<|im_end|>\n
    <|im_start|>assistant\n{a1}<|im_end|>\n
    <|im_start|>user\n{u2}<|im_end|>\n
    <|im_start|>assistant\n

Completion (pretrained base models, such as Gemma 3 270M, that were never taught a chat
format: a plain transcript they can continue; the reply ends where the model starts the next
``User:`` line)::

    {s}\n\nUser: {u1}\nAssistant: {a1}\nUser: {u2}\nAssistant:

Gemma 3's instruction-tuned checkpoints speak the Gemma turn format above (family "gemma").

Vicuna v1.1 (FastChat's format; the default Vicuna system sentence when there is no system
text; user turns are followed by a space, assistant replies by ``</s>``)::

    {s} USER: {u1} ASSISTANT: {a1}</s>USER: {u2} ASSISTANT:

(The line breaks in the Gemma, Llama 3 and ChatML layouts above are only for reading; the real strings
contain only the ``\\n`` shown.) Turns must alternate user/assistant, start with a user turn and
end with one: the prompt always asks for the next assistant reply.

``stop_strings(family)`` lists the strings that end an assistant reply; the generation loop maps
them to token ids. Gemma 1/2 presets only stop on ``<eos>`` by default, so ``<end_of_turn>`` must
be passed explicitly or the model keeps writing the user's next turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Family = Literal["gemma", "llama3", "mistral", "vicuna", "chatml", "completion"]
FAMILIES: tuple[Family, ...] = get_args(Family)

Role = Literal["user", "assistant"]

VICUNA_DEFAULT_SYSTEM = (
    "A chat between a curious user and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the user's questions."
)

_STOP_STRINGS: dict[str, tuple[str, ...]] = {
    "gemma": ("<end_of_turn>", "<eos>"),
    "llama3": ("<|eot_id|>", "<|end_of_text|>"),
    "mistral": ("</s>",),
    "vicuna": ("</s>",),
    "chatml": ("<|im_end|>", "<|endoftext|>"),
    # A base model ends its reply by starting the next turn of the transcript.
    "completion": ("\nUser:", "\nAssistant:"),
}


@dataclass(frozen=True)
class ChatTurn:
    """One message of a conversation; frozen so turn lists can be shared and hashed safely."""

    role: Role
    content: str


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"Unknown model family {family!r}; expected one of {', '.join(FAMILIES)}.")


def _check_turns(turns: Sequence[ChatTurn]) -> None:
    """Reject conversations the templates cannot express, with a message saying what is wrong.

    Every family here assumes strict user/assistant alternation; a malformed history would
    otherwise render silently into a prompt the model was never trained on.
    """
    if not turns:
        raise ValueError("A prompt needs at least one turn, and the last turn must be a user turn.")
    for index, turn in enumerate(turns):
        if turn.role not in ("user", "assistant"):
            raise ValueError(f"Turn {index} has role {turn.role!r}; expected 'user' or 'assistant'.")
        expected = "user" if index % 2 == 0 else "assistant"
        if turn.role != expected:
            raise ValueError(
                f"Turn {index} is a {turn.role!r} turn but a {expected!r} turn was expected: "
                "turns must alternate user/assistant, starting with a user turn."
            )
    if turns[-1].role != "user":
        raise ValueError("The last turn must be a user turn: the prompt asks for the assistant's next reply.")


def _merge_system(system: str | None, turns: Sequence[ChatTurn]) -> list[ChatTurn]:
    """Fold the system text into the first user turn, for families without a system role."""
    merged = list(turns)
    if system:
        merged[0] = ChatTurn("user", f"{system}\n\n{merged[0].content}")
    return merged


def _render_gemma(system: str | None, turns: Sequence[ChatTurn]) -> str:
    parts = []
    for turn in _merge_system(system, turns):
        role = "user" if turn.role == "user" else "model"
        parts.append(f"<start_of_turn>{role}\n{turn.content}<end_of_turn>\n")
    parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _render_llama3(system: str | None, turns: Sequence[ChatTurn]) -> str:
    def block(role: str, content: str) -> str:
        return f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"

    parts = ["<|begin_of_text|>"]
    if system:
        parts.append(block("system", system))
    parts.extend(block(turn.role, turn.content) for turn in turns)
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _render_mistral(system: str | None, turns: Sequence[ChatTurn]) -> str:
    parts = ["<s>"]
    for turn in _merge_system(system, turns):
        if turn.role == "user":
            parts.append(f"[INST] {turn.content} [/INST]")
        else:
            parts.append(f" {turn.content}</s>")
    return "".join(parts)


def _render_vicuna(system: str | None, turns: Sequence[ChatTurn]) -> str:
    parts = [f"{system or VICUNA_DEFAULT_SYSTEM} "]
    for turn in turns:
        if turn.role == "user":
            parts.append(f"USER: {turn.content} ")
        else:
            parts.append(f"ASSISTANT: {turn.content}</s>")
    parts.append("ASSISTANT:")
    return "".join(parts)


def _render_chatml(system: str | None, turns: Sequence[ChatTurn]) -> str:
    def block(role: str, content: str) -> str:
        return f"<|im_start|>{role}\n{content}<|im_end|>\n"

    parts = [block("system", system)] if system else []
    parts.extend(block(turn.role, turn.content) for turn in turns)
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _render_completion(system: str | None, turns: Sequence[ChatTurn]) -> str:
    parts = [f"{system}\n\n"] if system else []
    for turn in turns:
        speaker = "User" if turn.role == "user" else "Assistant"
        parts.append(f"{speaker}: {turn.content}\n")
    parts.append("Assistant:")
    return "".join(parts)


_RENDERERS = {
    "gemma": _render_gemma,
    "llama3": _render_llama3,
    "mistral": _render_mistral,
    "vicuna": _render_vicuna,
    "chatml": _render_chatml,
    "completion": _render_completion,
}


def render_prompt(family: str, system: str | None, turns: Sequence[ChatTurn]) -> str:
    """Render a conversation to the prompt string that asks ``family`` for its next reply.

    ``system`` may be None or empty for no system text (Vicuna then uses its default system
    sentence, as FastChat does). Raises ValueError for an unknown family or a conversation that
    does not alternate user/assistant turns and end with a user turn.
    """
    _check_family(family)
    _check_turns(turns)
    return _RENDERERS[family](system, turns)


def stop_strings(family: str) -> tuple[str, ...]:
    """Strings that end an assistant reply for ``family`` (each a single token in its vocab)."""
    _check_family(family)
    return _STOP_STRINGS[family]


# Markers that identify a chat format, in a checkpoint's own chat template (Jinja text) or its
# vocabulary's special tokens. Checked in this order.
_FAMILY_MARKERS: tuple[tuple[str, Family], ...] = (
    ("<|im_start|>", "chatml"),
    ("<start_of_turn>", "gemma"),
    ("<|start_header_id|>", "llama3"),
    ("[INST]", "mistral"),
)


def template_family(chat_template: str | None) -> Family:
    """The family of a checkpoint's own chat template (as Hugging Face tokenizers and GGUF
    files ship it); "completion" when there is none, which means a pretrained base model.

    Raises ValueError for a chat template in a format the arena cannot render.
    """
    if not chat_template:
        return "completion"
    for marker, family in _FAMILY_MARKERS:
        if marker in chat_template:
            return family
    raise ValueError("The checkpoint's chat template is in a format this arena has no template for.")


def family_from_special_tokens(tokens: Sequence[str]) -> Family | None:
    """The chat family a vocabulary's special tokens imply, or None if they imply none."""
    present = set(tokens)
    for marker, family in _FAMILY_MARKERS:
        if marker in present:
            return family
    return None
