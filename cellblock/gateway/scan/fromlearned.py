"""`cellblock scan NAME --from-learned`: the grants a server served with `learn: true` would have
needed, from the traces the gateway recorded (`gateway/downstream/learning.py`). Nothing is started.

Only what the jail refused and the server tried widens the jail, each grant with the refused event
that motivates it:

- a file opened for reading that the jail does not show: `read_only` + that path;
- a write refused in a `read_only` grant (EROFS): that grant becomes `read_write`; one refused
  where the jail does not show the path: `read_write` + that path;
- with `exec.allow`, a program whose execution was refused: `exec.allow` + it;
- a connection the jail refused (no network) or the egress proxy did (`network: allowlist`; its
  refusals are in the audit log, which `--from-learned` reads too): `network: allowlist` with
  `host:port` in `allow_hosts`; a lookup whose refused query names the host: that name.

Paths are judged as the kernel was given them, never with `..` collapsed first. Never proposed
(a note says what was refused): whatever the gate refuses (`gate.py`: `/`, the home, a secret or
a directory holding one, Cellblock's own, a socket, a path through `..` or into a place a jail
may write, write where a program outside the jail runs what is written, a program the host does
not have, an IP range, a wildcard, a name that is not a host, loopback, more than a few entries at
once), system files, a look at a path's metadata alone, a write outside any grant shown
read-only, a lookup whose name is not known, a connection to a socket's path, any host with
`network: open`. The proposal is printed as the scan's is (a diff of `jail:`); `--apply` writes
it after it is shown.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.scan.findings import noise
from cellblock.gateway.scan.gate import NotGrantable, check_path, check_program, grantable_path
from cellblock.gateway.scan.gatehosts import check_host, host_entry
from cellblock.gateway.scan.proposal import Proposal, configured, inside, tidy
from cellblock.gateway.scan.scratch import jail_of
from cellblock.gateway.terminal import printable
from cellblock.sandbox.trace import Event, Kind, jail_refused, parse_trace

__all__ = ["Learned", "read_learned", "widen"]


@dataclass
class Learned:
    """What the recorded traces hold: every event after each server start, and how many were cut."""

    traces: int = 0
    cut: int = 0
    events: list[Event] = field(default_factory=list)

    @property
    def refused(self) -> list[Event]:
        return [e for e in self.events if jail_refused(e)]

    def summary(self) -> str:
        first = min((e.ts for e in self.events), default=None)
        last = max((e.ts for e in self.events), default=None)
        when = f", {_when(first)} to {_when(last)}" if first is not None and last is not None else ""
        cut = f"; {self.cut} cut at their size limit" if self.cut else ""
        return (
            f"{self.traces} learn trace(s){when}: {len(self.events)} events, "
            f"{len(self.refused)} refused by the jail{cut}"
        )


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def read_learned(traces: list[Path]) -> Learned:
    """The events of each trace (what bwrap did before the server started left out)."""
    learned = Learned()
    for path in traces:
        text = path.read_text(errors="replace")
        learned.traces += 1
        learned.cut += "# cellblock: the trace was cut" in text
        learned.events.extend(parse_trace(text).events)
    return learned


def _describe(event: Event) -> str:
    shown = printable(event.as_named)
    return f"{event.call} {shown} refused by the jail ({event.errno}) at {_when(event.ts)}"


def widen(
    server: LocalServer, learned: Learned, config: Path | None = None, writable: list[str] | None = None
) -> Proposal:
    """The jail of `server` (in the config file `config`, whose jails may write `writable`)
    widened by what it tried and its jail refused; each grant passes the gate (`gate.py`) first."""
    jail = jail_of(server)
    current = configured(jail)
    proposed: dict[str, Any] = copy.deepcopy(current)
    grants = [*jail.read_only, *jail.read_write]
    motives: dict[str, str] = {}
    notes: list[str] = []
    own = [config] if config else []
    jails = [*(writable or []), *jail.read_write]

    def reads(path: str) -> None:
        check_path(path, own, writable=jails)

    def writes(path: str) -> None:
        check_path(path, own, write=True, writable=[w for w in jails if w != path])

    def grant(key: str, value: str, event: Event, check: Callable[[str], None]) -> bool:
        try:
            check(value)
        except NotGrantable as exc:
            notes.append(f"not proposed, {key} + {exc}: {_describe(event)}")
            return False
        target = proposed["exec"]["allow"] if key == "exec.allow" else proposed.setdefault(key, [])
        if value not in target:
            target.append(value)
            motives[f"{key} + {value}"] = _describe(event)
        return True

    for event in learned.refused:
        if event.kind is Kind.LOOK or (event.kind in (Kind.READ, Kind.WRITE) and noise(event)):
            continue
        if event.kind in (Kind.READ, Kind.WRITE, Kind.EXEC):
            try:
                path = grantable_path(event.as_named)  # as the kernel saw it, never collapsed
            except NotGrantable as exc:
                notes.append(f"not proposed, {exc}: {_describe(event)}")
                continue
        if event.kind in (Kind.READ, Kind.WRITE):
            held = next((g for g in grants if inside(path, g)), None)
            if event.kind is Kind.READ and held is None:
                grant("read_only", path, event, reads)
            elif event.kind is Kind.WRITE and event.errno == "EROFS" and held is not None and held in jail.read_only:
                if grant("read_write", held, event, writes) and held in proposed["read_only"]:
                    proposed["read_only"].remove(held)
            elif event.kind is Kind.WRITE and held is None and event.errno != "EROFS":
                grant("read_write", path, event, writes)
            else:
                where = "in its grant" if held is not None else "outside any grant"
                notes.append(f"not proposed, refused {where}: {_describe(event)}")
        elif event.kind is Kind.EXEC:
            if jail.exec.allow:
                grant("exec.allow", path, event, check_program)
            else:
                notes.append(f"not proposed, no exec.allow to widen (a mount refused it): {_describe(event)}")
        elif not event.target.startswith(("/", "@")) and not noise(event):
            if jail.network == "open" or event.target.startswith("a name, through"):
                notes.append(f"not proposed: {_describe(event)}")
                continue
            try:
                entry = host_entry(event.target, lookup=event.kind is Kind.LOOKUP)
            except NotGrantable as exc:
                notes.append(f"not proposed, allow_hosts + {exc}: {_describe(event)}")
                continue
            if grant("allow_hosts", entry, event, check_host):
                proposed["network"] = "allowlist"
    proposed["read_only"] = [p for p in proposed["read_only"] if p not in proposed["read_write"]]
    order = ("network", "allow_hosts", "read_only", "read_write", "exec")
    proposed = {k: proposed[k] for k in order if k in proposed}
    lines = [f"{key}: {motive}" for key, motive in motives.items()]
    return Proposal(
        tidy(current),
        tidy(proposed),
        [*lines, *dict.fromkeys(notes)],
        heading="the grants the jail refused and the server tried (from its learn traces):",
        label="with what it tried",
        flags="--from-learned --apply",
        config=config,
        writable=list(writable or []),
    )
