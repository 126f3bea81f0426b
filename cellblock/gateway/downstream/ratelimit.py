"""A budget for what a server may send unasked: its log and progress notifications.

A server can write notifications as fast as the pipe takes them; passed on one by one they would
bury the client and keep the gateway's loop from the other servers. Each server gets a token
bucket: `burst` notifications at once, refilled at `rate` a second; beyond that they are dropped
(and counted, so the log can say how many).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["NOTICE_BURST", "NOTICE_RATE", "Budget"]

# A busy server logs a few dozen lines a call and reports progress a few times a second; these
# leave it ample room and still bound a flood to what a client shows without trouble.
NOTICE_RATE = 100.0
NOTICE_BURST = 500.0


@dataclass
class Budget:
    """A token bucket: `take()` is True while the budget lasts."""

    rate: float = NOTICE_RATE
    burst: float = NOTICE_BURST
    dropped: int = 0  # refused since the last `settle()`
    _tokens: float = field(init=False)
    _at: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self._tokens = self.burst

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.dropped += 1
        return False

    def settle(self) -> int:
        """How many were dropped since the last call; the count starts again."""
        dropped, self.dropped = self.dropped, 0
        return dropped
