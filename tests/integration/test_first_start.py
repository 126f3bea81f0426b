"""The first start after `wrap`, as a user meets it: `review`, `diff --all` and `approve --all` meet
the servers no gateway has met themselves (one shared step), say one line for a server that could
not be met (and meet it again the next time), and show none of what the gateway and the servers
write meanwhile: that goes to the meeting's log.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import cli, probe_server, write_config

pytestmark = pytest.mark.anyio

REVIEW_FIRST = {"enabled": True, "first": "review"}
# what an old SDK's server writes to stderr as it starts: a pydantic dump and a traceback
JUNK = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/site-packages/mcp/server/lowlevel/server.py", line 640, in _handle_message',
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for ClientRequest",
]


def _servers(tmp_path: Path) -> dict[str, Any]:
    """alpha: a server that works (echo runs without asking); noisy: one that works but writes junk to
    stderr first; quits: one that exits at once, counting its starts in `starts`."""
    noisy = probe_server("--name", "noisy", lock=REVIEW_FIRST, tools={"default": "ask"})
    junk = "; ".join(f"echo {shlex.quote(line)} >&2" for line in JUNK)
    noisy["args"] = ["-c", f"{junk}; exec {shlex.join([noisy['command'], *noisy['args']])}"]
    noisy["command"], noisy["jail"] = "/bin/sh", False  # a shell in front: the jail would not show the venv
    starts = tmp_path / "starts"
    quits = f"echo started >> {shlex.quote(str(starts))}; echo 'cannot import name frobnicate' >&2; exit 3"
    return {
        "alpha": probe_server(
            "--name", "alpha", lock=REVIEW_FIRST, tools={"default": "ask", "rules": {"echo": "allow"}}
        ),
        "noisy": noisy,
        "quits": {"command": "/bin/sh", "args": ["-c", quits], "jail": False, "lock": REVIEW_FIRST},
    }


def _env(tmp_path: Path) -> dict[str, str]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    return {"CELLBLOCK_STATE_DIR": str(tmp_path / "state"), "XDG_RUNTIME_DIR": str(run)}


async def test_review_shows_a_summary_line_the_catalog_and_what_runs_unasked_and_none_of_the_servers_noise(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, _servers(tmp_path))
    env = _env(tmp_path)
    log = tmp_path / "state" / "meeting.log"

    shown = cli(env, "review", "--config", str(config), stdin="n\nn\n")

    assert shown.returncode == 1, shown.stderr
    told = shown.stderr.splitlines()
    assert told[0] == "cellblock: meeting alpha, noisy, quits: each starts once in its jail to say what it offers"
    assert told[1] == (
        "cellblock: could not meet 'quits': exited at start: cannot import name frobnicate; the log is "
        f"{log}. It is met again at the next review, diff --all or approve --all"
    )
    assert told[2:] == [
        "cellblock: 'alpha' stays held: its tools are not offered",
        "cellblock: 'noisy' stays held: its tools are not offered",
    ]
    lines = shown.stdout.splitlines()
    first = [line for line in lines if line.startswith("[")]
    assert first == [
        "[1/2] first contact with 'alpha': 18 tools, 1 prompt, 1 resource, 1 template, instructions, none approved yet",
        "[2/2] first contact with 'noisy': 18 tools, 1 prompt, 1 resource, 1 template, instructions, none approved yet",
    ]
    assert "new tool:echo" in lines and "    Echo the message back as text and as structured content." in lines
    unasked = [line for line in lines if line.startswith("runs without asking:")]
    assert unasked == ["runs without asking: echo", "runs without asking: none; every call asks you first"]
    everything = shown.stdout + shown.stderr
    for noise in ("INFO", "WARNING", "Traceback", "pydantic", "changed since", "stderr]", "limits:"):
        assert noise not in everything, noise
    # all of it is in the log, the servers' lines marked as theirs
    kept = log.read_text()
    assert f"[noisy stderr] {JUNK[2]}" in kept and "[quits stderr] cannot import name frobnicate" in kept
    assert "INFO cellblock.gateway.downstream.supervisor: server 'alpha' is ready" in kept
    assert log.stat().st_mode & 0o777 == 0o600

    # the failed meeting is not remembered: the next review meets quits again, and only quits
    starts = len((tmp_path / "starts").read_text().splitlines())
    again = cli(env, "review", "--config", str(config), stdin="n\nn\n")
    assert again.stderr.splitlines()[:2] == [
        "cellblock: meeting quits: each starts once in its jail to say what it offers",
        told[1],
    ]
    assert len((tmp_path / "starts").read_text().splitlines()) > starts


async def test_approve_all_right_after_wrap_meets_the_servers_and_approves_them_in_one_command(
    tmp_path: Path,
) -> None:
    servers = _servers(tmp_path)
    del servers["quits"]
    config = write_config(tmp_path, servers)
    env = _env(tmp_path)

    diffed = cli(env, "diff", "--all", "--config", str(config))  # reading first also meets them
    assert diffed.returncode == 1, diffed.stderr
    assert "first contact with 'alpha': 18 tools" in diffed.stdout and "first contact with 'noisy'" in diffed.stdout
    assert "Traceback" not in diffed.stdout + diffed.stderr

    approved = cli(env, "approve", "--all", "--config", str(config))
    assert approved.returncode == 0, approved.stderr
    assert approved.stderr.splitlines() == [
        "cellblock: OK: approved the catalog of 'alpha' (22 items)",
        "cellblock: OK: approved the catalog of 'noisy' (22 items)",
    ]


async def test_approve_all_alone_meets_and_approves_and_says_which_server_it_could_not_meet(tmp_path: Path) -> None:
    config = write_config(tmp_path, _servers(tmp_path))
    env = _env(tmp_path)

    approved = cli(env, "approve", "--all", "--config", str(config))

    assert approved.returncode == 1, approved.stderr  # quits is not approved: it said nothing
    told = approved.stderr.splitlines()
    assert told[0].startswith("cellblock: meeting alpha, noisy, quits: ")
    assert told[1].startswith("cellblock: could not meet 'quits': exited at start: cannot import name frobnicate; ")
    assert told[2:] == [
        "cellblock: OK: approved the catalog of 'alpha' (22 items)",
        "cellblock: OK: approved the catalog of 'noisy' (22 items)",
    ]
    assert (tmp_path / "state" / "locks" / "alpha.json").exists()
