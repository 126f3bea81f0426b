"""What changed in a server's catalog since the user approved it, in words, for `cellblock diff`
and the review: per item, a unified diff of its text fields and JSON-pointer lines for the rest
(policy/lock.py decides what is held; this only tells it)."""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from cellblock.policy.lock import INSTRUCTIONS, KINDS, Item, LockCheck, canonical, stable
from cellblock.policy.text import visible as _visible

__all__ = ["describe", "offered"]

_TEXT_FIELDS = ("title", "description", "text")  # shown as text diffs, in this order


def _show(value: Any) -> str:
    return _visible(json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": ")))


def _pointer(parent: str, key: str | int) -> str:
    # RFC 6901: "~" and "/" inside a key are escaped
    return f"{parent}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _pointer_diff(old: Any, new: Any, at: str) -> list[str]:
    """`+`, `-` and `~` lines, one per JSON pointer where `old` and `new` differ."""
    if canonical(old) == canonical(new):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        lines: list[str] = []
        for key in sorted(old.keys() | new.keys()):
            where = _pointer(at, key)
            if key not in old:
                lines.append(f"+ {_visible(where)}: {_show(new[key])}")
            elif key not in new:
                lines.append(f"- {_visible(where)}: {_show(old[key])}")
            else:
                lines.extend(_pointer_diff(old[key], new[key], where))
        return lines
    nested = isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
    if nested and any(isinstance(v, dict | list) for v in [*old, *new]):
        return [
            line for i, (a, b) in enumerate(zip(old, new, strict=True)) for line in _pointer_diff(a, b, _pointer(at, i))
        ]
    return [f"~ {_visible(at)}: {_show(old)} -> {_show(new)}"]


def _text_lines(text: str) -> list[str]:
    # split on "\n" only: "\r", "\x85" or "\u2028" must show as escapes, not end a line
    return [_visible(line) for line in text.split("\n")]


def _indent(lines: Iterable[str], depth: int) -> list[str]:
    return [" " * depth + line for line in lines]


def _describe_changed(key: str, approved: Item, current: Item) -> list[str]:
    old, new = stable(approved), stable(current)
    texts: list[str] = []
    sections: list[str] = []
    rest: list[str] = []
    rank = {field: i for i, field in enumerate(_TEXT_FIELDS)}
    fields = sorted(old.keys() | new.keys(), key=lambda f: (rank.get(f, len(rank)), f))
    for field in fields:
        a, b = old.get(field), new.get(field)
        if field in old and field in new and canonical(a) == canonical(b):
            continue
        if field in _TEXT_FIELDS and isinstance(a, str) and isinstance(b, str):
            diff = difflib.unified_diff(_text_lines(a), _text_lines(b), "approved", "current", lineterm="")
            texts += [f"  {field}:", *_indent(diff, 4)]
        elif isinstance(a, dict) and isinstance(b, dict):
            sections += [f"  {_visible(field)}:", *_indent(_pointer_diff(a, b, ""), 4)]
        elif field not in old:
            rest.append(f"+ {_visible(_pointer('', field))}: {_show(b)}")
        elif field not in new:
            rest.append(f"- {_visible(_pointer('', field))}: {_show(a)}")
        else:
            rest.extend(_pointer_diff(a, b, _pointer("", field)))
    other = ["  fields:", *_indent(rest, 4)] if rest else []
    return [f"changed {_visible(key)}", *texts, *sections, *other]


def _describe_added(key: str, item: Item) -> list[str]:
    lines = [f"new {_visible(key)}"]
    shown = stable(item)
    for field in _TEXT_FIELDS:
        if isinstance(shown.get(field), str):
            lines += [f"  {field}:", *_indent(_text_lines(shown.pop(field)), 4)]
    lines += _indent((f"+ {_visible(_pointer('', f))}: {_show(shown[f])}" for f in sorted(shown)), 2)
    return lines


def offered(keys: Iterable[str]) -> str:
    """What the item keys `keys` name, counted by kind: "3 tools, 1 prompt, instructions"."""
    counts = Counter(key.partition(":")[0] for key in keys)
    said = [f"{counts[kind]} {kind}{'' if counts[kind] == 1 else 's'}" for _, kind, _ in KINDS if counts[kind]]
    return ", ".join(said + (["instructions"] if counts[INSTRUCTIONS] else [])) or "nothing"


def describe(result: LockCheck, server: str, first: bool = False) -> str:
    """A readable, per-item account of `result` for `cellblock diff SERVER`; nothing is truncated.

    The first line sums it up: for a server never approved (`first`), what it offers; else what
    changed. Changed items show a unified diff of their text fields (title, description,
    instructions) and JSON-pointer lines for everything else; new items show their description and
    fields; removed items are named. Sorted by key, so the same check always reads the same.
    """
    name = _visible(server)
    if result.clean:
        return f"catalog of '{name}' matches what was approved"
    if first:
        lines = [f"first contact with '{name}': {offered(result.added)}, none approved yet"]
    else:
        lines = [
            f"catalog of '{name}' changed since it was approved: {len(result.changed)} changed,"
            f" {len(result.added)} new, {len(result.removed)} removed"
        ]
    for key in sorted(result.changed):
        lines += ["", *_describe_changed(key, *result.changed[key])]
    for key in sorted(result.added):
        lines += ["", *_describe_added(key, result.added[key])]
    for key in sorted(result.removed):
        lines += ["", f"removed {_visible(key)}"]
    if result.held:
        lines += ["", f"held until approved; accept with 'cellblock approve {name}'"]
    return "\n".join(lines)
