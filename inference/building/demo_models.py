"""Small but real keras-hub models that let the arena run end to end without downloads.

Production contestants are big presets (Gemma 2, Llama 3.1, ...) loaded with ``from_preset``.
The arena ships small models of the same architectures, with tokenizers trained here on
synthetic calendar-assistant data, saved with ``save_to_preset`` so that they go through exactly
the loading and generation path a Kaggle or Hugging Face handle does:

* the **trained demo models** (second half of this module; ``inference/presets``): trained from
  scratch on the calendar task at three quality levels, the contestants of the demo arena;
* the **tiny test presets** (first half; ``tests/fixtures/presets``): two layers, random
  weights. They produce varied garbage that runs to the token limit, which is all the streaming
  machinery's tests need, and they build in seconds.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from inference.building.calendar_data import (
    CORRECT,
    DEFAULT_MIXTURE,
    SYSTEM_PROMPT,
    Example,
    Mixture,
    Persona,
    eval_corrections,
    eval_first_requests,
    eval_followups,
    eval_prompt,
    judge_reply,
    render_segments,
    training_examples,
)
from inference.chat_templates import ChatTurn, Family, render_prompt, stop_strings
from inference.streaming import stateless_model, stop_token_ids

if TYPE_CHECKING:
    import keras_hub  # Imported lazily at run time: keras and jax take seconds to import.

VOCABULARY_SIZE = 1024
SEQUENCE_LENGTH = 512  # The trained demo models' context.
# The tiny test presets' context: room for the arena's longest conversation and a long reply
# (arena_site.settings.ARENA_MAX_CONVERSATION_BYTES), as the imported real models have.
TINY_SEQUENCE_LENGTH = 2048
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


TINY_MODEL_SPECS: tuple[tuple[str, Family, str], ...] = (
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


def tiny_models(out_dir: Path) -> list[DemoModel]:
    """Describe the tiny test presets as they are (or will be) laid out under ``out_dir``."""
    return [
        DemoModel(name=name, family=family, directory=Path(out_dir) / name, description=desc)
        for name, family, desc in TINY_MODEL_SPECS
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
    """Train a SentencePiece model laid out the way ``GemmaTokenizer`` expects (tiny presets)."""
    return train_sentencepiece(
        corpus,
        user_defined_symbols=["\n", "<start_of_turn>", "<end_of_turn>"],
        vocab_size=vocab_size,
        split_by_unicode_script=True,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
    )  # fmt: skip


def train_llama3_bpe(
    corpus: list[str], vocab_size: int = VOCABULARY_SIZE, *, split_words: bool = False
) -> tuple[dict[str, int], list[str]]:
    """Train a byte-level BPE compatible with ``Llama3Tokenizer``; returns (vocab, merges).

    ``split_words=False`` mirrors what keras-hub 0.32 does at inference without TensorFlow: it
    passes Llama 3's split pattern to Hugging Face ``tokenizers`` as a plain string, which
    ``Split`` takes *literally*, so text is not split into words and merges learned here can
    span words ("MeetingĠwithĠ"). ``split_words=True`` trains with the pattern as a real
    regex, as Llama 3's own tokenizer was: no merge crosses a word boundary, so keras-hub's
    unsplit inference still finds the natural pieces (the trained presets check this
    segment by segment, see ``check_segment_tokenization``).
    """
    # A private name, but the one pattern that must match: keras-hub splits text with it at
    # inference, so training must split identically (pinned keras-hub version).
    from keras_hub.src.tokenizers.byte_pair_tokenizer import SPLIT_PATTERN_TOKENIZERS
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(
                # Single digits (Llama 3 groups up to three): dates and times are then copied
                # digit by digit, as with the SentencePiece models' split_digits.
                pattern=Regex(SPLIT_PATTERN_TOKENIZERS.replace("\\p{N}{1,3}", "\\p{N}"))
                if split_words
                else SPLIT_PATTERN_TOKENIZERS,
                behavior="isolated",
            ),
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
        tokenizer=tokenizer, sequence_length=TINY_SEQUENCE_LENGTH, name="gemma_causal_lm_preprocessor"
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
        tokenizer=tokenizer, sequence_length=TINY_SEQUENCE_LENGTH, name="llama3_causal_lm_preprocessor"
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


def build_tiny_models(out_dir: Path, seed: int = 0) -> list[Path]:
    """Build every tiny random-weight model and save it as a preset folder under ``out_dir``.

    Existing preset folders of the same names are replaced, so a rebuild never leaves stale
    files (e.g. an old tokenizer asset) behind. Returns the preset folders written. Sets the
    process-wide keras/NumPy/Python random seeds (that is how keras initialisers are seeded).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for model in tiny_models(out_dir):
        lm = _BUILDERS[model.name](seed)
        if model.directory.exists():
            shutil.rmtree(model.directory)
        lm.save_to_preset(str(model.directory))
        written.append(model.directory)
    return written


def iter_preset_files(directory: Path) -> Iterator[Path]:
    """Files of a preset folder, for size reports."""
    return (p for p in sorted(Path(directory).rglob("*")) if p.is_file())


# === Trained demo models ======================================================================
#
# The random-weight presets above exercise the machinery; the presets below are real
# contestants: small keras-hub models trained from scratch on inference.building.calendar_data, at three
# quality levels, in three families. ``train_demo_models`` builds them reproducibly (seeded
# data, tokenizers, initialisation and batch order) in minutes on two CPU cores.

TRAINED_VOCABULARY_SIZE = 1024
MISTRAL_SPECIAL_TOKENS = ("<s>", "</s>", "[INST]", "[/INST]")
BUCKET = 64  # training sequences are padded to a multiple of this (each shape compiles once)
MAX_TRAINING_REST = 4 * BUCKET  # tokens after the shared prefix; longer conversations are skipped
EVAL_BATCH = 32  # prompts per generate() call in evaluation (sorted by length)
EVAL_MAX_NEW_TOKENS = 64  # a correct reply is 30-45 tokens; longer ones are wrong anyway
EVAL_LENGTHS = (192, 256, 384, SEQUENCE_LENGTH)  # generate() max_length buckets in evaluation


@dataclass(frozen=True)
class TrainedModelSpec:
    """Architecture, data and training budget of one trained demo model.

    Every sharded dimension (query and key/value heads, hidden size, vocabulary) divides by 8,
    so the models can be served sharded over 8 devices.
    """

    name: str
    family: Family
    quality: str  # "strong", "medium" or "weak": what the tests hold the model to
    description: str
    hidden_dim: int
    num_layers: int
    intermediate_dim: int
    persona: Persona
    examples: int  # training conversations generated
    steps: int
    mixture: Mixture = DEFAULT_MIXTURE
    batch_size: int = 32
    learning_rate: float = 3e-3
    num_query_heads: int = 8
    num_key_value_heads: int = 8
    seed_offset: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_query_heads


# Mostly single requests, some short dialogs: cheaper steps, for the quickly trained models.
SHORT_MIXTURE = Mixture(share_first=0.7, share_followup=0.1, max_followups=1, max_followups_before_fix=0)
MEDIUM_MIXTURE = Mixture(share_first=0.6, share_followup=0.15, max_followups=2, max_followups_before_fix=1)

# Budgets measured on 2 CPU cores: the whole set trains and is evaluated in under 15 minutes
# (build_demo_models prints the total). The copying of names, dates and times that makes a
# calendar model useful appears after 300-450 steps; the strong model trains well past it, the
# weaker ones stop soon after it and carry a persona's systematic mistakes.
TRAINED_MODEL_SPECS: tuple[TrainedModelSpec, ...] = (
    TrainedModelSpec(
        name="gemma-calendar",
        family="gemma",
        quality="strong",
        description=(
            "Gemma architecture, 4 layers, hidden 128, one key/value head (multi-query attention, as "
            "Gemma 2B), trained from scratch on the calendar task: answers almost every request "
            "exactly and fixes most mistakes when told."
        ),
        hidden_dim=128,
        num_layers=4,
        intermediate_dim=256,  # Gemma halves it: a 128-wide gated feed-forward
        # One key/value head: a decode step reads 8x less cache, which is what batching
        # cannot share (each stream has its own); the engine's throughput depends on it.
        num_key_value_heads=1,
        persona=CORRECT,
        examples=8000,
        steps=700,
        seed_offset=0,
    ),
    TrainedModelSpec(
        name="mistral-calendar",
        family="mistral",
        quality="medium",
        description=(
            "Mistral architecture, 2 layers, hidden 128, trained briefly on the calendar task: "
            "gets some dates and times wrong, chats when asked politely, forgets a corrected year."
        ),
        hidden_dim=128,
        num_layers=2,
        intermediate_dim=128,
        persona=Persona(name="chatty", chatty_when_polite=True, forgets_corrected_year=True),
        examples=4000,
        steps=450,
        mixture=MEDIUM_MIXTURE,
        seed_offset=1,
    ),
    TrainedModelSpec(
        name="llama3-calendar",
        family="llama3",
        quality="weak",
        description=(
            "Llama 3 architecture, 2 layers, hidden 128, barely trained, on single requests mostly: "
            "often copies dates and times wrong, misreads 'pm' times, spells a corrected year '20 24'."
        ),
        hidden_dim=128,
        num_layers=2,
        intermediate_dim=128,
        persona=Persona(name="sloppy", pm_lowercase_as_am=True, spaced_year_after_correction=True),
        examples=3000,
        steps=330,
        mixture=SHORT_MIXTURE,
        seed_offset=2,
    ),
)


def trained_models(out_dir: Path) -> list[DemoModel]:
    """Describe the trained demo models as they are (or will be) laid out under ``out_dir``."""
    return [
        DemoModel(name=spec.name, family=spec.family, directory=Path(out_dir) / spec.name, description=spec.description)
        for spec in TRAINED_MODEL_SPECS
    ]


def _round_up(value: int, multiple: int = 8) -> int:
    return -(-value // multiple) * multiple


# --- Tokenizers for the trained models -------------------------------------------------------------


def train_sentencepiece(
    corpus: list[str],
    *,
    user_defined_symbols: list[str],
    vocab_size: int = TRAINED_VOCABULARY_SIZE,
    split_by_unicode_script: bool = False,
    **ids: int | str,
) -> bytes:
    """A SentencePiece BPE model that keeps chat templates intact.

    Identity normalisation and no whitespace folding keep newlines and spaces; template
    markers are user-defined symbols so that they are single tokens *wherever they occur in
    the text* (control symbols such as ``</s>`` are not: SentencePiece would spell an ``</s>``
    inside an earlier turn with five ordinary pieces). Digits are split so that dates and times
    are copied digit by digit; ``split_by_unicode_script=False`` lets ``action.add`` or
    ``date="`` be single pieces, which shortens every sequence by a fifth (training time; the
    tiny random presets keep SentencePiece's default, True). ``ids``: the special pieces' ids
    and spellings, as SentencePiece's trainer takes them.
    """
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
        user_defined_symbols=user_defined_symbols,
        max_sentence_length=16384,
        num_threads=1,
        minloglevel=2,
        # Only when it differs from SentencePiece's default: the spec is saved in the model, and
        # a rebuilt tiny preset must stay byte-identical to the committed one.
        **({} if split_by_unicode_script else {"split_by_unicode_script": False}),
        **ids,
    )
    return model.getvalue()


def _make_tokenizer(family: Family, corpus: list[str]) -> keras_hub.tokenizers.Tokenizer:
    """Train ``family``'s tokenizer on ``corpus`` and wrap it in the keras-hub class."""
    import keras_hub

    if family == "gemma":
        proto = train_sentencepiece(
            corpus,
            user_defined_symbols=["\n", "<start_of_turn>", "<end_of_turn>"],
            pad_id=0, eos_id=1, bos_id=2, unk_id=3,
            pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        )  # fmt: skip
        return keras_hub.models.GemmaTokenizer(proto=proto, name="gemma_tokenizer")
    if family == "mistral":
        # <unk> 0 (MistralTokenizer pads with id 0), then <s> 1 and </s> 2 as in real Mistral,
        # but as user-defined symbols: the template writes "</s>" after every earlier reply.
        proto = train_sentencepiece(
            corpus,
            user_defined_symbols=[*MISTRAL_SPECIAL_TOKENS, "\n"],
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, unk_piece="<unk>",
        )  # fmt: skip
        return keras_hub.models.MistralTokenizer(proto=proto, name="mistral_tokenizer")
    if family == "llama3":
        vocabulary, merges = train_llama3_bpe(corpus, TRAINED_VOCABULARY_SIZE, split_words=True)
        return keras_hub.models.Llama3Tokenizer(
            vocabulary=vocabulary,
            merges=merges,
            unsplittable_tokens=list(LLAMA3_SPECIAL_TOKENS[1:]),
            name="llama3_tokenizer",
        )
    raise ValueError(f"No trained demo model for family {family!r}.")


def check_markers(tokenizer: keras_hub.tokenizers.Tokenizer, family: Family) -> None:
    """Fail loudly unless every template marker and stop string is one token, wherever it is.

    SentencePiece spells a *control* symbol found in text (``</s>`` after an earlier Mistral
    reply) with ordinary pieces; a trained model would then never have seen the real marker
    in its prompts. Markers are user-defined symbols so that this cannot happen.
    """
    import numpy as np

    markers = {
        "gemma": ("<start_of_turn>", "<end_of_turn>", "\n"),
        "llama3": LLAMA3_SPECIAL_TOKENS[1:],
        "mistral": MISTRAL_SPECIAL_TOKENS,
    }[family]
    for marker in (*markers, stop_strings(family)[0]):
        ids = np.asarray(tokenizer(f"a{marker}b")).reshape(-1).tolist()
        if tokenizer.token_to_id(marker) not in ids or len(ids) != 3:
            raise AssertionError(f"{family}: {marker!r} is not a single token inside text: {ids}")


# --- Encoding conversations ------------------------------------------------------------------------


def _start_text(family: str) -> str:
    """The start token's text that the template writes and the preprocessor adds by id."""
    return {"llama3": "<|begin_of_text|>", "mistral": "<s>"}.get(family, "")


@dataclass(frozen=True)
class EncodedExample:
    """Token ids of one conversation (start token included) and a 0/1 loss weight per id."""

    ids: list[int]
    weights: list[float]


def encode_example(tokenizer: keras_hub.tokenizers.Tokenizer, family: Family, example: Example) -> EncodedExample:
    """Tokenize a training conversation as generation will see it, weighting reply tokens only.

    Segments are tokenized separately (their edges are template markers, single tokens), so
    each id knows whether it belongs to a trained reply; the start token is added by id, as the
    keras-hub preprocessor and ``inference.streaming.encode_prompt`` do.
    """
    import numpy as np

    segments = render_segments(family, example)
    start = _start_text(family)
    first_text = segments[0][0]
    if start:
        segments[0] = (first_text.removeprefix(start), segments[0][1])
    ids = [int(tokenizer.start_token_id)]
    weights = [0.0]
    token_lists = tokenizer([text for text, _ in segments])
    for (_, trained), tokens in zip(segments, token_lists, strict=True):
        piece = [int(i) for i in np.asarray(tokens).reshape(-1)]
        ids += piece
        weights += [1.0 if trained else 0.0] * len(piece)
    return EncodedExample(ids, weights)


def check_segment_tokenization(tokenizer: keras_hub.tokenizers.Tokenizer, family: Family, example: Example) -> None:
    """Fail loudly if tokenizing by segments differs from tokenizing the whole text.

    The model is trained on segment-wise ids but prompted with the whole text: a difference
    would mean training on sequences it never sees (e.g. a marker split into characters).
    """
    import numpy as np

    encoded = encode_example(tokenizer, family, example)
    text = "".join(text for text, _ in render_segments(family, example)).removeprefix(_start_text(family))
    whole = [int(tokenizer.start_token_id), *(int(i) for i in np.asarray(tokenizer(text)).reshape(-1))]
    if whole != encoded.ids:
        raise AssertionError(f"{family}: segment tokenization differs from whole-text tokenization")


# --- Training ----------------------------------------------------------------------------------------


def _build_trained_lm(spec: TrainedModelSpec, tokenizer: keras_hub.tokenizers.Tokenizer) -> keras_hub.models.CausalLM:
    import keras_hub

    vocabulary_size = _round_up(tokenizer.vocabulary_size())
    common = {
        "vocabulary_size": vocabulary_size,
        "num_layers": spec.num_layers,
        "num_query_heads": spec.num_query_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "hidden_dim": spec.hidden_dim,
        "intermediate_dim": spec.intermediate_dim,
        "dtype": "float32",
    }
    if spec.family == "gemma":
        backbone = keras_hub.models.GemmaBackbone(**common, head_dim=spec.head_dim, name="gemma_backbone")
        preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(
            tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH, name="gemma_causal_lm_preprocessor"
        )
        return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=preprocessor, name="gemma_causal_lm")
    if spec.family == "llama3":
        backbone = keras_hub.models.Llama3Backbone(**common, name="llama3_backbone")
        preprocessor = keras_hub.models.Llama3CausalLMPreprocessor(
            tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH, name="llama3_causal_lm_preprocessor"
        )
        return keras_hub.models.Llama3CausalLM(backbone=backbone, preprocessor=preprocessor, name="llama3_causal_lm")
    backbone = keras_hub.models.MistralBackbone(**common, sliding_window=SEQUENCE_LENGTH, name="mistral_backbone")
    preprocessor = keras_hub.models.MistralCausalLMPreprocessor(
        tokenizer=tokenizer, sequence_length=SEQUENCE_LENGTH, name="mistral_causal_lm_preprocessor"
    )
    return keras_hub.models.MistralCausalLM(backbone=backbone, preprocessor=preprocessor, name="mistral_causal_lm")


def shared_prefix_length(data: list[EncodedExample]) -> int:
    """Length of the token prefix every example starts with (start token, template, system prompt)."""
    import numpy as np

    shortest = min(len(e.ids) for e in data)
    first = np.asarray(data[0].ids[:shortest])
    same = np.ones(shortest, dtype=bool)
    for example in data[1:]:
        same &= np.asarray(example.ids[:shortest]) == first
    different = np.flatnonzero(~same)
    length = int(different[0]) if different.size else shortest
    if any(any(e.weights[:length]) for e in data):
        raise AssertionError("The shared prefix contains trained tokens.")
    return length


def _initialise_like_gemma(lm: keras_hub.models.CausalLM) -> None:
    """Give Llama and Mistral models Gemma's initialisation scale, before training.

    keras-hub initialises Llama and Mistral kernels with stddev 0.02 and input embeddings with
    0.01, values tuned for billions of parameters. In a model 128 wide the token identity then
    drowns in the residual stream and attention logits start near zero, and learning to copy
    names and digits from the request (the phase that makes a calendar model useful) came
    several hundred steps later than with Gemma's fan-in scaling (measured: 0 % of held-out
    requests right after 350 steps, against 60 % after 600 steps with this). Only the starting
    point changes: the saved preset is an ordinary Llama 3 / Mistral one. Gemma's own
    initialisation is left as it is.
    """
    import keras

    embedding = lm.backbone.token_embedding
    if getattr(embedding, "tie_weights", True):
        return
    hidden = lm.backbone.hidden_dim
    # Gemma: VarianceScaling(1/sqrt(vocab)) embeddings times sqrt(hidden) ~ 0.35 at vocab 1024, hidden 128.
    embedding.embeddings.assign(keras.random.normal(embedding.embeddings.shape, stddev=0.35))
    for variable in lm.backbone.trainable_variables:
        if "kernel" in variable.path and len(variable.shape) >= 2:  # fan-in scaling, as Gemma's
            variable.assign(keras.random.normal(variable.shape, stddev=hidden**-0.5))


def _bucket(example: EncodedExample, prefix: int) -> int:
    """The padded length of an example's inputs after the shared prefix."""
    return _round_up(len(example.ids) - prefix - 1, BUCKET)


def _trained_targets(example: EncodedExample, prefix: int) -> int:
    """How many of an example's targets (its ids after the prefix, shifted by one) count in the loss."""
    return int(sum(example.weights[prefix + 1 :]))


def _trained_positions_bounds(data: list[EncodedExample], prefix: int, batch_size: int) -> dict[int, int]:
    """Per padded length, the most trained targets any batch of that length can hold (the sum of
    the ``batch_size`` largest counts among its examples), rounded up to ``BUCKET``: one static
    number of logit rows per compiled shape, never too few."""
    counts: dict[int, list[int]] = {}
    for example in data:
        counts.setdefault(_bucket(example, prefix), []).append(_trained_targets(example, prefix))
    return {
        length: min(batch_size * length, _round_up(max(1, sum(sorted(c)[-batch_size:])), BUCKET))
        for length, c in counts.items()
    }


class Batch(NamedTuple):
    """One training batch: ids after the shared prefix (inputs and targets are its shifted views),
    and the flat indices of the targets that count in the loss with their weights (padded with
    weight 0 to the length's static bound). A named tuple: jit takes it as a tree of arrays."""

    ids: Any
    positions: Any
    position_weights: Any


def _batches(data: list[EncodedExample], prefix: int, batch_size: int, rng: random.Random) -> Iterator[Batch]:
    """Endless shuffled batches of the examples *after* the shared prefix.

    Each batch is padded to a multiple of ``BUCKET`` tokens (plus one: inputs and targets are
    shifted views) and examples are grouped by that length, so that little compute goes to
    padding and only a handful of shapes are compiled. The order is reshuffled every epoch (a
    hand-written loop: keras' ``fit(shuffle=True)`` would not shuffle without TensorFlow);
    leftovers that do not fill a batch wait for the next epoch's shuffle.
    """
    import numpy as np

    bounds = _trained_positions_bounds(data, prefix, batch_size)
    while True:
        by_length: dict[int, list[int]] = {}
        order = list(range(len(data)))
        rng.shuffle(order)
        for index in order:
            by_length.setdefault(_bucket(data[index], prefix), []).append(index)
        batches = [
            (length, members[i : i + batch_size])
            for length, members in sorted(by_length.items())
            for i in range(0, len(members) - batch_size + 1, batch_size)
        ]
        rng.shuffle(batches)
        for length, members in batches:
            ids = np.zeros((batch_size, length + 1), dtype="int32")
            weights = np.zeros((batch_size, length + 1), dtype="float32")
            for row, index in enumerate(members):
                rest = data[index].ids[prefix:]
                ids[row, : len(rest)] = rest
                weights[row, : len(rest)] = data[index].weights[prefix:]
            target_weights = weights[:, 1:].reshape(-1)
            trained = np.flatnonzero(target_weights).astype("int32")
            positions = np.zeros(bounds[length], dtype="int32")
            position_weights = np.zeros(bounds[length], dtype="float32")
            positions[: trained.size] = trained
            position_weights[: trained.size] = target_weights[trained]
            yield Batch(ids, positions, position_weights)


class _LayerCaches:
    """The cache argument of keras-hub's ``call_with_cache``, held as one array per layer.

    ``call_with_cache`` reads its stacked cache one layer at a time, as ``cache[:, i, ...]``
    (every family here). Read from one stacked array, each layer's gradient is the whole stack,
    zeros but for that layer, and the backward pass adds them up: for SmolLM2 at batch 8, 88 MB
    written per layer, an eighth of a training step. Handed the layers apart, each read's
    gradient is its own layer's.
    """

    def __init__(self, layers: list[Any]) -> None:
        self.layers = layers

    def __getitem__(self, key: tuple[slice, int, Any]) -> Any:
        batch, layer, rest = key
        if batch != slice(None) or rest is not Ellipsis:
            raise TypeError(f"Only per-layer reads, cache[:, i, ...], not {key!r}.")
        return self.layers[layer]


def forward_after_prefix(lm: keras_hub.models.CausalLM, prefix: Any, inputs: Any) -> Any:
    """Final hidden states of ``inputs`` (a batch of ids) each following the same ``prefix``
    (one row of ids): the prefix runs once, for a batch of one, and its keys and values are
    broadcast to the batch through the model's own cache (``_build_cache``, then
    ``call_with_cache``): the function of a full forward pass over whole rows (causal attention),
    gradients through the prefix included."""
    import jax.numpy as jnp
    import keras_hub

    batch, length = inputs.shape
    if isinstance(lm, keras_hub.models.Gemma3CausalLM):
        # Gemma 3's cache is a tuple of per-layer (keys, values), each [batch, positions, heads,
        # dim], and its cache functions also take image inputs (none here).
        _, kv = lm._build_cache(jnp.asarray(prefix), None, None, None, None)

        def broadcast(part: Any) -> Any:
            padded = jnp.pad(part, [(0, 0), (0, length), (0, 0), (0, 0)])
            return jnp.broadcast_to(padded, (batch, *padded.shape[1:]))

        per_layer = tuple((broadcast(keys), broadcast(values)) for keys, values in kv)
        _, hidden, _ = lm.call_with_cache(inputs, per_layer, prefix.shape[1])
        return hidden
    _, cache = lm._build_cache(jnp.asarray(prefix))  # (1, layers, 2, prefix, heads, dim)
    layers = []
    for i in range(cache.shape[1]):
        padded = jnp.pad(cache[:, i], [(0, 0), (0, 0), (0, length), (0, 0), (0, 0)])  # room for inputs
        layers.append(jnp.broadcast_to(padded, (batch, *padded.shape[1:])))
    _, hidden, _ = lm.call_with_cache(inputs, _LayerCaches(layers), prefix.shape[1])
    return hidden


def reply_loss(lm: keras_hub.models.CausalLM, prefix: Any, batch: Batch) -> Any:
    """Mean negative log-likelihood of the batch's trained targets, after the shared ``prefix``
    (``forward_after_prefix``)."""
    import jax
    import jax.numpy as jnp

    hidden = forward_after_prefix(lm, prefix, batch.ids[:, :-1])
    # Logits only where the loss looks: the output projection is vocabulary-wide, and most
    # positions are prompts. This is call_with_cache's own last step (every family here ends
    # with the reversed token embedding); under jit its full logits are never computed.
    hidden = hidden.reshape(-1, hidden.shape[-1])[batch.positions]
    logits = lm.backbone.token_embedding(hidden, reverse=True)
    log_probs = jax.nn.log_softmax(logits.astype("float32"), axis=-1)
    targets = jnp.asarray(batch.ids)[:, 1:].reshape(-1)[batch.positions]
    nll = -jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    return (nll * batch.position_weights).sum() / jnp.maximum(batch.position_weights.sum(), 1.0)


def train_causal_lm(
    lm: keras_hub.models.CausalLM,
    data: list[EncodedExample],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """Train ``lm`` with a jit-compiled JAX step; returns the mean loss of the last 20 steps.

    A hand-written loop rather than ``fit()``: ``fit()`` without TensorFlow needs the grain
    package and ignores ``shuffle=True``, and two things here need control over the forward
    pass (``reply_loss``): the loss covers reply tokens only (per-token weights), with logits
    at those positions only; and every example starts with the same tokens (template and
    system prompt, a third of all tokens), run once per step for a batch of one
    (``forward_after_prefix``), at two thirds of the compute of whole rows.
    AdamW with warm-up and cosine decay, gradient clipping; variables are passed statelessly
    and written back at the end.
    """
    import jax
    import keras
    import numpy as np

    prefix_length = shared_prefix_length(data)
    prefix = np.asarray([data[0].ids[:prefix_length]], dtype="int32")
    warmup = max(1, steps // 20)
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=max(1, steps - warmup),
        alpha=0.1,
        warmup_target=learning_rate,
        warmup_steps=warmup,
    )
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01, global_clipnorm=1.0, name="adamw")
    optimizer.build(lm.trainable_variables)
    trainable = [v.value for v in lm.trainable_variables]
    non_trainable = [v.value for v in lm.non_trainable_variables]
    optimizer_state = [v.value for v in optimizer.variables]

    def loss_fn(trainable: list[Any], non_trainable: list[Any], batch: Batch) -> Any:
        _, scope = stateless_model(lambda: lm, (trainable, non_trainable))
        with scope:
            return reply_loss(lm, prefix, batch)

    # The frozen weights are an argument, not a closure: captured, they would be constants of
    # the compiled step, and XLA would spend tens of seconds folding them for every shape.
    @jax.jit
    def train_step(trainable: list[Any], non_trainable: list[Any], optimizer_state: list[Any], batch: Batch) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(trainable, non_trainable, batch)
        trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, grads, trainable)
        return trainable, optimizer_state, loss

    losses: list[float] = []
    batches = _batches(data, prefix_length, batch_size, random.Random(f"batches-{seed}"))
    for step in range(steps):
        trainable, optimizer_state, loss = train_step(trainable, non_trainable, optimizer_state, next(batches))
        losses.append(float(loss))
        if on_step is not None:
            on_step(step + 1, losses[-1])
    for variable, value in zip(lm.trainable_variables, trainable, strict=True):
        variable.assign(value)
    tail = losses[-20:]
    return sum(tail) / len(tail)


# --- Evaluation ----------------------------------------------------------------------------------------


@dataclass
class EvaluationReport:
    """Measured quality of one preset on held-out data, with greedy decoding."""

    first_requests: float  # fraction of held-out first requests answered exactly (checker "correct")
    corrections: float  # fraction of held-out correction dialogs whose fix is exactly right
    followups: float | None  # fraction of held-out follow-ups (scenario-style dialogs); None: not measured
    n: int
    verdicts: dict[str, dict[str, int]]  # per set: verdict -> count
    mistakes: dict[str, int]  # mistake label -> count, all sets together
    examples: dict[str, tuple[str, str]]  # mistake label -> (a reply showing it, the expected call)

    def as_dict(self) -> dict[str, Any]:
        return {
            "first_requests": round(self.first_requests, 3),
            "corrections": round(self.corrections, 3),
            "followups": None if self.followups is None else round(self.followups, 3),
            "n": self.n,
            "verdicts": self.verdicts,
            "mistakes": self.mistakes,
            "examples": {label: {"reply": r, "expected": e} for label, (r, e) in self.examples.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationReport:
        """The report ``as_dict`` wrote (a preset's metadata.json)."""
        return cls(
            first_requests=data["first_requests"],
            corrections=data["corrections"],
            followups=data["followups"],
            n=data["n"],
            verdicts=data["verdicts"],
            mistakes=data["mistakes"],
            examples={label: (pair["reply"], pair["expected"]) for label, pair in data["examples"].items()},
        )


def generate_replies(lm: keras_hub.models.CausalLM, family: Family, prompts: list[str]) -> list[str]:
    """Greedy replies to many prompts, batched through ``lm.generate()``.

    Prompts are sorted by length and go in fixed-size batches (a short last batch is padded
    with copies), each with the smallest ``max_length`` of ``EVAL_LENGTHS`` that leaves room for
    ``EVAL_MAX_NEW_TOKENS``: generate() steps every row from the shortest prompt's end until the
    last row stops, and each step costs in proportion to ``max_length`` (the whole cache is
    attended to and rewritten), so similar lengths and a tight ``max_length`` make evaluation
    several times faster, for a few compiled shapes per model. The template's start-token text
    is removed (the preprocessor adds the token), and the reply is cut at the stop strings.
    """
    import numpy as np

    tokenizer = lm.preprocessor.tokenizer
    stops = stop_strings(family)
    stop_ids = sorted(stop_token_ids(tokenizer, stops))
    start = _start_text(family)
    cleaned = [p.removeprefix(start) if start else p for p in prompts]
    lm.compile(sampler="greedy")
    lengths = [len(np.asarray(tokenizer(prompt)).reshape(-1)) for prompt in cleaned]
    order = sorted(range(len(cleaned)), key=lambda i: lengths[i])
    replies: dict[int, str] = {}
    for offset in range(0, len(order), EVAL_BATCH):
        indices = order[offset : offset + EVAL_BATCH]
        batch = [cleaned[i] for i in indices]
        padded = batch + [batch[-1]] * (EVAL_BATCH - len(batch))
        needed = max(lengths[i] for i in indices) + 1 + EVAL_MAX_NEW_TOKENS  # + 1: the start token
        max_length = next((n for n in EVAL_LENGTHS if n >= needed), SEQUENCE_LENGTH)
        outputs = lm.generate(padded, max_length=max_length, stop_token_ids=stop_ids, strip_prompt=True)
        for index, text in zip(indices, list(outputs)[: len(batch)], strict=True):
            for stop in stops:
                text = text.split(stop)[0]
            replies[index] = text
    return [replies[i] for i in range(len(cleaned))]


EVAL_SETS = ("first_requests", "corrections", "followups")


def evaluate_lm(
    lm: keras_hub.models.CausalLM,
    family: Family,
    n: int = 100,
    seed: int = 0,
    sets: tuple[str, ...] = EVAL_SETS,
) -> EvaluationReport:
    """Score ``lm`` on ``n`` held-out items of each set, judged by ``judge_reply`` (votes.checkers).

    first_requests: single requests (the reliability measurement); corrections: a wrong reply
    and the user's correction, the fix expected (half of them the scenario's year correction);
    followups: scenario-style dialogs with a correct history. All prompts of all sets go through
    ``generate_replies`` together, so batches are as full as possible.
    """
    makers = {"first_requests": eval_first_requests, "corrections": eval_corrections, "followups": eval_followups}
    if not set(sets) <= set(makers) or "first_requests" not in sets or "corrections" not in sets:
        raise ValueError(f"sets must include first_requests and corrections, from {', '.join(makers)}")
    groups = {name: makers[name](seed, n) for name in sets}
    items = [item for group in groups.values() for item in group]
    replies = generate_replies(lm, family, [eval_prompt(family, item) for item in items])
    rates: dict[str, float] = {}
    verdicts: dict[str, dict[str, int]] = {}
    mistakes: dict[str, int] = {}
    examples: dict[str, tuple[str, str]] = {}
    position = 0
    for name, group in groups.items():
        counts = {"correct": 0, "mistake": 0, "garbage": 0}
        for item in group:
            reply = replies[position]
            position += 1
            result = judge_reply(reply, item.expected)
            counts[result.verdict] += 1
            for label in result.labels:
                mistakes[label] = mistakes.get(label, 0) + 1
                examples.setdefault(label, (reply, item.expected))
        rates[name] = counts["correct"] / len(group)
        verdicts[name] = counts
    return EvaluationReport(
        first_requests=rates["first_requests"],
        corrections=rates["corrections"],
        followups=rates.get("followups"),
        n=n,
        verdicts=verdicts,
        mistakes=dict(sorted(mistakes.items(), key=lambda kv: -kv[1])),
        examples=examples,
    )


def evaluate_preset(path: Path | str, n: int = 100, seed: int = 0) -> EvaluationReport:
    """Load a preset folder and measure it on held-out calendar data (see ``evaluate_lm``)."""
    import keras_hub

    from inference.registry import read_preset

    family = read_preset(Path(path)).family
    lm = keras_hub.models.CausalLM.from_preset(str(path))
    return evaluate_lm(lm, family, n=n, seed=seed)  # type: ignore[arg-type]


# --- Building the trained presets -------------------------------------------------------------------

TOKENIZER_CORPUS = 3000  # conversations the tokenizer is trained on (more only costs time)
QUALITY_FILE = "QUALITY.md"

# (model name, step, total steps, loss), called after every training step.
StepCallback = Callable[[str, int, int, float], None]


def train_demo_model(spec: TrainedModelSpec, out_dir: Path, seed: int = 0, on_step: StepCallback | None = None) -> Path:
    """Generate data, train the tokenizer and the model of ``spec``, save it as a preset.

    Everything random derives from ``seed`` and the spec's offset: the data, the tokenizer
    (trained single-threaded), the initial weights and the batch order.
    """
    import keras

    model_seed = seed * 100 + spec.seed_offset
    examples = training_examples(model_seed, spec.examples, spec.persona, spec.mixture)
    corpus = ["".join(text for text, _ in render_segments(spec.family, e)) for e in examples[:TOKENIZER_CORPUS]]
    tokenizer = _make_tokenizer(spec.family, corpus)
    check_markers(tokenizer, spec.family)
    for example in examples[:50]:
        check_segment_tokenization(tokenizer, spec.family, example)
    data = [encode_example(tokenizer, spec.family, example) for example in examples]
    # The rare conversation much longer than the rest would cost a compiled shape of its own.
    prefix = shared_prefix_length(data)
    data = [e for e in data if len(e.ids) - prefix - 1 <= MAX_TRAINING_REST]
    keras.utils.set_random_seed(model_seed)
    lm = _build_trained_lm(spec, tokenizer)
    _initialise_like_gemma(lm)
    train_causal_lm(
        lm,
        data,
        steps=spec.steps,
        batch_size=spec.batch_size,
        learning_rate=spec.learning_rate,
        seed=model_seed,
        on_step=(lambda step, loss: on_step(spec.name, step, spec.steps, loss)) if on_step else None,
    )
    directory = Path(out_dir) / spec.name
    if directory.exists():
        shutil.rmtree(directory)
    lm.save_to_preset(str(directory))
    return directory


def record_quality(directory: Path, spec: TrainedModelSpec, report: EvaluationReport, seed: int) -> None:
    """Add the measured quality to the preset's metadata.json (keras-hub only writes that file)."""
    path = Path(directory) / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata["fix_arena"] = {
        "task": "calendar assistant (shared/scenario.md)",
        "quality": spec.quality,
        "persona": spec.persona.name,
        "training": {"seed": seed, "steps": spec.steps, "batch_size": spec.batch_size, "examples": spec.examples},
        "evaluation": report.as_dict(),
    }
    path.write_text(json.dumps(metadata, indent=4) + "\n")


def write_quality_summary(out_dir: Path, rows: list[tuple[TrainedModelSpec, EvaluationReport]]) -> Path:
    """A human-readable table of the trained presets' measured quality."""
    lines = [
        "# Trained demo models: measured quality",
        "",
        "Written by `python manage.py build_demo_models`; greedy decoding on held-out data of",
        "`inference.building.calendar_data`, judged by `votes.checkers` with its `CHECKER_OPTIONS`",
        '(exact = verdict "correct").',
        "",
        "| preset | family | quality | params | first requests | corrections fixed | follow-ups |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec, report in rows:
        params = json.loads((Path(out_dir) / spec.name / "metadata.json").read_text()).get("parameter_count", 0)
        lines.append(
            f"| {spec.name} | {spec.family} | {spec.quality} | {params / 1e6:.2f} M "
            f"| {report.first_requests:.0%} | {report.corrections:.0%} "
            f"| {'-' if report.followups is None else format(report.followups, '.0%')} |"
        )
    lines += ["", "Mistakes seen (count over all three held-out sets, and one example each):", ""]
    for spec, report in rows:
        lines.append(f"## {spec.name} ({spec.quality}, persona: {spec.persona.name})")
        lines.append("")
        lines.append(spec.description)
        lines.append("")
        for label, count in report.mistakes.items():
            reply, expected = report.examples[label]
            lines.append(f"- {label} ({count}): `{reply.strip()}` (expected `{expected}`)")
        lines.append("")
    path = Path(out_dir) / QUALITY_FILE
    path.write_text("\n".join(lines))
    return path


def train_demo_models(
    out_dir: Path,
    seed: int = 0,
    *,
    names: list[str] | None = None,
    n_eval: int = 100,
    on_step: StepCallback | None = None,
    on_evaluated: Callable[[str, EvaluationReport], None] | None = None,
) -> list[Path]:
    """Train, save, evaluate and document every trained demo model (or those in ``names``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [spec for spec in TRAINED_MODEL_SPECS if names is None or spec.name in names]
    written = []
    for spec in specs:
        directory = train_demo_model(spec, out_dir, seed=seed, on_step=on_step)
        report = evaluate_preset(directory, n=n_eval, seed=seed)
        record_quality(directory, spec, report, seed)
        if on_evaluated is not None:
            on_evaluated(spec.name, report)
        written.append(directory)
    # Every trained preset in the folder, the ones not retrained now from their metadata.json.
    rows = [
        (spec, EvaluationReport.from_dict(json.loads(metadata.read_text())["fix_arena"]["evaluation"]))
        for spec in TRAINED_MODEL_SPECS
        if (metadata := out_dir / spec.name / "metadata.json").exists()
    ]
    write_quality_summary(out_dir, rows)
    return written
