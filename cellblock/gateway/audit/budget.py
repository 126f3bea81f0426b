"""What a server can make the audit log write without a call, held to a budget per server and kind.

A server can churn its catalog (`lock_changed`), make connections its allowlist refuses
(`egress`), crash and restart, have its questions refused, or ask for the client's model
(`sampling`, and with `sampling: ask` the approval events of each request), as fast as it likes. Each
(server, kind) gets a burst of `BURST` events, then one more every `REFILL` seconds; past that,
events are counted, not written, and one `suppressed` event with the count stands for them: at
the next event of that kind the budget lets through, once `WINDOW` seconds have passed since the
first one left out, or when the log is closed. Decisions (calls, approvals of calls, lock
approvals) never pass through here: they are always written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BUDGETED", "BURST", "REFILL", "SAMPLING_APPROVALS", "WINDOW", "Budget", "kind_of"]

# events a server triggers by itself; every other event is a decision or the user's own act
BUDGETED = frozenset(
    {
        "egress",
        "lock_changed",
        "lock_held",
        "server_ready",
        "server_exit",
        "server_start_failed",
        "server_failed",
        "server_reconnect",
        "elicitation_refused",
        "sampling",
    }
)
# an approval event is the server's own when it is about the server's request for the client's
# model (`kind: sampling`) or a connection (`kind: egress`), never a call's: each request of a
# flood asked and answered one
SAMPLING_APPROVALS = {
    "approval_asked": "sampling_asked",
    "approval_granted": "sampling_granted",
    "approval_denied": "sampling_denied",
    "approval_timeout": "sampling_timeout",
}
BURST = 20  # events of one kind from one server written back to back
REFILL = 10.0  # seconds per further event once the burst is spent: six a minute
WINDOW = 60.0  # seconds a count of left-out events waits before its `suppressed` event is due


def kind_of(event: str, fields: dict[str, Any]) -> str | None:
    """The kind an event is budgeted as, or None when it is always written."""
    if event not in BUDGETED:
        # and a `network: ask` server's questions about its connections (`kind: egress`): `egress_asked`, ...
        found = SAMPLING_APPROVALS.get(event) if fields.get("kind") in ("sampling", "egress") else None
        return found.replace("sampling", str(fields["kind"]), 1) if found else None
    if event == "egress":
        return "egress_refused" if fields.get("decision") == "deny" else "egress_allowed"
    return event


@dataclass
class _Bucket:
    tokens: float
    at: float
    count: int = 0  # events left out since `since`
    since: float = 0.0


class Budget:
    """Token buckets per (server, kind); not thread-safe (the audit log calls it under its lock)."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.next_due = float("inf")  # when the oldest count's summary is due: one comparison per write

    def admit(self, server: str, kind: str, now: float) -> bool:
        """Whether the next event of `kind` from `server` may be written now (spends one if so)."""
        bucket = self._buckets.get((server, kind))
        if bucket is None:
            bucket = self._buckets[(server, kind)] = _Bucket(float(BURST), now)
        bucket.tokens = min(float(BURST), bucket.tokens + (now - bucket.at) / REFILL)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def leave_out(self, server: str, kind: str, now: float) -> None:
        """Count an event of `kind` from `server` that was not written."""
        bucket = self._buckets.setdefault((server, kind), _Bucket(0.0, now))
        if not bucket.count:
            bucket.since = now
            self.next_due = min(self.next_due, now + WINDOW)
        bucket.count += 1

    def summaries(self, now: float, server: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """The `suppressed` events due: every count WINDOW old, plus that of (`server`, `kind`) if given.

        They are taken out; `restore` puts back any that could not be written.
        """
        due: list[dict[str, Any]] = []
        for (name, what), bucket in self._buckets.items():
            if bucket.count and (bucket.since + WINDOW <= now or (name, what) == (server, kind)):
                due.append({"server": name, "kind": what, "count": bucket.count, "since": round(bucket.since, 3)})
                bucket.count = 0
        self.next_due = min((b.since + WINDOW for b in self._buckets.values() if b.count), default=float("inf"))
        return due

    def restore(self, summary: dict[str, Any]) -> None:
        """Put back a summary that was not written: its count joins the next one."""
        bucket = self._buckets[(summary["server"], summary["kind"])]
        if not bucket.count:
            bucket.since = summary["since"]
        bucket.count += summary["count"]
        self.next_due = min(self.next_due, bucket.since + WINDOW)

    def pending(self) -> list[dict[str, Any]]:
        """Every count not yet written, due or not (for when the log closes)."""
        return self.summaries(float("inf"))
