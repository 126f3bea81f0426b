"""The gate every proposal passes (`gateway/scan/vet.py`, `gate.py`, `gatehosts.py`): what a
proposal may never grant, however a server spells it, and what it still may (the controls)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.gateway.config.model import JailConfig, LocalServer
from cellblock.gateway.scan.fromlearned import Learned, widen
from cellblock.gateway.scan.gate import NotGrantable, check_path, check_program, grantable_path
from cellblock.gateway.scan.gatehosts import check_host, host_entry
from cellblock.gateway.scan.proposal import Proposal, apply_proposal
from cellblock.gateway.scan.scratch import ScanError
from cellblock.gateway.scan.shares import ShareGate
from cellblock.gateway.scan.vet import MOST, check_written, vet
from cellblock.policy.hosts import address_allowed, host_allowed, parse_rule
from cellblock.policy.pathargs import grant_for, on_disk, path_arguments
from cellblock.sandbox.trace import Event, Kind


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own, with Cellblock's directories in it, and a link to it."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "work").mkdir()
    (home / "work" / "notes.txt").write_text("")
    (home / "work" / "to-home").symlink_to(home)
    monkeypatch.setenv("HOME", str(home))
    for variable in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    return home


NEVER_PATHS = [
    "/",
    "{home}",
    "{home}/",
    "{home}/.",
    "{home}/work/..",
    "{home}//",
    "//{home}",
    "{home}/work/to-home",  # a link to the home
    "{home}/work/to-home/.ssh",
    "{home}/.ssh",
    "{home}/.ssh/id_rsa",
    "{home}/.config",  # holds ~/.config/gh and Cellblock's own config
    "{home}/.local",  # holds Cellblock's own state and data
    "{home}/.local/state/cellblock/audit.jsonl",
    "{home}/.git-credentials",  # a secret of the home's under a name of its own
    "{home}/.config/gcloud/application_default_credentials.json",
    "{home}/.bash_history",
    "{tmp}",  # holds $CELLBLOCK_STATE_DIR
    "{tmp}/state/locks",
    "/tmp",  # holds /tmp/.X11-unix
    "/run",  # holds /run/user/UID
    "~/work",
    "~root",
    "work/notes.txt",
    "/x/${{HOME}}",
    "/x/\x1b[2Jcleared",
    "/x/" + "a" * 256,
]


@pytest.mark.parametrize("spelled", NEVER_PATHS)
def test_a_path_that_is_or_holds_the_home_root_a_secret_or_cellblocks_own_is_never_granted(
    spelled: str, home: Path, tmp_path: Path
) -> None:
    path = spelled.format(home=home, tmp=tmp_path)
    with pytest.raises(NotGrantable):
        check_path(grantable_path(path) if path.startswith("/") and ".." not in path else path)


def test_a_path_through_dotdot_is_not_grantable_as_the_kernel_saw_it(home: Path) -> None:
    with pytest.raises(NotGrantable, match=r"goes through '\.\.'"):
        grantable_path(f"{home}/work/missing/..")


def test_control_a_file_or_directory_of_the_users_own_is_grantable(home: Path) -> None:
    for path in (f"{home}/work", f"{home}/work/notes.txt", f"{home}/work/new-file", "/srv/data", f"{home}/work/.npmrc"):
        check_path(path)
    assert grantable_path(f"{home}/work//./notes.txt/") == f"{home}/work/notes.txt"


def test_the_config_the_proposal_goes_into_is_never_granted(home: Path, tmp_path: Path) -> None:
    config = tmp_path / "project" / "cellblock.yaml"
    check_path(str(config))  # not Cellblock's until it is the config being written
    with pytest.raises(NotGrantable, match="Cellblock's own"):
        check_path(str(config), [config])


NEVER_HOSTS = [
    "0.0.0.0/0",
    "0.0.0.0/0:8080",
    "10.0.0.0/8",
    "10.1.2.3/32",
    "[::]/0",
    "*.example.com",
    "*.com",
    "0.0.0.0:443",
    "[::]:443",
    "127.0.0.1:8080",
    "[::ffff:127.0.0.1]:80",
    "[64:ff9b::a9fe:a9fe]:80",  # NAT64 of 169.254.169.254
    "169.254.169.254:80",
    "224.0.0.1:80",
    "240.0.0.1:80",
    "localhost:80",
    "db.localhost",
    "intranet",
    "EXAMPLE.com",
    "example.com.",
    "exa_mple.com",
    "xn--zz.example.com",
    "example.com:0",
    "user@example.com",
    "http://example.com",
    "127.1:80",
    "0x7f.0.0.1:80",
    "[fe80::1%eth0]:80",
    "[fd00:ec2::254]:80",  # AWS's metadata service, over IPv6
    "[fd20:ce::254]:80",  # Google's
    "100.100.100.200:80",  # Alibaba's
    "168.63.129.16:80",  # Azure's WireServer
    "[64:ff9b::a83f:8110]:80",  # NAT64 of it
    "a" * 64 + ".com",
]


@pytest.mark.parametrize("entry", NEVER_HOSTS)
def test_an_entry_the_proxy_would_not_read_as_one_host_is_never_allowed(entry: str) -> None:
    with pytest.raises(NotGrantable):
        check_host(entry)


def test_control_a_host_name_or_one_address_is_allowed() -> None:
    for entry in ("api.example.org", "api.example.org:8443", "192.0.2.7:443", "10.1.2.3:5432", "[2001:db8::1]:443"):
        check_host(entry)
    check_host("xn--bcher-kva.example")


@pytest.mark.parametrize(
    ("target", "lookup"),
    [
        ("0.0.0.0/0", True),
        (r"0\.0\.0\.0/0", True),
        ("evil.example.com:22", True),
        ("169.254.169.254", True),
        ("*.example.com", True),
        (r"b\195\188cher.example", True),
        ("0.0.0.0/0:443", False),
        ("example.com:http", False),
    ],
)
def test_what_a_lookup_or_connection_names_becomes_no_range_and_no_smuggled_port(target: str, lookup: bool) -> None:
    with pytest.raises(NotGrantable):
        host_entry(target, lookup)


def test_control_a_lookup_or_a_connection_becomes_the_proxys_spelling() -> None:
    assert host_entry("api.example.org", lookup=True) == "api.example.org"
    assert host_entry("192.0.2.7:443", lookup=False) == "192.0.2.7:443"
    assert host_entry("[2001:db8::1]:443", lookup=False) == "[2001:db8::1]:443"


def test_the_range_a_lookup_spelled_would_let_the_proxy_reach_private_and_metadata_addresses() -> None:
    """Why the gate exists: what the proxy does with `0.0.0.0/0` (the control), and with what is
    proposed in its place."""
    spelled = [parse_rule("0.0.0.0/0")]
    for address in ("10.1.2.3", "169.254.169.254"):
        rule = host_allowed(spelled, address, 80)
        assert rule is not None and address_allowed(spelled, rule, address, 80)
    written = [parse_rule("api.example.org")]
    assert host_allowed(written, "10.1.2.3", 80) is None and host_allowed(written, "169.254.169.254", 80) is None


def test_vet_drops_only_what_a_proposal_adds(home: Path) -> None:
    current = {"network": "none", "read_only": [str(home)]}  # the user's own choice stays
    proposed = {
        "network": "allowlist",
        "allow_hosts": ["0.0.0.0/0"],
        "read_only": [str(home), f"{home}/work"],
        "read_write": [str(home), "/"],
    }
    kept, notes = vet(current, proposed)
    assert kept == {"network": "none", "read_only": [str(home), f"{home}/work"], "read_write": []}
    assert len(notes) == 3 and all(n.startswith("not proposed, ") for n in notes)


def test_every_proposal_passes_the_gate_when_it_is_made(home: Path) -> None:
    proposal = Proposal({"network": "none"}, {"network": "allowlist", "allow_hosts": ["*.example.com"]})
    assert proposal.proposed == {"network": "none"} and not proposal.changes
    assert "wildcard" in proposal.notes[0]


def test_widen_judges_the_path_the_kernel_was_given_not_its_collapsed_text(home: Path) -> None:
    server = LocalServer.model_validate({"command": "python3", "jail": {}})
    wanted = f"{home}/work/notes.txt"
    events = [
        Event(1.0, 1, Kind.WRITE, str(home), "openat", "ENOENT", f"{home}/missing/.."),  # not there: no refusal
        Event(1.0, 1, Kind.READ, str(home), "openat", "ENOENT", f"{home}/.ssh/.."),  # there, through '..'
        Event(1.0, 1, Kind.WRITE, "/", "openat", "EPERM", "/missing/.."),
        Event(1.0, 1, Kind.READ, wanted, "openat", "ENOENT", f"{home}/work/./notes.txt"),
    ]
    proposal = widen(server, Learned(1, 0, events))
    assert proposal.proposed == {"network": "none", "read_only": [wanted]}
    notes = "\n".join(proposal.notes)
    assert f"{home}/.ssh/.. goes through '..'" in notes and "/missing/.. goes through '..'" in notes


def test_what_apply_writes_is_checked_again_as_the_config_loads_it(home: Path, tmp_path: Path) -> None:
    """A proposal changed after the gate saw it (or any other path to the writer) is refused."""
    config = tmp_path / "cellblock.yaml"
    config.write_text("version: 1\nservers:\n  s:\n    command: python3\n    jail:\n      read_only: [/srv]\n")
    server = LocalServer.model_validate({"command": "python3", "jail": {"read_only": ["/srv"]}})
    proposal = Proposal({"read_only": ["/srv"], "network": "none"}, {"read_only": ["/srv"], "network": "none"})
    proposal.proposed["read_write"] = ["~"]  # what the config would expand to the home
    before = config.read_text()
    with pytest.raises(ScanError, match=r"not written.*your home"):
        apply_proposal(config, "s", proposal, server)
    assert config.read_text() == before
    with pytest.raises(NotGrantable):
        check_written(JailConfig(), JailConfig(read_write=[os.path.expanduser("~")]), config)


NEVER_WRITABLE = [
    "{home}/.bashrc",
    "{home}/.profile",
    "{home}/.config/autostart",
    "{home}/.config/tool/settings.toml",
    "{home}/.local/bin",
    "{home}/.local/lib/python3.11/site-packages",  # a .pth file there runs at every start of Python
    "{home}/work/.git",
    "{home}/work/.git/hooks/pre-commit",
    "{home}/work/.envrc",
    "{home}/bin",
    "{home}/bin/tool",
    "{home}/go/bin/tool",  # on $PATH
    "{home}/go",  # holds a directory on $PATH
    "/usr/local/bin",
    "/etc/cron.d",
    "/var/spool/cron",
    "/opt/tool",
    "{home}/work/to-bin",  # a link to ~/bin
    "{home}/Library/LaunchAgents",  # macOS runs what is put there at login (as wrap's shares refused already)
]


@pytest.mark.parametrize("spelled", NEVER_WRITABLE)
def test_what_runs_outside_the_jail_is_never_made_writable(
    spelled: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hidden entry or one inside one, a directory of programs run by name (or one holding
    one), the system's: writable, a server puts code there that runs outside its jail."""
    (home / "bin").mkdir()
    (home / "work" / "to-bin").symlink_to(home / "bin")
    monkeypatch.setenv("PATH", f"{home}/go/bin:/usr/bin")
    path = spelled.format(home=home)
    with pytest.raises(NotGrantable, match=r"a hidden entry|where programs are kept"):
        check_path(path, write=True)


def test_control_what_runs_outside_the_jail_may_be_read_and_the_users_files_written(home: Path) -> None:
    for path in (f"{home}/.bashrc", f"{home}/.config/tool/settings.toml", f"{home}/work/.git"):
        check_path(path)
    for path in (f"{home}/work", f"{home}/work/notes.txt", "/srv/data"):
        check_path(path, write=True)


def test_a_grant_shown_read_only_is_not_made_writable_where_it_runs_outside_the_jail(home: Path) -> None:
    """The two steps: a read of ~/.bashrc granted first, then its write learned (EROFS) moves it."""
    jail = {"read_only": [f"{home}/.bashrc", f"{home}/work"]}
    server = LocalServer.model_validate({"command": "python3", "jail": jail})
    events = [
        Event(1.0, 1, Kind.WRITE, f"{home}/.bashrc", "openat", "EROFS"),
        Event(1.0, 1, Kind.WRITE, f"{home}/work/notes.txt", "openat", "EROFS"),  # the control
    ]
    proposal = widen(server, Learned(1, 0, events))
    assert proposal.proposed == {"network": "none", "read_only": [f"{home}/.bashrc"], "read_write": [f"{home}/work"]}
    assert any(".bashrc is or is inside .bashrc" in n for n in proposal.notes), proposal.notes
    current = {"network": "none", "read_only": [f"{home}/.bashrc"]}
    kept, notes = vet(current, {**current, "read_write": [f"{home}/.bashrc"]})
    assert "read_write" not in kept or not kept["read_write"]
    assert notes and "hidden entry" in notes[0]


def test_a_proposal_adds_at_most_a_few_entries_to_one_key(home: Path, tmp_path: Path) -> None:
    hosts = [f"10.9.0.{n}:5432" for n in range(1, 41)]
    kept, notes = vet({"network": "none"}, {"network": "allowlist", "allow_hosts": hosts})
    assert kept["allow_hosts"] == hosts[:MOST]
    assert notes == [notes[0]] and notes[0].startswith(f"not proposed, allow_hosts + {40 - MOST} more")
    # an exec.allow where there was none narrows, however long it is
    programs = sorted(str(p) for p in Path("/usr/bin").iterdir() if p.is_file() and not p.is_symlink())[: MOST + 4]
    assert len(programs) > MOST and vet({}, {"exec": {"allow": programs}})[0]["exec"]["allow"] == programs
    config = tmp_path / "cellblock.yaml"
    with pytest.raises(NotGrantable, match="adds 40 entries to allow_hosts"):
        check_written(JailConfig(), JailConfig(network="allowlist", allow_hosts=hosts), config)
    check_written(JailConfig(), JailConfig(network="allowlist", allow_hosts=hosts[:MOST]), config)  # the control


def test_a_program_the_host_does_not_have_or_another_user_could_replace_is_never_allowed(tmp_path: Path) -> None:
    """What ran in the jail's own /tmp, or in a scan's copy that is gone, is not the host's file of
    that name; nor is a program in a directory others may write (without the sticky bit)."""
    with pytest.raises(NotGrantable, match="no program on this machine"):
        check_program(str(tmp_path / "made-in-the-jail"))
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "tool").write_text("#!/bin/sh\n")
    shared.chmod(0o777)
    with pytest.raises(NotGrantable, match=r"another user's program.*writable by others"):
        check_program(str(shared / "tool"))
    with pytest.raises(NotGrantable, match="no program on this machine"):
        check_program(str(shared))
    check_program(os.path.realpath(sys.executable))  # the control
    python = os.path.realpath(sys.executable)
    server = LocalServer.model_validate({"command": "python3", "jail": {"exec": {"allow": [python]}}})
    ran = Event(1.0, 1, Kind.EXEC, "/tmp/made-in-the-jail-by-the-server", "execve", "EACCES")
    proposal = widen(server, Learned(1, 0, [ran]))
    assert proposal.proposed["exec"] == {"allow": [python]}
    assert any("no program on this machine" in n for n in proposal.notes)


def test_a_path_that_leads_into_a_place_a_jail_may_write_is_never_granted(home: Path, tmp_path: Path) -> None:
    """A link of the user's into a writable grant, or a link the server put in its grant on the
    way: once granted, the server can make it lead to any file (a grant follows links)."""
    grant = tmp_path / "data" / "work"
    (grant / "sub").mkdir(parents=True)
    (grant / "x").write_text("")
    (grant / "out").symlink_to("/usr/share")  # put there by the server: benign today
    (home / "worklink").symlink_to(grant)
    (home / "datalink").symlink_to(grant.parent)
    writable = [str(grant)]
    for path in (f"{home}/worklink/x", f"{home}/worklink/out/doc", f"{home}/datalink/work/sub", str(grant / "x")):
        with pytest.raises(NotGrantable, match="where a jail may write"):
            check_path(path, writable=writable)
    check_path(f"{home}/work/notes.txt", writable=writable)  # the control
    check_path(str(grant.parent), writable=writable)  # holding it is no way into it
    with pytest.raises(ScanError, match="where a jail may write"):
        check_written(JailConfig(), JailConfig(read_only=[f"{home}/worklink/x"]), tmp_path / "c.yaml", writable)
    kept, notes = vet({"read_write": [str(grant)]}, {"read_write": [str(grant)], "read_only": [f"{home}/worklink/x"]})
    assert kept == {"read_write": [str(grant)], "read_only": []} and "where a jail may write" in notes[0]


def test_a_socket_or_a_directory_with_one_in_it_is_never_granted(home: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(run / "db.sock"))
        (home / "work" / "db-link").symlink_to(run / "db.sock")
        for path in (run / "db.sock", run, home / "work" / "db-link"):
            with pytest.raises(NotGrantable, match="is a socket"):
                check_path(str(path))
        check_path(f"{home}/work")  # the control: a link in it leads where the jail shows, nowhere
    with pytest.raises(NotGrantable, match="is a device"):
        check_path("/dev/null")


def test_a_home_a_secret_or_cellblocks_own_under_another_name_is_never_granted(home: Path, tmp_path: Path) -> None:
    """A copy of a home (a backup, another user's) holds within two levels what a home holds
    secret. The control: a directory of files, and one three levels above such a copy."""
    copy = tmp_path / "disk" / "backups" / "home" / "alice"
    (copy / ".aws").mkdir(parents=True)
    (copy / "notes.txt").write_text("")
    for path in (copy, copy.parent, copy.parent.parent):
        with pytest.raises(NotGrantable, match="a home under another name"):
            check_path(str(path))
    check_path(str(copy / "notes.txt"))


def test_a_home_copy_deeper_than_two_levels_is_not_looked_for(tmp_path: Path) -> None:
    """GAP: a directory is looked at two levels down for what a home holds secret (a whole tree
    would be walked for each proposal): one that holds a copy of a home deeper (a snapshot of a
    whole root file system) is grantable."""
    (tmp_path / "disk" / "backups" / "home" / "alice" / ".aws").mkdir(parents=True)
    check_path(str(tmp_path / "disk"))


BIND = """
import os, subprocess, sys
from cellblock.gateway.scan.gate import NotGrantable, check_path
home, alias, keys = sys.argv[1:4]
subprocess.run(["mount", "--bind", home, alias], check=True)
subprocess.run(["mount", "--bind", os.path.join(home, ".ssh"), keys], check=True)
for path in (alias, keys, os.path.join(keys, "id_rsa"), os.path.join(alias, "work")):
    try:
        check_path(path)
        print("granted", path)
    except NotGrantable as exc:
        print("refused", exc)
"""


def test_a_bind_mount_of_the_home_or_a_secret_is_the_same_directory(home: Path, tmp_path: Path) -> None:
    """By what a path is (device and inode), not its name: the home and ~/.ssh mounted elsewhere.
    The control: a directory of the user's through the same mount."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    (home / ".ssh" / "id_rsa").write_text("KEY\n")
    alias, keys = tmp_path / "mnt" / "home", tmp_path / "mnt" / "keys"
    alias.mkdir(parents=True)
    keys.mkdir()
    argv = ["unshare", "-rm", sys.executable, "-c", BIND, str(home), str(alias), str(keys)]
    done = subprocess.run(argv, capture_output=True, text=True, env=os.environ, timeout=60)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[-200:]}")
    lines = done.stdout.splitlines()
    assert len(lines) == 4, done.stderr
    assert lines[0] == f"refused {alias} is {home}, or a directory holding it, under another name"
    assert lines[1].startswith(f"refused {keys} is {home}/.ssh")
    assert lines[2].startswith(f"refused {keys}/id_rsa is inside {home}/.ssh under another name")
    assert lines[3] == f"granted {alias}/work"


def test_a_socket_past_many_entries_or_in_a_directory_that_cannot_be_listed_is_never_granted(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    for i in range(12_000):  # more than any cut-off a look at the first entries would make
        (crowded / f"{i:05d}").touch()
    os.mkfifo(crowded / "zz-pipe")  # listed last on most file systems, but anywhere counts
    with pytest.raises(NotGrantable, match="zz-pipe, which is a pipe"):
        check_path(str(crowded))
    (crowded / "zz-pipe").unlink()
    check_path(str(crowded))  # the control: the same directory of files

    listed = os.scandir

    def scandir(path: str) -> object:
        if path == str(crowded):  # as a user meets a directory of mode 0311
            raise PermissionError(13, "Permission denied", path)
        return listed(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(NotGrantable, match="cannot be listed"):
        check_path(str(crowded))


def _repository(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository in the home with its hooks and a virtualenv, and a client's PATH without either."""
    repo = home / "code" / "app"
    (repo / ".git" / "hooks").mkdir(parents=True)
    (repo / "venv" / "bin").mkdir(parents=True)
    (repo / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (repo / "venv" / "bin" / "activate").write_text("# sourced by the user's shell\n")
    (repo / "README.md").write_text("x\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return repo


def _asked_share(home: Path, given: str) -> str | None:
    """What the share stage says of the share a writing tool's call naming `given` asks for."""
    (argument,) = path_arguments({"path": given}, str(home))
    grant = grant_for(argument.path, str(home), True, on_disk)
    if grant is None or not grant.write:
        raise AssertionError(f"{given}: no writable grant to judge ({grant})")
    return ShareGate(None).check(grant.path, grant.write, [])


def test_a_share_a_call_asks_for_never_makes_a_repositorys_hooks_writable(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file named in a repository asks for the repository read-write, its .git/hooks with it: the
    server writes pre-commit, the user's next commit runs it outside the jail."""
    _repository(home, monkeypatch)
    why = _asked_share(home, "~/code/app/README.md")
    assert why is not None and "code/app/.git" in why and "servers.<server>.jail.read_write" in why, why


def test_a_share_a_call_asks_for_never_makes_a_virtualenvs_programs_writable(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repository(home, monkeypatch)
    why = _asked_share(home, str(repo / "venv" / "bin" / "activate"))
    assert why is not None and "virtualenv" in why, why


@pytest.mark.parametrize(
    ("held", "named"),
    [
        (".envrc", ".envrc"),
        (".mcp.json", ".mcp.json"),
        ("cellblock.yaml", "cellblock.yaml"),
        (".vscode/tasks.json", ".vscode"),
        ("bin/tool", "bin"),
    ],
)
def test_a_share_of_a_folder_holding_what_runs_code_is_refused_naming_it(
    held: str, named: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = home / "code" / "site"
    (project / held).parent.mkdir(parents=True, exist_ok=True)
    (project / held).write_text("x\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    why = _asked_share(home, "~/code/site/out.txt")
    assert why is not None and f"code/site/{named}" in why, why


@pytest.mark.parametrize("folder", ["go/bin", "miniconda3/bin", "anaconda3/bin", ".cargo/bin", ".local/bin"])
def test_a_homes_well_known_program_folder_is_never_made_writable_off_the_path(
    folder: str, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / folder).mkdir(parents=True)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert _asked_share(home, f"~/{folder}/tool") is not None


@pytest.mark.parametrize("name", ["package.json", "go.work", "conftest.py", "pytest.ini", "Makefile", ".npmrc"])
def test_a_file_tools_read_upward_is_never_made_or_shared_writable_in_the_home_itself(name: str, home: Path) -> None:
    assert _asked_share(home, f"~/{name}") is not None


def test_control_a_share_of_a_plain_folder_or_a_plain_file_in_the_home_is_granted(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _repository(home, monkeypatch)
    (home / "notes").mkdir()
    assert _asked_share(home, "~/notes/today.md") is None
    assert _asked_share(home, "~/code/app/docs/new.md") is None  # a folder the call makes, in the repository
    assert _asked_share(home, "~/report.txt") is None


def test_control_the_gate_refuses_the_hooks_folder_named_itself(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _repository(home, monkeypatch)
    assert _asked_share(home, "~/code/app/.git/hooks/pre-commit") is not None
