"""How a server that keeps crashing is restarted: the waits between attempts, and when to stop."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Restarts after quick failures wait `first` seconds, doubling up to `most`; after `restarts`
    quick failures in a row the server is marked failed. A run that lasted `healthy` seconds resets
    the count, so a server that crashes once a day is restarted every time."""

    first: float = 0.5
    most: float = 10.0
    restarts: int = 5
    healthy: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait before the next attempt after `failures` quick failures in a row (1 or more)."""
        return min(self.first * 2.0 ** (failures - 1), self.most)
