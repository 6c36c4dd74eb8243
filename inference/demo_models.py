"""Tiny but real keras-hub models that let the arena run end to end without downloads.

Production contestants are big presets (Gemma 2, Llama 3.1, ...) loaded with ``from_preset``.
For development, tests and CI the arena ships tiny models of the same architectures, with
tokenizers trained here on a synthetic corpus from the calendar scenario, saved with
``save_to_preset`` so that they go through exactly the loading and generation path a Kaggle or
Hugging Face handle does. Their weights are random: they produce varied garbage, which is all the
streaming machinery needs; a training step can later start from these presets.

Tokenizer choices that matter (measured; see shared/facts.md):

* Gemma: SentencePiece BPE with ``normalization_rule_name="identity"``,
  ``remove_extra_whitespaces=False`` and ``"\\n"`` plus the turn markers as user-defined
  symbols. Without them newlines and repeated spaces vanish and ``<start_of_turn>`` is split
  into pieces. ``add_dummy_prefix=False`` (as real Gemma) so that decoding any slice of ids
  concatenates exactly, which the streaming decoder relies on. Ids follow Gemma's layout
  (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3), and byte fallback keeps any UTF-8
  representable.
* Llama 3: byte-level BPE trained with Hugging Face ``tokenizers`` using the same pre-tokenizer
  keras-hub's ``BytePairTokenizer`` builds, so training and inference split text identically.
  ``Llama3Tokenizer`` hard-codes pad id 0, so id 0 is reserved for a ``<|pad|>`` token.

Everything is seeded and every layer named explicitly (keras numbers unnamed layers per process,
"gemma_backbone_1"...), so the same seed gives byte-identical preset files (bar metadata.json's
timestamp), also when building twice in one process.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import io
import json
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inference.chat_templates import ChatTurn, Family, render_prompt, stop_strings

if TYPE_CHECKING:
    import keras_hub  # Imported lazily at run time: keras and jax take seconds to import.

SYSTEM_PROMPT = (
    "You are a helpful vocal assistant on a mobile device. Your job is to translate user "
    "requests into API calls using this Python API:\n"
    'action.add_calendar_entry(title, date="YYYY-MM-DD", time="HH:MM", duration=m) '
    "# duration in minutes\n"
    "action.remove_calendar_entry(title, date, time)\n"
    "You can use 30 minutes as the default duration for new events. Respond to every request "
    "with a single line of executable code."
)

VOCABULARY_SIZE = 1024
SEQUENCE_LENGTH = 512
CORPUS_CONVERSATIONS = 1500

LLAMA3_SPECIAL_TOKENS = (
    "<|pad|>",  # id 0: Llama3Tokenizer hard-codes pad id 0.
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)


@dataclass(frozen=True)
class DemoModel:
    """What the Django side needs to register one bundled model as a contestant."""

    name: str
    family: Family
    directory: Path
    description: str


DEMO_MODEL_SPECS: tuple[tuple[str, Family, str], ...] = (
    (
        "tiny-gemma",
        "gemma",
        "Gemma architecture, 2 layers, hidden 128, SentencePiece vocab 1024; random weights.",
    ),
    (
        "tiny-llama3",
        "llama3",
        "Llama 3 architecture, 2 layers, hidden 128, byte-level BPE vocab 1024; random weights.",
    ),
)


def demo_models(out_dir: Path) -> list[DemoModel]:
    """Describe the bundled models as they are (or will be) laid out under ``out_dir``."""
    return [
        DemoModel(name=name, family=family, directory=Path(out_dir) / name, description=desc)
        for name, family, desc in DEMO_MODEL_SPECS
    ]


# --- Synthetic calendar corpus -------------------------------------------------------------

_NAMES = (
    "Fred", "Paul", "Anna", "Maria", "John", "Li", "Sofia", "Omar", "Emma", "Noah", "Yuki",
    "Lucas", "Chloe", "Ravi", "Ines", "Tom", "Sara", "Hugo", "Mia", "Karim",
)  # fmt: skip
_EVENTS = (
    ("rock concert", "Rock Concert"), ("dentist appointment", "Dentist Appointment"),
    ("yoga class", "Yoga Class"), ("team lunch", "Team Lunch"), ("football match", "Football Match"),
    ("piano lesson", "Piano Lesson"), ("job interview", "Job Interview"),
    ("birthday party", "Birthday Party"), ("doctor visit", "Doctor Visit"),
    ("book club", "Book Club"), ("haircut", "Haircut"), ("flight to Paris", "Flight to Paris"),
)  # fmt: skip
_MONTHS = (
    ("Jan", "January"), ("Feb", "February"), ("Mar", "March"), ("Apr", "April"), ("May", "May"),
    ("Jun", "June"), ("Jul", "July"), ("Aug", "August"), ("Sep", "September"),
    ("Oct", "October"), ("Nov", "November"), ("Dec", "December"),
)  # fmt: skip
_CORRECTIONS = (
    "Fix the year in the API call.", "Just the API call, please.", "Respect the date format.",
    "Time in 24h format.", "Duration is required.", "Use the default duration.",
    "Wrong next day.", "The time is wrong.", "The API requires three parameters.",
    "It's the wrong event now.", "Extra parenthesis.", "You don't need that info.",
)  # fmt: skip


@dataclass
class _Entry:
    title: str
    year: int
    month: int
    day: int
    hour: int
    minute: int
    duration: str = "30"

    def date(self) -> str:
        return f"{self.year:04d}-{self.month:02d}-{self.day:02d}"

    def time(self) -> str:
        return f"{self.hour:02d}:{self.minute:02d}"

    def add_call(self) -> str:
        return (
            f'action.add_calendar_entry("{self.title}", date="{self.date()}", '
            f'time="{self.time()}", duration={self.duration})'
        )

    def remove_call(self) -> str:
        return f'action.remove_calendar_entry("{self.title}", "{self.date()}", "{self.time()}")'


def _spoken_time(rng: random.Random, hour: int, minute: int) -> str:
    """How people say a time: "5PM", "8am", "10:30pm"."""
    half = "am" if hour < 12 else "pm"
    if rng.random() < 0.5:
        half = half.upper()
    hour12 = hour % 12 or 12
    return f"{hour12}{half}" if minute == 0 else f"{hour12}:{minute:02d}{half}"


def _conversation(rng: random.Random) -> list[ChatTurn]:
    """One scripted dialog: an imprecise request, a correction, then follow-ups."""
    month = rng.randrange(1, 13)
    day = rng.randrange(1, 29)
    hour = rng.randrange(7, 22)
    minute = rng.choice((0, 0, 0, 15, 30, 45))
    person = rng.choice(_NAMES)
    spoken_month = rng.choice(_MONTHS[month - 1])
    entry = _Entry(f"Meeting with {person}", 2023, month, day, hour, minute)
    turns = [
        ChatTurn(
            "user",
            f"Add a meeting with {person} on {spoken_month} {day} at {_spoken_time(rng, hour, minute)}",
        ),
        ChatTurn("assistant", entry.add_call()),
    ]
    year = rng.choice((2024, 2025, 2026))
    entry.year = year
    turns += [
        ChatTurn("user", f"The current year is {year}."),
        ChatTurn("assistant", entry.add_call()),
    ]
    follow_ups = rng.randrange(0, 4)
    for _ in range(follow_ups):
        kind = rng.random()
        if kind < 0.35:
            spoken, title = rng.choice(_EVENTS)
            hour = rng.randrange(12, 23)
            entry = _Entry(title, year, entry.month, entry.day, hour, 0)
            request = (
                f"I'm going to a {spoken} in the evening of the same day at "
                f"{_spoken_time(rng, hour, 0)}. Add a calendar entry for that."
            )
        elif kind < 0.6:
            hours = rng.randrange(1, 5)
            entry.duration = rng.choice((f"60*{hours}", str(60 * hours)))
            request = f"Set the duration to {hours} hour{'s' if hours > 1 else ''}."
        elif kind < 0.8:
            request = f"Cancel the {entry.title[0].lower()}{entry.title[1:]}."
            turns += [ChatTurn("user", request), ChatTurn("assistant", entry.remove_call())]
            continue
        else:
            request = rng.choice(_CORRECTIONS)
        turns += [ChatTurn("user", request), ChatTurn("assistant", entry.add_call())]
    return turns


def render_conversation(family: Family, system: str | None, turns: list[ChatTurn]) -> str:
    """Render a complete conversation ending with an assistant reply and its stop marker.

    ``render_prompt`` stops where a reply starts; training text needs the reply and the end
    marker the model must learn to emit (the first of the family's stop strings).
    """
    prompt = render_prompt(family, system, turns[:-1])
    return prompt + turns[-1].content + stop_strings(family)[0]


def calendar_corpus(family: Family, seed: int, size: int = CORPUS_CONVERSATIONS) -> list[str]:
    """Synthetic calendar conversations rendered with ``family``'s chat template."""
    rng = random.Random(seed)
    texts = []
    for _ in range(size):
        turns = _conversation(rng)
        # Cut the dialog after a random assistant reply, so every turn position is seen.
        cut = 2 * rng.randrange(1, len(turns) // 2 + 1)
        texts.append(render_conversation(family, SYSTEM_PROMPT, turns[:cut]))
    return texts


# --- Tokenizers ------------------------------------------------------------------------------


def train_gemma_sentencepiece(corpus: list[str], vocab_size: int = VOCABULARY_SIZE) -> bytes:
    """Train a SentencePiece model laid out the way ``GemmaTokenizer`` expects."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        user_defined_symbols=["\n", "<start_of_turn>", "<end_of_turn>"],
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        max_sentence_length=16384,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def train_llama3_bpe(corpus: list[str], vocab_size: int = VOCABULARY_SIZE) -> tuple[dict[str, int], list[str]]:
    """Train a byte-level BPE compatible with ``Llama3Tokenizer``; returns (vocab, merges)."""
    # A private name, but the one pattern that must match: keras-hub splits text with it at
    # inference, so training must split identically (pinned keras-hub version).
    from keras_hub.src.tokenizers.byte_pair_tokenizer import SPLIT_PATTERN_TOKENIZERS
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=SPLIT_PATTERN_TOKENIZERS, behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.add_special_tokens(list(LLAMA3_SPECIAL_TOKENS))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(LLAMA3_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The trainer does not honour added tokens when counting words (the markers would eat
    # merges like "< |"), so train on the text between the markers.
    marker = re.compile("|".join(re.escape(token) for token in LLAMA3_SPECIAL_TOKENS))
    pieces = [piece for text in corpus for piece in marker.split(text) if piece]
    tokenizer.train_from_iterator(pieces, trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


# --- Models ----------------------------------------------------------------------------------


def _build_gemma(seed: int) -> keras_hub.models.CausalLM:
    import keras
    import keras_hub

    corpus = calendar_corpus("gemma", seed)
    proto = train_gemma_sentencepiece(corpus)
    tokenizer = keras_hub.models.GemmaTokenizer(proto=proto, name="gemma_tokenizer")
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(
        tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH, name="gemma_causal_lm_preprocessor"
    )
    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=1,
        hidden_dim=128,
        intermediate_dim=512,
        head_dim=32,
        dtype="float32",
        name="gemma_backbone",
    )
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=preprocessor, name="gemma_causal_lm")


def _build_llama3(seed: int) -> keras_hub.models.CausalLM:
    import keras
    import keras_hub

    corpus = calendar_corpus("llama3", seed + 1)
    vocabulary, merges = train_llama3_bpe(corpus)
    # An explicit list: the default comes from iterating a set, so its order (saved in the
    # preset's config) would change with PYTHONHASHSEED and make rebuilds differ.
    tokenizer = keras_hub.models.Llama3Tokenizer(
        vocabulary=vocabulary,
        merges=merges,
        unsplittable_tokens=list(LLAMA3_SPECIAL_TOKENS[1:]),
        name="llama3_tokenizer",
    )
    preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(
        tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH, name="llama3_causal_lm_preprocessor"
    )
    keras.utils.set_random_seed(seed + 1)
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=128,
        intermediate_dim=256,
        dtype="float32",
        name="llama3_backbone",
    )
    return keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=preprocessor, name="llama3_causal_lm")


_BUILDERS = {"tiny-gemma": _build_gemma, "tiny-llama3": _build_llama3}


def build_demo_models(out_dir: Path, seed: int = 0) -> list[Path]:
    """Build every demo model and save it as a preset folder under ``out_dir``.

    Existing preset folders of the same names are replaced, so a rebuild never leaves stale
    files (e.g. an old tokenizer asset) behind. Returns the preset folders written. Sets the
    process-wide keras/NumPy/Python random seeds (that is how keras initialisers are seeded).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for model in demo_models(out_dir):
        lm = _BUILDERS[model.name](seed)
        if model.directory.exists():
            shutil.rmtree(model.directory)
        lm.save_to_preset(str(model.directory))
        written.append(model.directory)
    return written


def iter_preset_files(directory: Path) -> Iterator[Path]:
    """Files of a preset folder, for size reports."""
    return (p for p in sorted(Path(directory).rglob("*")) if p.is_file())
