"""An exception told in one short line, for a log or an error result.

A server's answer that does not validate raises pydantic's `ValidationError`, whose text lists
every error with a piece of the input: a result of 80,000 bad items (1 MB) made a million errors
and 200 MB of text, in 13 seconds. Only the count is told, with the first error's place and reason
when there are few; never the input.
"""

from __future__ import annotations

from pydantic import ValidationError

from cellblock.policy.text import cut

__all__ = ["first_line"]

# longer than any message the gateway writes itself; a server's text is cut here
MAX_CHARS = 300
# pydantic builds every error to list any (seconds for a million): past this many, only the count
DETAILED_ERRORS = 20


def first_line(exc: BaseException) -> str:
    """`exc`'s first line (at most MAX_CHARS), or its type's name when it has no text."""
    if isinstance(exc, ValidationError):
        count = exc.error_count()
        text = f"{count} validation error{'s' if count != 1 else ''} for {exc.title}"
        if 0 < count <= DETAILED_ERRORS:
            first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
            text += f"; first: {'.'.join(map(str, first['loc'])) or 'the message'}: {first['msg']}"
    else:
        text = str(exc).partition("\n")[0]
    return cut(text, MAX_CHARS) or type(exc).__name__
