"""What `review`, `diff --all` and `approve --all` say of a server they could not meet (cli/meet.py)."""

from __future__ import annotations

from pathlib import Path

from cellblock.gateway.cli.meet import causes

WHO = "cellblock: WARNING cellblock.gateway.downstream.supervisor:"
LOG = "\n".join(
    [
        "cellblock: INFO cellblock: serving 2 server(s) from /home/u/.config/cellblock/cellblock.yaml",
        f"{WHO} server 'broken' is down (protocol error: Connection closed); restarting in 0.5s",
        f"{WHO} server 'other' failed: its command is missing",
        f"{WHO} server 'broken' is down (its jail could not be put under its limits: gone); restarting in 1s",
    ]
)


def test_a_server_is_said_to_have_failed_for_why_it_first_stopped_not_for_a_later_start(tmp_path: Path) -> None:
    """A failing server is started again while the meeting lasts; a later start may end because
    the meeting does (seen under load: its proxy's socket gone as its jail starts)."""
    log = tmp_path / "meeting.log"
    log.write_text(LOG)
    assert causes(log) == {"broken": "protocol error: Connection closed", "other": "its command is missing"}
    assert causes(tmp_path / "missing.log") == {}
