"""A desktop notification for a question only the user can answer, where the desktop can show one.

notify-send on Linux (over the session bus, found as for the keyring when the client gave no
address), osascript on macOS. Best effort by design: a machine without either, a headless
session or a notifier that fails or hangs is skipped without a word, since the call's own message
to the client says the same thing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys

import anyio

__all__ = ["notify"]

TITLE = "Cellblock"
_SECONDS = 5.0
# the message is the script's argument, never part of its text: a tool name cannot inject AppleScript
_APPLESCRIPT = ("on run argv", f'display notification (item 1 of argv) with title "{TITLE}"', "end run")


def _command(message: str) -> list[str] | None:
    if sys.platform == "darwin":
        osascript = shutil.which("osascript")
        return None if osascript is None else [osascript, *(a for line in _APPLESCRIPT for a in ("-e", line)), message]
    notify_send = shutil.which("notify-send")
    if notify_send is None:
        return None
    from cellblock.gateway.credentials import session_bus

    session_bus()  # a client may have started the gateway without the bus's address
    return [notify_send, "--app-name", TITLE, "--", TITLE, message]


async def notify(message: str) -> None:
    """Show `message` on the user's desktop, or do nothing where that cannot be done."""
    command = _command(message)
    if command is None:
        return
    with contextlib.suppress(OSError):
        # never the gateway's stdin, stdout or stderr: the first two are the client's channel; a
        # session of its own, so that a notifier that hangs is ended with all it started
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            with anyio.move_on_after(_SECONDS):
                await process.wait()
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with anyio.CancelScope(shield=True):
                    await process.wait()
