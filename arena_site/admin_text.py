"""Admin text as typed: a browser sends a textarea's line breaks as CR LF (the HTML standard), so
without this every save of a task rewrote its system prompt and scripted turns with ``\\r\\n``,
even when an admin had edited only its notes. Text fields here keep the text as typed, ends
included (no stripping), with every line ending normalised to ``\\n``."""

from typing import Any

from django import forms
from django.db import models


def normalised_line_endings(text: str) -> str:
    """``text`` with CR LF and lone CR line endings as LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


class TypedTextField(forms.CharField):
    """A form's text as typed, line endings normalised to ``\\n``."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("strip", False)
        super().__init__(**kwargs)

    def to_python(self, value: Any) -> str:
        text = super().to_python(value)
        return normalised_line_endings(text) if isinstance(text, str) else text


class TypedTextAdmin:
    """For ModelAdmin and inline classes: every model TextField as a ``TypedTextField``."""

    formfield_overrides = {models.TextField: {"form_class": TypedTextField}}
