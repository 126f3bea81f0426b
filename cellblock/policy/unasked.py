"""Tools the user let run without asking: read-only, closed-world ones, chosen at review.

A server may mark a tool `readOnlyHint: true` (it changes nothing) and `openWorldHint: false` (it
reaches nothing outside the server's own world). The MCP spec's defaults decide what an absent
hint means: `openWorldHint` is true unless the server says false, so only an explicit false
counts; a tool also marked `destructiveHint: true` contradicts itself and counts as neither.

A server's say-so alone never lets a tool run: under `tools.read_only: review` the review offers
such tools, and those the user accepts are recorded here, each with the digest of its definition
as the lock approved it (`<state>/locks/<server>.unasked.json`). A grant holds only while the lock
approves that same definition, so a tool whose annotations (or anything else) change is held by
the lock and, once the change is approved, asks again until the user grants it again.

    unasked  {"version": 1, "server": S, "tools": {"tool:<name>": sha256}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cellblock.policy.files import atomic_write_json
from cellblock.policy.lock import LockError

__all__ = ["granted", "load_unasked", "read_only", "save_unasked", "unasked_tools"]

_VERSION = 1


def read_only(item: Mapping[str, Any]) -> bool:
    """Whether a tool's definition marks it read-only and closed-world (see the module docstring)."""
    annotations = item.get("annotations")
    if not isinstance(annotations, Mapping):
        return False
    return (
        annotations.get("readOnlyHint") is True
        and annotations.get("openWorldHint") is False
        and annotations.get("destructiveHint") is not True
    )


def unasked_tools(
    grants: Mapping[str, str], digests: Mapping[str, str], items: Mapping[str, Mapping[str, Any]]
) -> frozenset[str]:
    """The tool names that run without asking: granted, still approved by the lock under the digest
    they were granted with (`digests`: the lock's), and read-only by their definition (`items`)."""
    return frozenset(
        key.removeprefix("tool:")
        for key, sha in grants.items()
        if key.startswith("tool:") and digests.get(key) == sha and key in items and read_only(items[key])
    )


def granted(
    previous: Mapping[str, str], digests: Mapping[str, str], items: Mapping[str, Mapping[str, Any]], new: Iterable[str]
) -> dict[str, str]:
    """The grants after an approval whose lock has `digests`: the earlier ones whose tool is
    approved unchanged, and the tool keys `new` the user let run without asking now (read-only ones only)."""
    kept = {key: sha for key, sha in previous.items() if digests.get(key) == sha}
    kept.update({key: digests[key] for key in new if key in digests and key in items and read_only(items[key])})
    return dict(sorted(kept.items()))


def load_unasked(path: str | os.PathLike[str]) -> dict[str, str]:
    """The grants in `path` (tool key -> digest); none when there is no file.

    Raises:
        LockError: the file exists but is unreadable or not of the shape Cellblock writes.
    """
    path = Path(path)
    fix = "remove it; the tools it named ask again until you let them run without asking at 'cellblock review'"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise LockError(f"file {path} of tools that run without asking cannot be read ({exc}); {fix}") from exc
    tools = doc.get("tools") if isinstance(doc, dict) and doc.get("version") == _VERSION else None
    if not isinstance(tools, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in tools.items()):
        raise LockError(f"file {path} of tools that run without asking is corrupt; {fix}")
    return dict(tools)


def save_unasked(path: str | os.PathLike[str], server: str, grants: Mapping[str, str]) -> None:
    """Write `grants` atomically, 0600 (no file when there are none).

    Raises:
        LockError: the file could not be written or removed.
    """
    path = Path(path)
    try:
        if grants:
            atomic_write_json(path, {"version": _VERSION, "server": server, "tools": dict(grants)})
        else:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise LockError(f"cannot write {path} ({exc.strerror or exc}); nothing runs without asking") from exc
