"""Fixtures the gateway's unit tests share."""

from __future__ import annotations

import pytest

import cellblock.gateway.audit.log as audit_module


class Clock:
    """The audit's clock, set by the test (`now`)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The time the audit writes (and budgets by) is `clock.now`."""
    clock = Clock()
    monkeypatch.setattr(audit_module.time, "time", clock)
    return clock
