"""What of a server's logs reaches the client (`serve/logs.py`): the level it set lets through
what is at or above it."""

from __future__ import annotations

from cellblock.gateway.serve.logs import log_passes


def test_a_log_level_lets_through_what_is_at_or_above_it() -> None:
    assert log_passes("warning", None) and log_passes("error", "warning") and log_passes("warning", "warning")
    assert not log_passes("info", "warning")
