"""The runtime directory of `cellblock serve`: private to the user, and usable whatever its path.

Before, with `XDG_RUNTIME_DIR` unset (as a client may start the gateway), the sockets went to
`/tmp/cellblock-<uid>`, which another local user could create first to stop the gateway from
starting; and a runtime directory too deep for a Unix socket's path stopped it with a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from cellblock.gateway.serve.control import token_path
from tests.integration.conftest import gateway, probe_server, write_config
from tests.servers.hostile import load_escape

pytestmark = [pytest.mark.anyio, pytest.mark.jail]


def ps(env: dict[str, str]) -> list[dict[str, Any]]:
    """`cellblock ps --json` in exactly `env` (plus PATH)."""
    argv = [sys.executable, "-m", "cellblock.gateway.cli.main", "ps", "--json"]
    done = subprocess.run(
        argv, capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env}, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    listed: list[dict[str, Any]] = json.loads(done.stdout)
    return listed


@pytest.fixture
def squatted() -> Iterator[Path]:
    """`/tmp/cellblock-<uid>` made by another user (nobody), open to all: where the gateway put its
    sockets before. One left by this user (an older gateway's) is put aside meanwhile."""
    if os.getuid() != 0:
        pytest.skip("making a directory as another user needs root")
    path = Path(f"/tmp/cellblock-{os.getuid()}")
    aside = None
    if path.exists():
        if path.lstat().st_uid != os.getuid():
            pytest.skip(f"{path} belongs to another user already")
        aside = Path(tempfile.mkdtemp(prefix="cellblock-aside-", dir="/tmp"))
        path.rename(aside / "kept")
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    os.chown(path, 65534, 65534)
    try:
        yield path
    finally:
        shutil.rmtree(path)
        if aside is not None:
            (aside / "kept").rename(path)
            aside.rmdir()


async def test_a_directory_another_user_made_in_tmp_first_does_not_stop_the_gateway(
    tmp_path: Path, squatted: Path
) -> None:
    env = {"HOME": str(Path.home()), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
    async with gateway(write_config(tmp_path, {"probe": probe_server()}), tmp_path / "state", env=env) as client:
        assert (await client.call_tool("probe__echo", {"message": "up"})).content
        [running] = ps(env)
        assert running["servers"][0]["state"] == "ready"
    assert not os.listdir(squatted)  # nothing of the gateway went there


async def test_a_runtime_dir_too_deep_for_a_socket_path_still_serves_its_sockets(tmp_path: Path) -> None:
    run = tmp_path / ("r" * 70) / ("s" * 40)
    run.mkdir(parents=True, mode=0o700)
    run.chmod(0o700)
    env = {"HOME": str(Path.home()), "XDG_RUNTIME_DIR": str(run), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
    assert len(str(run / "cellblock" / "control-1234567.sock")) > 108
    servers = {
        "probe": probe_server(),
        # its egress proxy listens in the runtime dir too
        "net": probe_server(
            jail={
                "read_only": [str(Path(__file__).parents[1] / "servers")],
                "network": "allowlist",
                "allow_hosts": ["example.com"],
            }
        ),
    }
    async with gateway(write_config(tmp_path, servers), tmp_path / "state", env=env) as client:
        assert (await client.call_tool("net__echo", {"message": "up"})).content
        [running] = ps(env)
        assert {s["name"]: s["state"] for s in running["servers"]} == {"net": "ready", "probe": "ready"}


def test_no_private_runtime_dir_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "run").mkdir(parents=True, mode=0o777)
    (state / "run").chmod(0o777)
    base = tmp_path / "xdg"
    base.mkdir(mode=0o777)
    base.chmod(0o777)  # open to others: not a runtime base
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(Path.home()),
        "CELLBLOCK_STATE_DIR": str(state),
        "XDG_RUNTIME_DIR": str(base),
    }
    if Path(f"/run/user/{os.getuid()}").is_dir():
        pytest.skip("this machine has a private /run/user/UID, which the gateway would use")
    config = write_config(tmp_path, {"probe": probe_server()})
    argv = [sys.executable, "-m", "cellblock.gateway.cli.main", "serve", "--config", str(config)]
    done = subprocess.run(argv, input="", capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode != 0
    assert f"the runtime directory {state / 'run'} is not private to this user" in done.stderr
    assert "Traceback" not in done.stderr


HOSTILE = Path(__file__).resolve().parents[1] / "servers" / "hostile.py"
SANDBOX = Path(__file__).resolve().parents[2] / "cellblock" / "sandbox"


def _outcome(result: Any) -> dict[str, Any]:
    assert not result.is_error and result.structured_content is not None, result
    outcome: dict[str, Any] = result.structured_content
    return outcome


async def test_a_server_can_neither_reach_the_control_socket_nor_touch_the_state_its_grant_holds(
    tmp_path: Path,
) -> None:
    """A server granted the whole home sees Cellblock's own directories in it empty; one that can
    see them anyway (unjailed) is refused by the control socket, which answers the user's CLI."""
    home = tmp_path / "home"
    run = home / ".run"
    run.mkdir(parents=True, mode=0o700)
    run.chmod(0o700)
    state = home / ".local" / "state" / "cellblock"
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": str(run), "CELLBLOCK_STATE_DIR": str(state)}
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {
        "wide": hostile | {"jail": {"read_only": [str(HOSTILE.parent), str(SANDBOX)], "read_write": [str(home)]}},
        "loose": hostile | {"jail": False},
    }
    async with gateway(write_config(tmp_path, servers), state, env=env) as client:
        [sock] = [str(p) for p in (run / "cellblock").glob("control-*.sock")]
        assert ps(env)[0]["servers"]  # the user's CLI is answered
        # the honest control: the same request from a process the gateway did not start gets through
        assert (await anyio.to_thread.run_sync(load_escape().control_socket, sock)).got_through
        hidden = _outcome(await client.call_tool("wide__control_socket", {"path": sock}))
        assert not hidden["got_through"] and "ENOENT" in hidden["detail"], hidden
        refused = _outcome(await client.call_tool("loose__control_socket", {"path": sock}))
        assert not refused["got_through"] and "refused" in refused["detail"], refused
        assert "sent the" in refused["detail"]  # refused though it read the token and sent it
        # the token beside the socket: the jailed server cannot read it; the unjailed control can
        token = {"path": str(token_path(Path(sock)))}
        hidden = _outcome(await client.call_tool("wide__read_file", token))
        assert not hidden["got_through"] and "ENOENT" in hidden["detail"], hidden
        assert _outcome(await client.call_tool("loose__read_file", token))["got_through"]
        secret = token_path(Path(sock)).read_text().strip()
        # the state dir the grant holds shows empty: what the server sees there is not the user's
        listed = _outcome(await client.call_tool("wide__list_dir", {"path": str(state), "expect": []}))
        assert not listed["got_through"], listed
        control = _outcome(await client.call_tool("loose__list_dir", {"path": str(state), "expect": []}))
        assert control["got_through"], control
    # the refusal is audited, and the token is in no event
    audit = (state / "audit.jsonl").read_text()
    assert secret not in audit
    events = [json.loads(line) for line in audit.splitlines()]
    [refusal] = [event for event in events if event["event"] == "control_refused"]
    assert refusal["op"] == "ps" and "a server may not answer for the user" in refusal["reason"], refusal
    assert isinstance(refusal["peer_pid"], int) and refusal["peer_uid"] == os.geteuid()
    assert not list((run / "cellblock").glob("control-*"))  # socket and token gone with the gateway


async def test_what_a_grant_would_show_of_cellblock_and_the_session_stays_hidden_at_the_path_the_jail_shows_it(
    tmp_path: Path,
) -> None:
    """A grant given through a symlink shows the home at another path than its real one: the
    config file, a custom audit log, the state, the runtime dir (the session's, with the control
    socket) and the cache are hidden there too; a server's own package cache inside Cellblock's
    cache is shown, the next server's is not."""
    home = tmp_path / "home"
    run = home / ".run"
    run.mkdir(parents=True, mode=0o700)
    run.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(home)
    state = home / ".local" / "state" / "cellblock"
    caches = home / ".cache" / "cellblock"
    for name in ("cached", "other"):
        (caches / f"npm-{name}").mkdir(parents=True)
        (caches / f"npm-{name}" / f"{name}-package").write_text("{}")
    audit = home / "logs" / "audit.jsonl"
    audit.parent.mkdir()
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": str(run), "CELLBLOCK_STATE_DIR": str(state)}
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    code = [str(HOSTILE.parent), str(SANDBOX)]
    servers = {
        "wide": hostile | {"jail": {"read_only": [*code, str(link)]}},
        "cached": hostile | {"jail": {"read_only": [*code, str(home)], "read_write": [str(caches / "npm-cached")]}},
        "loose": hostile | {"jail": False},
    }
    config = write_config(home, servers, audit={"path": str(audit)})
    async with gateway(config, state, env=env) as client:
        await client.call_tool("loose__list_dir", {"path": str(home), "expect": []})  # an audit event, at least
        [sock] = [p.name for p in (run / "cellblock").glob("control-*.sock")]
        seen = link.relative_to(tmp_path)
        reads = {"config": seen / "cellblock.yaml", "audit": seen / "logs" / "audit.jsonl"}
        lists = {"state": seen / ".local/state/cellblock", "cache": seen / ".cache/cellblock/npm-cached"}
        lists |= {"runtime": seen / ".run"}
        for what, path in [*reads.items(), *lists.items()]:
            tool = "read_file" if what in reads else "list_dir"
            arguments = {"path": str(tmp_path / path)} | ({} if tool == "read_file" else {"expect": []})
            # the honest control: the same look through the same symlink from an unjailed server
            control = _outcome(await client.call_tool(f"loose__{tool}", arguments))
            assert control["got_through"], (what, control)
            hidden = _outcome(await client.call_tool(f"wide__{tool}", arguments))
            assert not hidden["got_through"], (what, hidden)
        socket_path = str(link / ".run" / "cellblock" / sock)
        assert (await anyio.to_thread.run_sync(load_escape().control_socket, socket_path)).got_through
        hidden = _outcome(await client.call_tool("wide__control_socket", {"path": socket_path}))
        assert not hidden["got_through"] and "ENOENT" in hidden["detail"], hidden
        # a grant of the home hides Cellblock's cache, and shows the server's own cache in it again
        own = {"path": str(caches / "npm-cached"), "expect": ["cached-package"]}
        assert _outcome(await client.call_tool("cached__list_dir", own))["got_through"]
        written = _outcome(await client.call_tool("cached__write_file", {"path": str(caches / "npm-cached" / "new")}))
        assert written["got_through"], written
        other = {"path": str(caches / "npm-other"), "expect": ["other-package"]}
        assert _outcome(await client.call_tool("loose__list_dir", other))["got_through"]
        assert not _outcome(await client.call_tool("cached__list_dir", other))["got_through"]
