"""The scan's scratch world (`gateway/scan/scratch.py`): what the scanned server's jail may write."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.scan.scratch import ScanError, scratch_world


def test_every_read_write_grant_a_scan_does_not_copy_is_shown_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package cache and the directory of the server's own code are not copied (they are not the
    user's work); granted read_write, the scan's jail still shows them read-only. The control: the
    user's work is copied, and the copy stays writable."""
    home, work, code = tmp_path / "home", tmp_path / "work", tmp_path / "code"
    cache = home / ".npm"
    for directory in (cache, work, code):
        directory.mkdir(parents=True)
    (code / "server.py").write_text("")
    monkeypatch.setenv("HOME", str(home))
    server = LocalServer.model_validate(
        {
            "command": sys.executable,
            "args": [str(code / "server.py")],
            "jail": {"read_write": [str(cache), str(work), str(code)]},
        }
    )
    scratch = scratch_world("s", server)
    try:
        jail = scratch.server(server).jail
        assert jail is not False
        assert scratch.frozen == [str(cache), str(code)]
        assert jail.read_write == [scratch.copies[str(work)]]
        assert jail.read_only == [str(cache), str(code)]
    finally:
        scratch.close()


def test_a_grant_that_is_a_socket_or_holds_one_is_no_scratch_world(tmp_path: Path) -> None:
    """A socket shown read-only still reaches its service; one inside a grant cannot be copied.
    The control: a grant of files is copied."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("")
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "db.sock"))
        for grant, expected in ((tmp_path / "db.sock", "is a socket"), (tmp_path, "db.sock, which cannot be copied")):
            server = LocalServer.model_validate({"command": sys.executable, "jail": {"read_only": [str(grant)]}})
            with pytest.raises(ScanError, match=expected):
                scratch_world("s", server)
    server = LocalServer.model_validate({"command": sys.executable, "jail": {"read_only": [str(data)]}})
    scratch = scratch_world("s", server)
    try:
        assert Path(scratch.copies[str(data)], "notes.txt").exists()
    finally:
        scratch.close()
