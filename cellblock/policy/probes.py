"""Arguments a scan calls a tool with, generated from its inputSchema: one benign set, and hostile
sets that each change one argument into an attempt to reach what the tool should not.

Pure: the places the probes point at (a granted directory, decoys, a host that is not allowed)
are given by the caller. Which argument is a path or a URL is guessed from its name, its format
and its description; an argument of neither kind gets a small valid value of its type.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Places", "Probe", "destructive", "probes"]

_PATHY = re.compile(r"(^|_)(path|paths|file|files|filename|dir|directory|folder|source|destination|target|root)s?$")
_URLY = re.compile(r"(^|_)(url|uri|href|link|endpoint|site)s?$")
_MAKES = re.compile(r"(^|[_\-.])(create|write|make|mkdir|new|add|save|upload|copy|move|rename)")
_DESTRUCTIVE = re.compile(r"(^|[_\-.])(delete|remove|rm|drop|destroy|wipe|purge|erase|kill|truncate|reset)")
SAMPLE_TEXT = "cellblock scan"


@dataclass(frozen=True, slots=True)
class Places:
    """Where probes point: `directory` is a (scratch) granted directory and `file` a file in it;
    `link` a symlink planted in it that points out; `outside` a file no grant holds; `secret` a
    decoy key as the user would name it (`~/.ssh/id_rsa`); `traversal` a path through `..` from
    the granted directory to the decoy; `denied_url` a URL of a host the jail does not allow."""

    directory: str | None
    file: str | None
    link: str | None
    outside: str
    secret: str
    traversal: str | None
    denied_url: str
    benign_url: str = "https://example.com/"


@dataclass(frozen=True, slots=True)
class Probe:
    """One call's arguments: `label` says what it tries; `changed` is the argument it aims (hostile)."""

    label: str
    arguments: dict[str, Any]
    hostile: bool = False
    changed: str | None = None
    target: str | None = None  # the path or URL it aims at
    notes: tuple[str, ...] = field(default_factory=tuple)


def destructive(name: str, annotations: Mapping[str, Any] | None) -> bool:
    """A tool the scan calls only with --destructive: it says so (destructiveHint: true) or its
    name does (delete_*, remove_*, …)."""
    if annotations and annotations.get("destructiveHint") is True:
        return True
    return _DESTRUCTIVE.search(name.lower()) is not None


def _kind(name: str, schema: Mapping[str, Any]) -> str:
    """path, url, or value."""
    text = f"{schema.get('description', '')} {schema.get('title', '')}".lower()
    if schema.get("format") in ("uri", "url", "iri") or _URLY.search(name.lower()):
        return "url"
    if _PATHY.search(name.lower()) or re.search(r"\b(file ?path|path to|directory)\b", text):
        return "path"
    return "value"


def _value(schema: Mapping[str, Any], depth: int = 0) -> Any:
    """A small valid value of the schema's type."""
    if "default" in schema:
        return schema["default"]
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        options = [s for s in schema.get(key, []) if isinstance(s, dict) and s.get("type") != "null"]
        if options:
            return _value(options[0], depth)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = max(1, low + (1 if "exclusiveMinimum" in schema else 0))
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "array":
        items: Mapping[str, Any] = schema["items"] if isinstance(schema.get("items"), dict) else {}
        return [_value(items, depth + 1)] if schema.get("minItems", 0) > 0 and depth < 4 else []
    if kind == "object" or "properties" in schema:
        return _object(schema, depth + 1) if depth < 4 else {}
    size = max(int(schema.get("minLength", 0)), 1)
    return (SAMPLE_TEXT * size)[: max(size, len(SAMPLE_TEXT))][: schema.get("maxLength", 1 << 20)]


def _object(schema: Mapping[str, Any], depth: int = 0) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = schema.get("required") or []
    return {k: _value(properties.get(k) or {}, depth) for k in required if isinstance(properties.get(k, {}), dict)}


def _aimed(kind: str, is_list: bool, places: Places) -> list[tuple[str, str]]:
    """The hostile values for one argument of `kind`: (label, value)."""
    if kind == "url":
        return [("url to a host not allowed", places.denied_url)]
    aims = [("absolute path elsewhere", places.outside), ("decoy key in the home", places.secret)]
    if places.traversal:
        aims.insert(0, ("'..' traversal", places.traversal))
    if places.link:
        aims.append(("symlink that points out", places.link))
    return aims


def probes(schema: Mapping[str, Any] | None, places: Places, tool: str = "") -> list[Probe]:
    """The benign probe, then one hostile probe per path or URL argument and target.

    The benign one fills every required argument (and every path or URL one) with a valid value:
    a path in the granted directory (the file for an argument that names a file; a new name in the
    directory for a `tool` that makes things: create_*, write_*, move_*, …), a URL of `benign_url`.
    A tool with no path or URL argument gets no hostile probe.
    """
    schema = schema or {}
    properties: Mapping[str, Any] = schema.get("properties") or {}
    benign = _object(schema)
    aimed: list[tuple[str, str, bool]] = []
    for name, sub in properties.items():
        if not isinstance(sub, dict):
            continue
        is_list = sub.get("type") == "array"
        kind = _kind(name, (sub.get("items") or {}) if is_list and "description" not in sub else sub)
        if kind == "path":
            where = places.directory if re.search(r"dir|folder|root", name.lower()) else places.file
            if where is None or (_MAKES.search(tool.lower()) and name.lower() not in ("source", "src")):
                where = f"{places.directory}/cellblock-scan-new" if places.directory else None
            if where is not None:  # with no granted directory the benign value stays a plain one
                benign[name] = [where] if is_list else where
            aimed.append((name, kind, is_list))
        elif kind == "url":
            benign[name] = [places.benign_url] if is_list else places.benign_url
            aimed.append((name, kind, is_list))
    found = [Probe("benign", benign)]
    for name, kind, is_list in aimed:
        for label, value in _aimed(kind, is_list, places):
            arguments = {**benign, name: [value] if is_list else value}
            found.append(Probe(label, arguments, hostile=True, changed=name, target=value))
    return found
