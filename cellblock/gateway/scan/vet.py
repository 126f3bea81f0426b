"""The one check every proposal passes: each entry it would add to a jail, by the rules of
`scan/gate.py` (paths, programs) and `scan/gatehosts.py` (hosts), and no more than `MOST` to a key.

A scan's proposal (`learn.propose`) and a learn trace's (`learned.widen`) are built from what a
server did, and the server chooses what it does: it can make its jail refuse any path or host it
likes, spelled as it likes. So every entry a proposal would add to a jail is checked here when the
`Proposal` is made (an entry refused becomes a note), and again, as the config loads it back, just
before `--apply` writes it (`check_written`: nothing reaches cellblock.yaml around this module).

A proposal adds at most `MOST` entries to one key: past that it is no list a person reads, and a
range spelled one address at a time is still a range.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cellblock.gateway.config.model import JailConfig
from cellblock.gateway.scan.gate import NotGrantable, as_shown, check_path, check_program
from cellblock.gateway.scan.gatehosts import check_host

__all__ = ["MOST", "check_written", "vet"]

MOST = 16  # entries a proposal adds to one key at most


def vet(
    current: dict[str, Any],
    proposed: dict[str, Any],
    own: Sequence[str | Path] = (),
    writable: Sequence[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """`proposed` without the entries it adds to `current` (config keys) that may not be granted
    (`own`: as `check_path`; `writable`: other jails' `read_write` grants, besides those of
    `current` and `proposed`), and a note for each; network back to what it was if no host is left
    to allow."""
    out = copy.deepcopy(proposed)
    notes: list[str] = []
    had = {key: list(current.get(key) or []) for key in ("read_only", "read_write", "allow_hosts")}
    had["read_only"] += had["read_write"]  # a grant made read-only is no new reach
    allow = (current.get("exec") or {}).get("allow") or []

    def jails() -> list[str]:  # where jails may write: the read_write entries kept so far among them
        return [*writable, *had["read_write"], *(out.get("read_write") or [])]

    def reads(path: str) -> None:
        check_path(path, own, writable=jails())

    def writes(path: str) -> None:
        check_path(path, own, write=True, writable=[w for w in jails() if w != path])

    lists: list[tuple[str, list[str], list[str], Callable[[str], None]]] = [
        ("read_write", out.get("read_write") or [], had["read_write"], writes),
        ("read_only", out.get("read_only") or [], had["read_only"], reads),
        ("allow_hosts", out.get("allow_hosts") or [], had["allow_hosts"], check_host),
        ("exec.allow", (out.get("exec") or {}).get("allow") or [], allow, check_program),
    ]
    for key, values, before, check in lists:
        added: list[str] = []
        for value in list(values):
            if value in before:
                continue
            try:
                check(value)
            except NotGrantable as exc:
                values.remove(value)
                notes.append(f"not proposed, {key} + {exc}")
                continue
            added.append(value)
        if len(added) > MOST and _widens(key, before):
            for value in added[MOST:]:
                values.remove(value)
            notes.append(f"not proposed, {key} + {len(added) - MOST} more: {_too_many(key, added[MOST:])}")
    if out.get("network") == "allowlist" and not out.get("allow_hosts"):
        out["network"] = current.get("network", "none")
        out.pop("allow_hosts", None)
        if current.get("allow_hosts"):
            out["allow_hosts"] = list(current["allow_hosts"])
    return out, notes


def check_written(before: JailConfig, after: JailConfig, config: Path, writable: Sequence[str] = ()) -> None:
    """Every entry the jail `after` (as the config at `config` loads it back) adds to `before`
    may be granted (`writable`: every jail's `read_write` grants in that config).

    Raises:
        NotGrantable: one may not; nothing is to be written.
    """
    had = {*before.read_only, *before.read_write}
    added = {
        "read_only": [p for p in after.read_only if p not in had],
        "read_write": [p for p in after.read_write if p not in before.read_write],
        "allow_hosts": [e for e in after.allow_hosts if e not in before.allow_hosts],
        "exec.allow": [p for p in after.exec.allow if p not in before.exec.allow],
    }
    for key, values in added.items():
        if len(values) > MOST and _widens(key, before.exec.allow):
            raise NotGrantable(f"it adds {len(values)} entries to {key}: {_too_many(key, values)}")
    jails = [*writable, *after.read_write]
    for path in added["read_only"]:
        check_path(path, [config], writable=jails)
    for path in added["read_write"]:
        check_path(path, [config], write=True, writable=[w for w in jails if w != path])
    for entry in added["allow_hosts"]:
        check_host(entry)
    for program in added["exec.allow"]:
        check_program(program)


def _widens(key: str, allow: Sequence[str]) -> bool:
    """Whether entries added to `key` widen the jail: an exec.allow where there was none (`allow`)
    narrows it, however long it is."""
    return key != "exec.allow" or bool(allow)


def _too_many(key: str, values: Sequence[str]) -> str:
    shown = ", ".join(as_shown(v) for v in values[:3])
    return (
        f"a proposal adds at most {MOST} entries to {key}, and past that it is no list a person reads ({shown}, …); "
        "grant the directory or the host they share by hand, if the server needs it"
    )
