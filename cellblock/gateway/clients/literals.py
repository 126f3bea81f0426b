"""Values inside the string literals of JSON or TOML text, however the literal escapes them.

`cellblock wrap` must take a secret out of a client's file without reformatting the rest. The
secret may be written `p\\u00e4ss`, `a\\/b` or inside a TOML literal string: a plain text search
for one spelling would leave another in clear. `replace_in_literals` decodes each literal,
finds the value there, and replaces exactly the characters that spell it, keeping every other
byte of the literal as it was. `fill_literals` is its inverse for `cellblock unwrap`: it writes a
value back where a reference stands, escaped as that literal needs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

__all__ = ["fill_literals", "replace_in_literals"]

_DOUBLE = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_DOUBLE_OR_SINGLE = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'')
_SIMPLE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", '"': '"', "\\": "\\", "/": "/", "e": "\x1b"}


def replace_in_literals(text: str, replacements: Mapping[str, str], toml: bool = False) -> str:
    """`text` with each key of `replacements` inside a string literal replaced by its value (the
    replacement is written as it is: it must need no escaping). TOML adds '…' literal strings."""
    pattern = _DOUBLE_OR_SINGLE if toml else _DOUBLE
    values = sorted((v for v in replacements if v), key=len, reverse=True)  # longest first
    out, last = [], 0
    for match in pattern.finditer(text):
        raw = match.group(0)
        pieces = _pieces(raw[1:-1]) if raw[0] == '"' else [(c, c) for c in raw[1:-1]]
        decoded = "".join(d for d, _ in pieces)
        if not any(v in decoded for v in values):
            continue
        out += [text[last : match.start()], raw[0], _substitute(pieces, decoded, values, replacements), raw[0]]
        last = match.end()
    out.append(text[last:])
    return "".join(out)


def fill_literals(text: str, values: Mapping[str, str], toml: bool = False) -> str:
    """`text` with each key of `values` inside a string literal replaced by its value, escaped for
    that literal: JSON escapes in a "…" string, the value as it is in a TOML '…' literal (which
    held it before wrap, so it needs no escaping). Keys outside any literal are left."""
    pattern = _DOUBLE_OR_SINGLE if toml else _DOUBLE

    def one(match: re.Match[str]) -> str:
        raw = match.group(0)
        body = raw[1:-1]
        for key, value in values.items():
            if key in body:
                escaped = json.dumps(value, ensure_ascii=False)[1:-1]
                if toml:  # TOML also refuses a raw DEL in a basic string
                    escaped = escaped.replace("\x7f", "\\u007f")
                body = body.replace(key, value if raw[0] == "'" else escaped)
        return raw[0] + body + raw[0]

    return pattern.sub(one, text)


def _pieces(body: str) -> list[tuple[str, str]]:
    """(decoded character, the raw text that spells it) for a JSON or TOML basic string's body."""
    pieces: list[tuple[str, str]] = []
    i = 0
    while i < len(body):
        if body[i] != "\\" or i + 1 >= len(body):
            pieces.append((body[i], body[i]))
            i += 1
            continue
        kind = body[i + 1]
        width = {"u": 4, "U": 8}.get(kind)
        if width is not None and re.fullmatch(r"[0-9A-Fa-f]+", body[i + 2 : i + 2 + width] or "x"):
            code = int(body[i + 2 : i + 2 + width], 16)
            raw = body[i : i + 2 + width]
            low = body[i + 6 : i + 12]
            if 0xD800 <= code < 0xDC00 and re.fullmatch(r"\\u[dD][c-fC-F][0-9A-Fa-f]{2}", low):
                code = 0x10000 + ((code - 0xD800) << 10) + (int(low[2:], 16) - 0xDC00)  # a surrogate pair
                raw += low
            pieces.append((chr(code) if code < 0x110000 else "\ufffd", raw))
            i += len(raw)
        else:
            pieces.append((_SIMPLE.get(kind, kind), body[i : i + 2]))
            i += 2
    return pieces


def _substitute(pieces: list[tuple[str, str]], decoded: str, values: list[str], replacements: Mapping[str, str]) -> str:
    marks: dict[int, tuple[int, str]] = {}  # start -> (end, replacement), in decoded positions
    taken = [False] * len(decoded)
    for value in values:
        at = decoded.find(value)
        while at != -1:
            if not any(taken[at : at + len(value)]):
                marks[at] = (at + len(value), replacements[value])
                taken[at : at + len(value)] = [True] * len(value)
            at = decoded.find(value, at + 1)
    out, k = [], 0
    while k < len(pieces):
        if k in marks:
            end, replacement = marks[k]
            out.append(replacement)
            k = end
        else:
            out.append(pieces[k][1])
            k += 1
    return "".join(out)
