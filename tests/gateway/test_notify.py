"""The desktop notification: the message is only ever an argument, and a missing notifier is skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cellblock.gateway import notify

HOSTILE = '" & do shell script "touch /tmp/owned" & "'


def test_on_macos_the_message_is_the_scripts_argument_never_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(notify.shutil, "which", lambda name: f"/usr/bin/{name}")
    command = notify._command(HOSTILE)
    assert command is not None and command[0] == "/usr/bin/osascript" and command[-1] == HOSTILE
    assert not any(HOSTILE in part for part in command[:-1])


def test_on_linux_the_message_comes_after_the_end_of_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(notify.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert notify._command("--help") == ["/usr/bin/notify-send", "--app-name", "Cellblock", "--", "Cellblock", "--help"]


@pytest.mark.anyio
async def test_no_notifier_is_no_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert notify._command("hello") is None
    await notify.notify("hello")  # returns without a word
