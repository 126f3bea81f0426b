"""Text from servers and models, shown to a human as data: nothing in it can act on a terminal or a form."""

from __future__ import annotations

import unicodedata

__all__ = ["cut", "visible"]

# Characters a terminal or a form would hide or act on: controls, format characters (bidi
# overrides, zero-width, Unicode tag "ASCII smuggling"), separators, surrogates, private and
# unassigned.
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def cut(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: a longer one ends in "…" where it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def visible(text: str) -> str:
    """`text` with every character a terminal would hide or obey written as an escape.

    A tab is kept: it moves the cursor but ends no line and hides nothing.
    """
    if text.isprintable():  # the common case; isprintable() is False for every category above
        return text
    return "".join(
        (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        if unicodedata.category(c) in _INVISIBLE and c != "\t"
        else c
        for c in text
    )
