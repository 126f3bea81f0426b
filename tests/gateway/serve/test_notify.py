"""The desktop notification: the message is only ever an argument, and a missing notifier is skipped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from cellblock.gateway.serve import notify

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


@pytest.mark.anyio
async def test_a_notifier_that_hangs_is_ended_with_what_it_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started = tmp_path / "child.pid"
    fake = tmp_path / "notify-send"
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {started}\ntrap '' TERM\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(notify, "_SECONDS", 0.5)
    monkeypatch.setattr(sys, "platform", "linux")
    await notify.notify("hello")
    child = int(started.read_text())
    with pytest.raises(ProcessLookupError):  # killed with its notifier (a zombie at most until reaped)
        for _ in range(100):
            os.kill(child, 0)
            try:
                state = (await anyio.Path(f"/proc/{child}/stat").read_text()).split()[2]
            except FileNotFoundError:
                raise ProcessLookupError from None
            if state == "Z":
                raise ProcessLookupError
            await anyio.sleep(0.02)
