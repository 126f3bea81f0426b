"""Text from servers and models, made safe to print to the user's terminal."""

from __future__ import annotations

import json

__all__ = ["printable"]


def printable(text: str) -> str:
    """`text` as is, or JSON-quoted when it holds characters a terminal would act on."""
    return text if text.isprintable() else json.dumps(text)
