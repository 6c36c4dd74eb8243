"""``{{ text|inert }}``: voter text on a server-rendered page with its acting characters shown as
their code points, as markdown.js does in the browser (keep the two in step): C0 and C1 controls
(tab and line breaks aside) and the bidirectional embeddings, overrides and isolates, with which a
prompt could read in another order than it was written. The stored text is unchanged."""

import re

from django import template

register = template.Library()

ACTING = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@register.filter
def inert(text: str) -> str:
    return ACTING.sub(lambda match: f"[U+{ord(match.group()):04X}]", str(text))
