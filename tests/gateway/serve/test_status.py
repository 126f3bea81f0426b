"""The status tool's text: each thing that waits for the user, with the command they run."""

from __future__ import annotations

import time

from cellblock.gateway.serve.status import ServerStatus, review_tool, status_text, status_tool


def test_held_waiting_and_down_each_name_the_command_to_run() -> None:
    servers = [
        ServerStatus("fs", held=14, first_contact=True, down=None),
        ServerStatus("git", held=1, first_contact=False, down=None),
        ServerStatus("time", held=0, first_contact=False, down="exited at start: no tzdata"),
    ]
    pending = [
        {"id": "k3f9", "server": "fs", "tool": "write_file", "waits_until": time.time() + 90},
        {"id": "gone", "server": "fs", "tool": "delete", "waits_until": None},  # its call gave up: not waiting
    ]
    text = status_text(servers, pending, "cellblock__review")
    assert "- fs: 14 item(s), never reviewed. The user runs `cellblock diff fs`, then `cellblock approve fs`" in text
    assert "- git: 1 item(s), changed since approved." in text and "`cellblock review`" in text
    assert "'write_file' (8" in text and "`cellblock approve k3f9` or `cellblock deny k3f9`" in text
    assert "cellblock__review with a server's name asks the user there" in text
    assert "gone" not in text
    assert "- time: exited at start: no tzdata" in text


def test_nothing_waiting_says_so_and_the_tool_reads_only() -> None:
    assert status_text([ServerStatus("fs", 0, False, None)], [], "r") == "Nothing is held or waiting for the user."
    tool = status_tool("__", 64)
    assert tool.name == "cellblock__status" and tool.annotations is not None
    assert status_tool("----", 16).name == "cellblock----sta"  # within the shortest names.max_length
    assert review_tool("----", 16, ["fs"]).name == "cellblock----rev"  # and still apart from it
    assert tool.annotations.read_only_hint and not tool.annotations.destructive_hint
    assert tool.input_schema == {"type": "object", "properties": {}, "additionalProperties": False}
