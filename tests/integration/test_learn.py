"""`learn: true` end to end: `cellblock serve` traces a jailed server while it serves, then
`cellblock scan NAME --from-learned` proposes the grant the jail refused it, and `--apply` writes
a config `cellblock check` accepts. A server without `learn: true` leaves no trace, and no secret
(from `secrets:` or `env:`) is in any learn file. The gateway whose proxy refused a host runs in
memory (tests/harness.py)."""

from __future__ import annotations

import contextlib
import shutil
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import keyring
import pytest
import yaml

from tests.harness import build, connected
from tests.integration.conftest import cli, eventually, gateway, write_config

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("strace") is None, reason="needs bwrap, strace"),
]

SERVERS = Path(__file__).resolve().parents[1] / "servers"
KEYRING_SECRET = "from-the-keyring-4e9d1c7b"
ENV_SECRET = "from-env-8a6f2d3e"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def held(keyring_env: Mapping[str, str]) -> Iterator[None]:
    keyring.set_password("cellblock", "learn-key", KEYRING_SECRET)
    try:
        yield
    finally:
        with contextlib.suppress(keyring.errors.PasswordDeleteError):
            keyring.delete_password("cellblock", "learn-key")


def jail_of(config: Path) -> dict[str, object]:
    return dict(yaml.safe_load(config.read_text())["servers"]["learner"]["jail"])


def notes(root: Path, outside: Path, learn: bool, **jail: object) -> dict[str, object]:
    return {
        "command": sys.executable,
        "args": [str(SERVERS / "scanned.py"), "--root", str(root), "--read", str(outside)],
        "env": {"NOTES_PLAIN": ENV_SECRET},
        "secrets": {"NOTES_TOKEN": "learn-key"},
        "learn": learn,
        "jail": {"read_only": [str(SERVERS)], "read_write": [str(root)], **jail},
    }


async def test_serve_learns_what_the_jail_refused_and_scan_proposes_it(
    tmp_path: Path, keyring_env: Mapping[str, str], held: None
) -> None:
    root, outside = tmp_path / "notes", tmp_path / "elsewhere" / "settings.toml"
    root.mkdir()
    outside.parent.mkdir()
    outside.write_text("wanted = true\n")
    config = write_config(tmp_path, {"learner": notes(root, outside, True), "plain": notes(root, outside, False)})
    state = tmp_path / "state"
    env = {**keyring_env, "CELLBLOCK_STATE_DIR": str(state)}
    async with gateway(config, state, env=dict(keyring_env)) as client:
        for name in ("learner__version", "plain__version"):
            result = await client.call_tool(name, {})
            assert not result.is_error, result
    folder = state / "learn" / "learner"
    await eventually(lambda: any(folder.glob("*.trace")))
    assert not (state / "learn" / "plain").exists()  # no learn: true, no trace
    (trace,) = folder.glob("*.trace")
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    for path in (state / "learn").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert KEYRING_SECRET.encode() not in data and ENV_SECRET.encode() not in data, path

    shown = cli(env, "scan", "learner", "--from-learned", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert f"+  - {outside}" in shown.stdout, shown.stdout
    assert f"read_only + {outside}: openat {outside} refused by the jail (ENOENT)" in shown.stdout
    assert "--from-learned --apply" in shown.stdout
    assert str(outside) not in str(jail_of(config))  # shown, not written

    applied = cli(env, "scan", "learner", "--from-learned", "--apply", "--config", str(config))
    assert applied.returncode == 0, applied.stderr
    assert f"read_only + {outside}" in applied.stdout  # shown before it is written
    assert jail_of(config)["read_only"] == [str(SERVERS), str(outside)]
    assert cli(env, "check", "--config", str(config)).returncode == 0
    again = cli(env, "scan", "learner", "--from-learned", "--config", str(config))
    assert again.returncode == 0 and "(the same as now)" in again.stdout


async def test_behind_an_allowlist_the_hosts_the_egress_proxy_refused_are_proposed(tmp_path: Path) -> None:
    root, outside = tmp_path / "notes", tmp_path / "unused"
    root.mkdir()
    server = notes(root, outside, True, network="allowlist", allow_hosts=["example.org"])
    server.pop("secrets")
    config = write_config(tmp_path, {"learner": server})
    state = tmp_path / "state"
    async with connected(build(config, state)) as client:
        fetched = await client.call_tool("learner__fetch", {"url": "http://denied.invalid:8080/"})
        assert fetched.is_error  # the proxy refused it
    shown = cli({"CELLBLOCK_STATE_DIR": str(state)}, "scan", "learner", "--from-learned", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "+  - denied.invalid:8080" in shown.stdout, shown.stdout
    assert "allow_hosts + denied.invalid:8080: egress denied.invalid:8080 refused by the jail (EACCES)" in shown.stdout
