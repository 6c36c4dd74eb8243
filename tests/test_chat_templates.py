"""Exact prompt strings per family: a one-character drift in a template silently degrades a model."""

import subprocess
import sys
from pathlib import Path

import pytest

from inference.chat_templates import (
    FAMILIES,
    VICUNA_DEFAULT_SYSTEM,
    ChatTurn,
    family_from_special_tokens,
    render_prompt,
    stop_strings,
    template_family,
)

SYSTEM = "Translate requests into API calls."
DIALOG = [
    ChatTurn("user", "Add a meeting with Fred on Nov 11 at 5PM"),
    ChatTurn(
        "assistant", 'action.add_calendar_entry("Meeting with Fred", date="2023-11-11", time="17:00", duration=30)'
    ),
    ChatTurn("user", "The current year is 2024."),
]
CALL = DIALOG[1].content
REPO_ROOT = Path(__file__).resolve().parents[1]


def test_families() -> None:
    assert FAMILIES == ("gemma", "llama3", "mistral", "vicuna", "chatml", "completion")


def test_gemma_single_turn_without_system() -> None:
    prompt = render_prompt("gemma", None, [ChatTurn("user", "Hi")])
    assert prompt == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"


def test_gemma_system_goes_into_first_user_turn_multi_turn() -> None:
    assert render_prompt("gemma", SYSTEM, DIALOG) == (
        "<start_of_turn>user\n"
        f"{SYSTEM}\n\nAdd a meeting with Fred on Nov 11 at 5PM<end_of_turn>\n"
        f"<start_of_turn>model\n{CALL}<end_of_turn>\n"
        "<start_of_turn>user\nThe current year is 2024.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_llama3_single_turn_without_system() -> None:
    prompt = render_prompt("llama3", None, [ChatTurn("user", "Hi")])
    assert prompt == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama3_system_role_multi_turn() -> None:
    assert render_prompt("llama3", SYSTEM, DIALOG) == (
        "<|begin_of_text|>"
        f"<|start_header_id|>system<|end_header_id|>\n\n{SYSTEM}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAdd a meeting with Fred on Nov 11 at 5PM<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{CALL}<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nThe current year is 2024.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_mistral_single_turn_without_system() -> None:
    assert render_prompt("mistral", None, [ChatTurn("user", "Hi")]) == "<s>[INST] Hi [/INST]"


def test_mistral_system_goes_into_first_user_turn_multi_turn() -> None:
    assert render_prompt("mistral", SYSTEM, DIALOG) == (
        f"<s>[INST] {SYSTEM}\n\nAdd a meeting with Fred on Nov 11 at 5PM [/INST]"
        f" {CALL}</s>"
        "[INST] The current year is 2024. [/INST]"
    )


def test_vicuna_default_system_single_turn() -> None:
    prompt = render_prompt("vicuna", None, [ChatTurn("user", "Hi")])
    assert prompt == f"{VICUNA_DEFAULT_SYSTEM} USER: Hi ASSISTANT:"
    assert VICUNA_DEFAULT_SYSTEM.startswith("A chat between a curious user")


def test_vicuna_custom_system_multi_turn() -> None:
    assert render_prompt("vicuna", SYSTEM, DIALOG) == (
        f"{SYSTEM} USER: Add a meeting with Fred on Nov 11 at 5PM "
        f"ASSISTANT: {CALL}</s>"
        "USER: The current year is 2024. ASSISTANT:"
    )


def test_chatml_single_turn_without_system_has_no_default_system() -> None:
    # SmolLM2's own template would insert "You are a helpful AI assistant named SmolLM...":
    # a model naming itself breaks the arena's anonymity.
    assert render_prompt("chatml", None, [ChatTurn("user", "Hi")]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chatml_system_role_multi_turn() -> None:
    assert render_prompt("chatml", SYSTEM, DIALOG) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nAdd a meeting with Fred on Nov 11 at 5PM<|im_end|>\n"
        f"<|im_start|>assistant\n{CALL}<|im_end|>\n"
        "<|im_start|>user\nThe current year is 2024.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_completion_transcript_for_base_models() -> None:
    assert render_prompt("completion", None, [ChatTurn("user", "Hi")]) == "User: Hi\nAssistant:"
    assert render_prompt("completion", SYSTEM, DIALOG) == (
        f"{SYSTEM}\n\n"
        "User: Add a meeting with Fred on Nov 11 at 5PM\n"
        f"Assistant: {CALL}\n"
        "User: The current year is 2024.\n"
        "Assistant:"
    )


def test_family_of_a_checkpoints_own_chat_template() -> None:
    smollm2 = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{% endfor %}"
    assert template_family(smollm2) == "chatml"
    assert template_family("{{ '<start_of_turn>' + role }}") == "gemma"
    assert template_family("<|start_header_id|>{{ role }}<|end_header_id|>") == "llama3"
    assert template_family("[INST] {{ content }} [/INST]") == "mistral"
    assert template_family(None) == template_family("") == "completion"  # no chat template: a base model
    with pytest.raises(ValueError, match="no template for"):
        template_family("<<SYS>> {{ content }}")


def test_family_from_special_tokens() -> None:
    assert family_from_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == "chatml"
    assert family_from_special_tokens(["<|begin_of_text|>", "<|start_header_id|>"]) == "llama3"
    assert family_from_special_tokens(["<s>", "</s>"]) is None


@pytest.mark.parametrize("family", ["gemma", "llama3", "mistral", "chatml", "completion"])
def test_empty_system_means_no_system(family: str) -> None:
    turns = [ChatTurn("user", "Hi")]
    assert render_prompt(family, "", turns) == render_prompt(family, None, turns)


def test_stop_strings() -> None:
    assert stop_strings("gemma") == ("<end_of_turn>", "<eos>")
    assert stop_strings("llama3") == ("<|eot_id|>", "<|end_of_text|>")
    assert stop_strings("mistral") == ("</s>",)
    assert stop_strings("vicuna") == ("</s>",)
    assert stop_strings("chatml") == ("<|im_end|>", "<|endoftext|>")
    assert stop_strings("completion") == ("\nUser:", "\nAssistant:")


def test_unknown_family() -> None:
    with pytest.raises(ValueError, match="Unknown model family 'gpt'"):
        render_prompt("gpt", None, [ChatTurn("user", "Hi")])
    with pytest.raises(ValueError, match="Unknown model family"):
        stop_strings("gpt")


@pytest.mark.parametrize("family", FAMILIES)
def test_last_turn_must_be_user(family: str) -> None:
    with pytest.raises(ValueError, match="last turn must be a user turn"):
        render_prompt(family, None, DIALOG[:2])


@pytest.mark.parametrize("family", FAMILIES)
def test_no_turns(family: str) -> None:
    with pytest.raises(ValueError, match="at least one turn"):
        render_prompt(family, SYSTEM, [])


@pytest.mark.parametrize(
    "turns",
    [
        [ChatTurn("assistant", "Hello"), ChatTurn("user", "Hi")],
        [ChatTurn("user", "Hi"), ChatTurn("user", "Again")],
    ],
)
def test_turns_must_alternate(turns: list[ChatTurn]) -> None:
    with pytest.raises(ValueError, match="alternate"):
        render_prompt("gemma", None, turns)


def test_unknown_role() -> None:
    with pytest.raises(ValueError, match="role 'system'"):
        render_prompt("llama3", None, [ChatTurn("system", "Hi")])  # type: ignore[arg-type]


def test_chat_templates_imports_nothing_heavy() -> None:
    """The web process renders prompts: it must not pay for keras, jax or Django imports."""
    code = (
        "import sys, inference.chat_templates; "
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'keras', 'jax', 'django', 'tensorflow'}); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)
