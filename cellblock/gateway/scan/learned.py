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

Never proposed (a note says what was refused): what looks like a secret (`~/.ssh`, `~/.aws`, …),
Cellblock's own files, system files, a look at a path's metadata alone, a write outside any grant
shown read-only, the jail's own loopback, a lookup whose name is not known, a socket's path, any
host with `network: open`. The proposal is printed
as the scan's is (a diff of `jail:`); `--apply` writes it after it is shown.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.scan.findings import SECRET_PARTS, noise
from cellblock.gateway.scan.learn import Proposal, configured, inside, tidy
from cellblock.gateway.state import default_config_path, own_dirs
from cellblock.sandbox.trace import Event, Kind, jail_refused, parse_trace

__all__ = ["Learned", "read_learned", "widen"]

# the jail's own loopback: a connection refused there is to nothing in the jail, not to a host
LOOPBACK = ("127.0.0.1", "::1", "localhost")


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
    return f"{event.call} {event.target} refused by the jail ({event.errno}) at {_when(event.ts)}"


def _never(path: str, own: list[str]) -> str | None:
    """Why `path` is never proposed, or None."""
    if any(part in path or path.endswith(part.rstrip("/")) for part in SECRET_PARTS):
        return "it looks like a secret"
    if any(inside(path, o) for o in own):
        return "it is Cellblock's own"
    return None


def widen(server: LocalServer, learned: Learned) -> Proposal:
    """The jail of `server` widened by what it tried and its jail refused."""
    jail = server.jail
    assert jail is not False
    current = configured(jail)
    proposed: dict[str, Any] = copy.deepcopy(current)
    grants = [*jail.read_only, *jail.read_write]
    own = [str(p) for p in (*own_dirs(), default_config_path())]
    motives: dict[str, str] = {}
    notes: list[str] = []

    def grant(key: str, value: str, event: Event) -> None:
        target = proposed["exec"]["allow"] if key == "exec.allow" else proposed.setdefault(key, [])
        if value not in target:
            target.append(value)
            motives[f"{key} + {value}"] = _describe(event)

    for event in learned.refused:
        if event.kind is Kind.LOOK or (event.kind in (Kind.READ, Kind.WRITE) and noise(event)):
            continue
        path = event.target
        if event.kind in (Kind.READ, Kind.WRITE):
            why = _never(path, own)
            if why is not None:
                notes.append(f"not proposed, {why}: {_describe(event)}")
                continue
            held = next((g for g in grants if inside(path, g)), None)
            if event.kind is Kind.READ and held is None:
                grant("read_only", path, event)
            elif event.kind is Kind.WRITE and event.errno == "EROFS" and held in jail.read_only:
                assert held is not None
                if held in proposed["read_only"]:
                    proposed["read_only"].remove(held)
                grant("read_write", held, event)
            elif event.kind is Kind.WRITE and held is None and event.errno != "EROFS":
                grant("read_write", path, event)
            else:
                where = "in its grant" if held is not None else "outside any grant"
                notes.append(f"not proposed, refused {where}: {_describe(event)}")
        elif event.kind is Kind.EXEC:
            if jail.exec.allow:
                grant("exec.allow", path, event)
            else:
                notes.append(f"not proposed, no exec.allow to widen (a mount refused it): {_describe(event)}")
        elif not path.startswith(("/", "@")) and not noise(event):
            host = path.rpartition(":")[0].strip("[]") if event.kind is Kind.CONNECT else path
            if (
                jail.network == "open"
                or path.startswith("a name, through")
                or host in LOOPBACK
                or host.startswith("127.")
            ):
                notes.append(f"not proposed: {_describe(event)}")
            else:
                proposed["network"] = "allowlist"
                grant("allow_hosts", path, event)
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
    )
