"""Known secret values taken out of what goes to the client: tool results, prompts, resources, logs.

The gateway knows the values it holds for its servers (keyring tokens, OAuth tokens, `secrets:`).
A server may hand one back (a remote one that echoes request headers, a local one that prints its
environment): every occurrence is replaced by `[redacted]` before the client, and so the model,
sees it, whatever the value's JSON type (a number whose digits hold a secret is replaced whole).
Names of keys are not judged here: only values the gateway knows are secrets.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["REDACTED", "Scrubbed", "line_pattern", "number_holds", "pattern_of", "scrub", "scrub_result"]

REDACTED = "[redacted]"
# a line of a secret that spans lines (a PEM key) is itself a secret from this many characters;
# shorter ones ("-----", "==") say nothing of it
LINE_OF_SECRET = 8


class Scrubbed(ValueError):
    """What was to be scrubbed is nested too deeply to be checked (refused rather than passed on)."""


@functools.lru_cache(maxsize=8)  # the set of secrets changes rarely; the pattern is asked for per message
def pattern_of(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """One pattern that finds any of `secrets` (longest first, so no secret is half replaced)."""
    alternatives = sorted({s for s in secrets if s}, key=lambda s: (-len(s), s))
    return re.compile("|".join(map(re.escape, alternatives))) if alternatives else None


@functools.lru_cache(maxsize=8)  # asked for per chunk of a server's stderr
def line_pattern(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    """What finds any of `secrets` in text read a line at a time: each secret, and each line of
    one that spans lines (its whole never stands on one line) of `LINE_OF_SECRET` characters or more."""
    parts = (p.strip() for s in secrets if "\n" in s or "\r" in s for p in s.splitlines())
    return pattern_of((*secrets, *(p for p in parts if len(p) >= LINE_OF_SECRET)))


def number_holds(value: int | float, pattern: re.Pattern[str]) -> bool:
    """Whether the text of a number (as JSON writes it) holds a secret: `918273645546372819` passed
    as an integer is the secret "918273645546372819"."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4300-digit limit for text: no secret's text
        return False
    return pattern.search(text) is not None


def scrub(value: Any, pattern: re.Pattern[str] | None) -> tuple[Any, int]:
    """`value` with every secret `pattern` finds replaced, and how many were; `value` itself when none.

    Raises:
        Scrubbed: `value` is nested too deeply to be walked.
    """
    if pattern is None:
        return value, 0
    try:
        return _walk(value, pattern)
    except RecursionError:
        raise Scrubbed("nested too deeply to be checked for secrets") from None


def _walk(value: Any, pattern: re.Pattern[str]) -> tuple[Any, int]:
    if isinstance(value, str):
        clean, count = pattern.subn(REDACTED, value)
        return (clean, count) if count else (value, 0)
    if isinstance(value, bool) or value is None:
        return value, 0
    if isinstance(value, int | float):
        return (REDACTED, 1) if number_holds(value, pattern) else (value, 0)
    if isinstance(value, dict):
        total = 0
        out: dict[Any, Any] = {}
        for key, item in value.items():
            clean_key, n = _walk(key, pattern) if isinstance(key, str) else (key, 0)
            clean_item, m = _walk(item, pattern)
            out[clean_key] = clean_item
            total += n + m
        return (out, total) if total else (value, 0)
    if isinstance(value, list | tuple):
        total = 0
        items = []
        for item in value:
            clean_item, n = _walk(item, pattern)
            items.append(clean_item)
            total += n
        return (items, total) if total else (value, 0)
    return value, 0


def scrub_result(result: dict[str, Any], pattern: re.Pattern[str] | None) -> dict[str, Any]:
    """A tool result (as JSON) with the secrets taken out and, when any were, a line that says so.

    Raises:
        Scrubbed: the result is nested too deeply to be checked.
    """
    clean, count = scrub(result, pattern)
    if not count:
        return result
    content = clean.get("content") if isinstance(clean.get("content"), list) else []
    note = {"type": "text", "text": f"[Cellblock redacted {count} secret value(s) it holds from this result]"}
    return {**clean, "content": [*content, note]}
