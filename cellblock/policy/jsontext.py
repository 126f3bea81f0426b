"""JSON text from peers and from files, parsed strictly and made safe to write out again.

Everything the gateway reads as JSON — a line from the client or a server, a state file — goes
through `loads`. Two things valid to Python's `json` would otherwise surface later, far from
their source, and stop the gateway there:

- a lone surrogate (`"\\ud800"`): valid JSON escapes, but no UTF-8 can encode the string, so the
  first attempt to write it (to the client, to a lock, to the audit log) raises. `loads` replaces
  each with U+FFFD, the Unicode replacement character, as a decoder replaces invalid bytes;
- `NaN`, `Infinity`: not JSON at all, yet `json.loads` accepts them and `json.dumps` writes them
  back, invalid, to a client that may fail on the whole line. `loads` refuses them.

A document nested too deep for the parser is refused too (a `ValueError`, like any other bad
JSON, rather than a `RecursionError` the caller did not expect).

`more_values_than` counts what a document holds, for a caller that must bound the work a
document makes it do (validating one costs in proportion to its values, not its bytes).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["loads", "more_values_than", "scrub"]

# A lone surrogate can only come from a \uD800-\uDFFF escape (json joins a valid pair into one
# character, and bytes are decoded with replacement), so text without one needs no walk.
_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE = re.compile("[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def loads(text: str | bytes | bytearray) -> Any:
    """Parse `text` as strict JSON; lone surrogates in strings and keys become U+FFFD.

    Bytes are decoded as UTF-8, invalid sequences replaced.

    Raises:
        ValueError: not JSON, holds NaN or an infinity, or is nested too deep to parse.
    """
    if isinstance(text, bytes | bytearray):
        escaped = _ESCAPE_BYTES.search(text) is not None
        text = text.decode("utf-8", "replace")  # str parses faster than bytes
    else:
        escaped = _ESCAPE.search(text) is not None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    return scrub(value) if escaped else value


def _fixed(text: str) -> str:
    return _LONE.sub(_REPLACEMENT, text) if _LONE.search(text) else text


def scrub(value: Any) -> Any:
    """`value` with every lone surrogate in its strings and keys replaced by U+FFFD.

    Lists and dicts are changed in place (iteratively: a document as deep as the parser allows
    is no deeper here); a string is returned fixed.
    """
    if isinstance(value, str):
        return _fixed(value)
    stack = [value] if isinstance(value, dict | list) else []
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if any(isinstance(k, str) and _LONE.search(k) for k in node):
                items = [(_fixed(k) if isinstance(k, str) else k, v) for k, v in node.items()]
                node.clear()
                node.update(items)
            entries: Any = node.items()
        else:
            entries = enumerate(node)
        for key, item in list(entries):
            if isinstance(item, str):
                fixed = _fixed(item)
                if fixed is not item:
                    node[key] = fixed
            elif isinstance(item, dict | list):
                stack.append(item)
    return value


def more_values_than(value: Any, limit: int, skip: frozenset[str] = frozenset()) -> bool:
    """Whether `value` holds more than `limit` values (itself, and every string, number, list
    and object in it), not counting what sits under a key in `skip`. Stops once past `limit`."""
    count = 0
    stack = [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            children: Any = [v for k, v in node.items() if k not in skip] if skip else node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if count + len(stack) + len(children) > limit:
            return True
        stack.extend(children)
    return count > limit
