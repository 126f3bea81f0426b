"""What the control socket's `ps` says of each server beyond its state (`serve/details.py`): a
failed server's last stderr lines, redacted and escaped, its jail as the config sets it, its
package and digest, its lock's status; and how the dashboard passes them on (`dashboard/servers.py`).

The `ps` reply is the gateway's own (`Operations.answer`), of real `Downstream`s and a real
stderr relay fed through a pipe; only the gateway around them is a stand-in."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import Config
from cellblock.gateway.dashboard.view import _servers
from cellblock.gateway.downstream.local import LocalChannel
from cellblock.gateway.downstream.packages import Record
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.stderr import TAIL_LINES, StderrRelay
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve.locking import Locks, catalog_hash
from cellblock.gateway.serve.operations import Operations
from cellblock.gateway.state import atomic_write_json, data_dir, lock_path, pending_path
from cellblock.policy.lock import approve, save_lock, save_pending
from cellblock.sandbox.types import Limits

pytestmark = pytest.mark.anyio

SECRET = "sk-PRINTED-0123456789abcdefghijABCDEF"
HOSTILE = "<script>window.__pwned=1</script> \x1b[31mred\u202e"
CATALOG = {"tool:read": {"name": "read", "description": "reads", "inputSchema": {"type": "object"}}}
SERVERS: dict[str, Any] = {
    "crashy": {
        "command": "/bin/false",
        "jail": {
            "network": "allowlist",
            "allow_hosts": ["api.example.com:443"],
            "read_only": ["/srv/data"],
            "read_write": ["/srv/out"],
            "limits": {"processes": 64, "memory": "256MiB"},
        },
    },
    "calm": {"command": "/bin/true", "jail": {"read_only": ["/srv/docs"]}},
    "packaged": {"install": {"pypi": "mcp-thing==1.2.3"}, "start": "lazy"},
    "bare": {"command": "/bin/true", "jail": False, "lock": {"enabled": False}},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def config() -> Config:
    return parse_config(yaml.safe_dump({"version": 1, "servers": SERVERS}))


def relay(lines: Iterable[bytes], secrets: tuple[str, ...]) -> StderrRelay:
    """A real relay that read `lines` from a pipe, as a server's stderr, and passed them on to /dev/null."""
    source_out, source_in = os.pipe()
    sink = os.open(os.devnull, os.O_WRONLY)
    kept = StderrRelay(source_out, sink, "crashy", lambda: secrets)
    for line in lines:
        os.write(source_in, line)
    os.close(source_in)
    kept.join(10)
    os.close(sink)
    return kept


async def ps(config: Config, state: Path, secrets: tuple[str, ...] = (SECRET,)) -> dict[str, Any]:
    """The `ps` reply of a gateway whose `crashy` failed after writing 30 lines to stderr (the
    last of them a secret the gateway holds and hostile text), `calm` runs under an approved
    lock, `packaged` is lazy with its package installed, `bare` runs unjailed without a lock."""
    downstreams = {name: Downstream(name, config.servers[name], 5.0, limits=config.limits_of(name)) for name in SERVERS}
    crashy = downstreams["crashy"]
    written = [f"starting {n}\n".encode() for n in range(28)]
    written += [f"401: key={SECRET} rejected\n".encode(), f"{HOSTILE}\n".encode()]
    crashy.channel = LocalChannel("crashy")
    crashy.channel.stderr = relay(written, secrets)
    crashy.supervisor.state, crashy.supervisor.error = State.FAILED, "the server exited (gave up after 3 restarts)"
    downstreams["calm"].supervisor.state = State.READY
    locks = Locks(config, state, SimpleNamespace(note=lambda *a, **k: None))  # type: ignore[arg-type]
    save_pending(pending_path(state, "crashy"), "crashy", CATALOG)  # held at first contact
    locks.held["crashy"] = frozenset(CATALOG)
    save_lock(lock_path(state, "calm"), approve("calm", CATALOG, 0.0))
    operations = Operations(
        config=config,
        state=state,
        locks=locks,
        downstreams=downstreams,
        approvals=SimpleNamespace(listing=lambda full=None: []),  # type: ignore[arg-type]
        shares=None,
        source=Path("/home/u/cellblock.yaml"),
        review=None,  # type: ignore[arg-type]
    )
    reply = await operations.answer({"op": "ps"})
    assert reply["ok"] is True
    return reply


def by_name(servers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in servers}


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Record:
    """`packaged`'s record, as `cellblock install packaged` writes it."""
    monkeypatch.setenv("CELLBLOCK_DATA_DIR", str(tmp_path / "data"))
    record = Record(
        ecosystem="pypi",
        name="mcp-thing",
        version="1.2.3",
        tree=str(tmp_path / "tree"),
        digest="sha256:" + "ab" * 32,
        installed_at=0.0,
        files={},
    )
    (data_dir() / "installs").mkdir(parents=True, exist_ok=True)
    atomic_write_json(data_dir() / "installs" / "packaged.json", record.model_dump())
    return record


async def test_a_failed_servers_last_stderr_lines_reach_the_dashboard_escaped_and_redacted(
    config: Config, tmp_path: Path, installed: Record
) -> None:
    reply = await ps(config, tmp_path)
    lines = by_name(reply["servers"])["crashy"]["stderr"]
    assert len(lines) == TAIL_LINES and lines[0] == f"starting {30 - TAIL_LINES}"  # the last ones, bounded
    assert lines[-2] == "401: key=[redacted] rejected" and SECRET not in str(reply)
    assert "\x1b" not in lines[-1] and "\u202e" not in lines[-1] and "\\u001b[31mred\\u202e" in lines[-1]
    shown = by_name(_servers(Path("control-7.sock"), reply)["servers"])
    page = shown["crashy"]["stderr"]
    assert page[-2:] == ["401: key=[redacted] rejected", "<script>window.__pwned=1</script> \\u001b[31mred\\u202e"]
    assert SECRET not in str(shown) and "\x1b" not in str(shown)
    # a running server's stderr is its log, not news: only a failed or restarting one's is given
    assert by_name(reply["servers"])["calm"]["stderr"] == [] == shown["calm"]["stderr"]
    # control: the same lines, through a relay that knows no secret, carry it
    control = by_name((await ps(config, tmp_path, secrets=()))["servers"])["crashy"]["stderr"]
    assert control[-2] == f"401: key={SECRET} rejected"


async def test_the_jail_is_the_one_the_config_sets(config: Config, tmp_path: Path, installed: Record) -> None:
    servers = by_name((await ps(config, tmp_path))["servers"])
    jail = config.servers["crashy"].jail  # type: ignore[union-attr]
    assert jail is not False
    detail = servers["crashy"]["jail_detail"]
    assert detail["network"] == jail.network == "allowlist"
    assert detail["allow_hosts"] == jail.allow_hosts == ["api.example.com:443"]
    assert (detail["read_only"], detail["read_write"]) == (jail.read_only, jail.read_write)
    assert detail["limits"] == {"processes": 64, "memory": 256 << 20}
    assert config.limits_of("crashy") == Limits(64, 256 << 20)
    assert detail["backend"] is None and detail["configured_backend"] == jail.backend  # not started yet
    assert servers["bare"]["jail_detail"] is None and servers["bare"]["jail"] is False  # unjailed: said by `jail`
    lines = by_name(_servers(Path("control-7.sock"), {"ok": True, "servers": list(servers.values())})["servers"])
    assert "network allowlist: api.example.com:443" in lines["crashy"]["jail_lines"]
    assert {"read-only /srv/data", "read-write /srv/out", "limits: processes 64, memory 256 MiB"} <= set(
        lines["crashy"]["jail_lines"]
    )


async def test_the_lock_is_held_approved_or_off_and_the_package_is_the_installed_one(
    config: Config, tmp_path: Path, installed: Record
) -> None:
    servers = by_name((await ps(config, tmp_path))["servers"])
    # held at first contact, with the hash the review card shows (the control socket's `held`)
    assert servers["crashy"]["lock"] == {"status": "held", "first": True, "hash": catalog_hash(CATALOG), "items": 1}
    # approved: the hash of the catalog approved, as `cellblock diff` showed it before
    assert servers["calm"]["lock"] == {"status": "approved", "hash": catalog_hash(CATALOG), "items": 1}
    assert servers["packaged"]["lock"] == {"status": "none"} and servers["bare"]["lock"] == {"status": "off"}
    assert servers["packaged"]["package"] == {
        "package": "mcp-thing==1.2.3",
        "installed": "mcp-thing==1.2.3",
        "digest": installed.digest,
    }
    assert servers["packaged"]["start"] == "lazy" and servers["calm"]["package"] is None
    shown = by_name(_servers(Path("control-7.sock"), {"ok": True, "servers": list(servers.values())})["servers"])
    assert shown["crashy"]["lock"] == f"held: first contact (sha256 {catalog_hash(CATALOG)}, 1 item(s) held)"
    assert shown["calm"]["lock"] == f"approved (sha256 {catalog_hash(CATALOG)}, 1 item(s))"
    assert shown["packaged"]["package"] == f"mcp-thing==1.2.3 ({installed.digest})"


async def test_a_package_not_installed_is_said_so(
    config: Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELLBLOCK_DATA_DIR", str(tmp_path / "empty"))
    servers = by_name((await ps(config, tmp_path))["servers"])
    assert servers["packaged"]["package"] == {"package": "mcp-thing==1.2.3", "installed": None, "digest": None}
    shown = by_name(_servers(Path("control-7.sock"), {"ok": True, "servers": list(servers.values())})["servers"])
    assert shown["packaged"]["package"] == "mcp-thing==1.2.3: not installed"


def test_a_reply_of_the_wrong_shape_or_too_long_is_bounded_and_escaped() -> None:
    server = {
        "name": "x",
        "stderr": ["\x1b[2J" + "y" * 5000, 7, *[f"l{n}" for n in range(40)]],
        "lock": {"status": "held", "hash": "\u202e", "first": "yes"},
        "jail_detail": {"read_only": ["/a\x07", 3], "network": "none\x1b"},
        "package": {"package": "p\x1b"},
    }
    shown = _servers(Path("control-7.sock"), {"ok": True, "servers": [server]})["servers"][0]
    assert len(shown["stderr"]) == TAIL_LINES and shown["stderr"][-1] == "l39"
    assert shown["lock"] == "held: changed since approved (sha256 \\u202e, ? item(s) held)"
    assert "read-only /a\\u0007" in shown["jail_lines"] and "network none\\u001b" in shown["jail_lines"]
    assert shown["package"] == "p\\u001b: not installed"
    long = _servers(Path("c-1.sock"), {"ok": True, "servers": [{"stderr": ["z" * 5000]}]})["servers"][0]["stderr"]
    assert len(long[0]) == 300 and long[0].endswith("…")
