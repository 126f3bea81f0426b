"""The secrets the gateway holds, whose each is, and how they are kept from where they may not go.

The gateway knows the values it holds for its servers (keyring tokens, OAuth tokens, `secrets:`,
the HTTP token): `HeldSecrets` keeps each with the server it belongs to and its name.

Out to the client: a server may hand one back (a remote one that echoes request headers, a local
one that prints its environment): every occurrence is replaced by `[redacted]` before the client,
and so the model, sees it, whatever the value's JSON type (a number whose digits hold a secret is
replaced whole). Names of keys are not judged here: only values the gateway knows are secrets.

In to a server: a call's arguments that carry a secret held for another server (the model copied
a token from one tool's output into another tool's call) are found by `HeldSecrets.carried`, and
the call is refused (serve/pipeline.py). What is looked for, in every key and value of any JSON
type, nested or inside a longer string: the value as it is, JSON-escaped, percent-encoded (as a
URL's query or path would carry it), base64 (standard or URL-safe, padded or not, at any offset
in a longer encoded run) and hex. Not found: other encodings and transformations (reversed,
split across arguments or calls, rot13, a compressed or encrypted value, part of a token), and
values shorter than `MIN_CARRIED` characters, which ordinary arguments hold by chance.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = [
    "MIN_CARRIED",
    "REDACTED",
    "UNNAMED",
    "Held",
    "HeldSecrets",
    "Scrubbed",
    "line_pattern",
    "number_holds",
    "pattern_of",
    "scrub",
    "scrub_result",
]

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


# -- whose each secret is, and the secrets a call carries to a server they are not for ----------

# shorter values are looked for in results (redacted), not in arguments (refused); every encoded
# form of a value this long is at least as long (base64 of 8 bytes: 10 characters at any offset)
MIN_CARRIED = 8
# what a value the gateway holds is called when the code that learnt it did not say
UNNAMED = "a credential of its connection (an OAuth token or key)"


@dataclass(frozen=True, slots=True)
class Held:
    """Whose a secret is (`server`, "" for the gateway's own) and its name, never its value."""

    server: str
    name: str

    def __str__(self) -> str:
        return f"the {self.name} of server '{self.server}'" if self.server else f"the gateway's {self.name}"


@dataclass(frozen=True)
class _Carried:
    """The secrets a call to one server may not carry, in every form, and whose each is."""

    # looked for one by one with `in`: for a few dozen literals, CPython's substring search is
    # many times faster than one alternation (a regex tries every branch at every position)
    forms: tuple[str, ...]
    holders: Mapping[str, tuple[Held, ...]]  # a form of a value -> whose the value is


def _base64_cores(data: bytes) -> Iterator[str]:
    """The part of `data`'s base64 that is the same wherever it starts in a longer encoded run:
    for each of the three offsets, the characters that hold only bits of `data`."""
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + data).decode()
        whole, rest = divmod(offset + len(data), 3)
        core = encoded[(0, 2, 3)[offset] : 4 * whole + (8 * rest) // 6]
        yield from (core, core.translate(str.maketrans("+/", "-_")))


def _forms(value: str) -> set[str]:
    """Every form of `value` that `HeldSecrets.carried` looks for (see the module docstring)."""
    data = value.encode("utf-8", "surrogatepass")
    encoded = {quote(value, safe=""), quote(value), quote_plus(value), data.hex(), data.hex().upper()}
    encoded |= set(_base64_cores(data))
    escaped = json.dumps(value, ensure_ascii=False)[1:-1]
    return {value, escaped} | encoded


class HeldSecrets:
    """Every secret value the gateway holds, with whose it is and its name (thread-safe: the audit
    writer registers from threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, dict[str, str]] = {}  # value -> {server: name}
        self.pattern: re.Pattern[str] | None = None  # what finds any value as it is (`scrub`)
        self._carried: dict[str, _Carried | None] = {}  # per server; emptied when one is added

    def add(self, value: str, server: str = "", name: str | None = None) -> None:
        """Hold `value` as `server`'s (`name`: what it is called; a later name replaces none)."""
        if not value:
            return
        with self._lock:
            holders = self._held.setdefault(value, {})
            if name is not None or server not in holders:
                holders[server] = name or holders.get(server) or UNNAMED
            self.pattern = pattern_of(tuple(sorted(self._held)))
            self._carried = {}  # a new dict: a reader without the lock sees the old one or this

    def values(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._held)

    def carried(self, server: str, value: Any) -> list[Held]:
        """The secrets held for others than `server` (and the gateway's own) that `value` (a call's
        arguments, a URI) carries, in any form (see the module docstring); none when nothing is
        held for another: then `value` is not even read.

        Raises:
            Scrubbed: `value` is nested too deeply to be read.
        """
        found = self._find(server)
        if found is None:
            return []
        # one text to search: every key and value, numbers as JSON writes them (as `number_holds`)
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
        except RecursionError:
            raise Scrubbed("nested too deeply to be checked for secrets") from None
        forms = [form for form in found.forms if form in text]
        return sorted({held for form in forms for held in found.holders[form]}, key=lambda h: (h.server, h.name))

    def hidden(self, server: str, value: Any) -> Any:
        """`value` with every form of the secrets `carried` finds replaced, for the audit record of
        its refusal: the audit redacts a value as it is, not its encodings.

        Raises:
            Scrubbed: `value` is nested too deeply to be walked.
        """
        found = self._find(server)
        return value if found is None else scrub(value, pattern_of(found.forms))[0]

    def _find(self, server: str) -> _Carried | None:
        known = self._carried.get(server, self)  # per call: read without the lock (`add` replaces, never edits)
        if known is not self:
            return known if isinstance(known, _Carried) else None
        with self._lock:
            if server in self._carried:
                return self._carried[server]
            holders: dict[str, set[Held]] = {}
            for value, owners in self._held.items():
                if server in owners or len(value) < MIN_CARRIED:
                    continue  # its own: the server has it already
                for form in _forms(value):
                    holders.setdefault(form, set()).update(Held(owner, name) for owner, name in owners.items())
            forms = tuple(sorted(holders, key=lambda form: (-len(form), form)))
            found = _Carried(forms, {k: tuple(v) for k, v in holders.items()}) if forms else None
            self._carried[server] = found
            return found
