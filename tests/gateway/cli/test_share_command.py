"""`cellblock share SERVER PATH [--read-only]`: the command a refused path names writes the grant
into the config after the gate every grant passes, and never a path the gate refuses
(gateway/cli/grants.py, scan/shares.py; docs/jail.md, "Paths a call names")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cellblock.gateway.cli.grants import share_command
from cellblock.gateway.cli.options import EXIT_FINDING, EXIT_OK
from cellblock.gateway.serve.shares import share_command as named_command
from cellblock.policy.pathargs import Grant

CONFIG = """\
version: 1
# the user's own comment, kept
servers:
  notes:
    command: /usr/bin/true
    jail:
      network: none  # kept too
  open:
    command: /usr/bin/true
    jail: false
  far:
    url: https://mcp.example.com/mcp
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home of the test's own with a secret in it, Cellblock's state beside it, no gateway running."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "notes").mkdir()
    monkeypatch.setenv("HOME", str(home))
    for variable in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return home


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config" / "cellblock.yaml"
    path.parent.mkdir()
    path.write_text(CONFIG)
    return path


def jail(config: Path) -> dict[str, object]:
    found: dict[str, object] = yaml.safe_load(config.read_text())["servers"]["notes"]["jail"]
    return found


def test_a_folder_is_shared_read_write_in_the_config_keeping_the_rest_of_the_file(
    home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The control for the refusals below: a plain folder of the home gets through."""
    assert share_command(str(config), "notes", "~/notes") == EXIT_OK
    assert jail(config) == {"network": "none", "read_write": [str(home / "notes")]}
    assert "# the user's own comment, kept" in config.read_text()
    assert f"shared {home / 'notes'} read-write with 'notes'" in capsys.readouterr().err


def test_read_only_is_written_as_read_only_and_a_second_run_changes_nothing(
    home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / "notes" / "a.txt").write_text("x")
    assert share_command(str(config), "notes", str(home / "notes" / "a.txt"), read_only=True) == EXIT_OK
    written = config.read_text()
    assert jail(config)["read_only"] == [str(home / "notes" / "a.txt")]
    capsys.readouterr()
    assert share_command(str(config), "notes", str(home / "notes" / "a.txt"), read_only=True) == EXIT_OK
    assert config.read_text() == written
    assert f"'notes' is given {home / 'notes' / 'a.txt'} read-only already" in capsys.readouterr().err


def test_a_path_under_a_read_write_grant_is_given_already(home: Path, config: Path) -> None:
    assert share_command(str(config), "notes", "~/notes") == EXIT_OK
    written = config.read_text()
    (home / "notes" / "deep").mkdir()
    assert share_command(str(config), "notes", "~/notes/deep") == EXIT_OK
    assert share_command(str(config), "notes", "~/notes/deep", read_only=True) == EXIT_OK
    assert config.read_text() == written


def test_a_relative_path_is_taken_from_where_the_command_runs(
    home: Path, config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(home)
    assert share_command(str(config), "notes", "notes/../notes") == EXIT_OK
    assert jail(config)["read_write"] == [str(home / "notes")]


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("~/.ssh", "looks like a secret"),
        ("~", "your home"),
        ("~/notes/..", "your home"),
        ("/", "whole filesystem"),
        ("{state}", "Cellblock's own"),
        ("{config}", "Cellblock's own"),
        ("{config_dir}", "Cellblock's own"),
        ("~/.bashrc", "hidden"),
    ],
)
def test_a_path_the_gate_refuses_is_never_written(
    given: str, why: str, home: Path, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (home / ".bashrc").write_text("")
    (tmp_path / "state").mkdir(exist_ok=True)
    before = config.read_text()
    path = given.format(state=tmp_path / "state", config=config, config_dir=config.parent)
    assert share_command(str(config), "notes", path) == EXIT_FINDING
    err = capsys.readouterr().err
    assert "FAIL" in err and why in err, err
    assert config.read_text() == before


def test_a_path_that_does_not_exist_is_not_made_and_the_refusal_says_how(
    home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = config.read_text()
    assert share_command(str(config), "notes", "~/later") == EXIT_FINDING
    err = capsys.readouterr().err
    assert f"mkdir -p {home / 'later'}" in err and f"touch {home / 'later'}" in err, err
    assert not (home / "later").exists() and config.read_text() == before


@pytest.mark.parametrize(
    ("server", "why"),
    [("open", "jail: false"), ("nobody", "no server 'nobody' in"), ("far", "'far' is a remote server")],
)
def test_a_server_without_a_jail_or_not_in_the_config_is_refused(
    server: str, why: str, home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = config.read_text()
    assert share_command(str(config), server, "~/notes") == EXIT_FINDING
    assert why in capsys.readouterr().err
    assert config.read_text() == before


@pytest.mark.parametrize(
    ("grant", "command"),
    [
        (Grant("/h/notes", True), "cellblock share s /h/notes"),
        (Grant("/h/doc.txt", False), "cellblock share s /h/doc.txt --read-only"),
        (Grant("/h/new dir", True, "dir"), "mkdir -p '/h/new dir' && cellblock share s '/h/new dir'"),
        (Grant("/h/db.sqlite", True, "file"), "touch /h/db.sqlite && cellblock share s /h/db.sqlite"),
        (Grant("/h/x'; rm -rf ~; '\n", True), "cellblock share s '/h/x'\"'\"'; rm -rf ~; '\"'\"'\\u000a'"),
    ],
)
def test_the_command_a_refused_share_names_is_one_a_shell_runs_as_written(grant: Grant, command: str) -> None:
    """Quoted for a shell, control characters made visible: a path cannot add a command of its own."""
    assert named_command("s", grant) == command


def test_a_folder_holding_another_cellblock_config_is_not_shared_read_write(
    home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A project's own cellblock.yaml (another gateway's, or one the user starts later) is a config
    a server with write there would give `jail: false`: neither its folder nor it is made writable.
    The control: the same folder read-only, and a plain folder read-write (the first test above)."""
    project = home / "project"
    project.mkdir()
    (project / "cellblock.yaml").write_text("version: 1\nservers: {}\n")
    before = config.read_text()
    assert share_command(str(config), "notes", "~/project") == EXIT_FINDING
    assert share_command(str(config), "notes", "~/project/cellblock.yaml") == EXIT_FINDING
    err = capsys.readouterr().err
    assert err.count(f"{project / 'cellblock.yaml'}: Cellblock starts the servers it lists") == 2, err
    assert config.read_text() == before
    assert share_command(str(config), "notes", "~/project", read_only=True) == EXIT_OK
    assert jail(config)["read_only"] == [str(project)]


def test_a_config_reached_through_a_link_is_written_where_the_link_leads_and_stays_a_link(
    home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config kept with the user's dotfiles and linked into place: the grant lands in the file the
    link leads to, as `allow-host` writes it, and the link is not replaced by a copy of its own."""
    link = home / "linked.yaml"
    link.symlink_to(config)
    assert share_command(str(link), "notes", "~/notes") == EXIT_OK
    assert link.is_symlink() and jail(config)["read_write"] == [str(home / "notes")]


def test_a_folder_a_deeper_read_only_grant_holds_is_not_called_read_write_already(
    home: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """~/notes read-write with ~/notes/ro read-only in it: the jail mounts ~/notes/ro read-only (the
    deeper grant wins), so asking for it read-write is no "already" but a grant the gate judges (and
    refuses: it is inside a place a jail writes); the control: a folder only the read-write grant
    holds is given already."""
    (home / "notes" / "ro").mkdir()
    (home / "notes" / "rw").mkdir()
    grants = f"      read_write: [{home / 'notes'}]\n      read_only: [{home / 'notes' / 'ro'}]\n"
    config.write_text(config.read_text().replace("  # kept too\n", f"\n{grants}"))
    assert share_command(str(config), "notes", "~/notes/rw") == EXIT_OK
    assert "read-write already" in capsys.readouterr().err
    before = config.read_text()
    assert share_command(str(config), "notes", "~/notes/ro") == EXIT_FINDING
    err = capsys.readouterr().err
    assert "read-write already" not in err and "leads into" in err, err  # the gate's own rule for it
    assert config.read_text() == before
