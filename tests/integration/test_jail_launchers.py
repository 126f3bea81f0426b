"""Launcher discovery through the gateway: what a command is installed beside never comes into its jail.

Each jailed server below is the hostile server, started from a command placed where secrets live
next to it: `~/.cargo/bin` (with `credentials.toml`), a `#!` helper kept in `~/.ssh` (with a key),
a virtualenv whose `pyvenv.cfg` says `home = ~/.aws`. The same attempts run by the same server
with `jail: false` read every secret, so the attacks are real.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import cli, gateway, write_config
from tests.integration.test_jail import attempt

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "servers" / "hostile.py"
# what the calls name in the home is the jail's to stop, not asked about first (test_shared_paths.py)
GRANTS = {"read_only": [str(HOSTILE.parent), str(ROOT / "cellblock" / "sandbox")], "call_paths": "private"}


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def hostile_script(path: Path) -> Path:
    """An executable Python script that runs the hostile server (a valid `#!`: this test's Python)."""
    body = f"import runpy, sys\nsys.argv[1:] = []\nrunpy.run_path({str(HOSTILE)!r}, run_name='__main__')\n"
    return executable(path, f"#!{sys.executable}\n{body}")


class Home:
    """A fake home where each command sits next to something it must not carry into its jail."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        # ~/.cargo: a command `cargo install` could have put there, beside the registry token
        self.cargo = self.home / ".cargo"
        self.cargo_command = hostile_script(self.cargo / "bin" / "hostile-server")
        true = shutil.which("true")
        assert true is not None
        shutil.copy(os.path.realpath(true), self.cargo / "bin" / "cargo")
        (self.cargo / "credentials.toml").write_text('[registry]\ntoken = "cio-fake-token"\n')
        # ~/.ssh: an interpreter kept there (an askpass helper) and named by a #! line, beside a key
        self.ssh = self.home / ".ssh"
        self.key = self.ssh / "id_ed25519"
        self.ssh.mkdir()
        self.key.write_text("-----BEGIN FAKE PRIVATE KEY-----\nnot a real key\n")
        self.key.chmod(0o600)
        (self.ssh / "known_hosts").write_text("example.com ssh-ed25519 AAAA\n")
        self.helper = hostile_script(self.ssh / "askpass")
        self.ssh_command = executable(self.home / "bin" / "hostile-ssh", f"#!{self.helper}\n")
        # a #! line that names the key itself: the kernel cannot run it, and nothing follows it
        self.keyed_command = executable(self.home / "bin" / "keyed", f"#!{self.key}\n")
        # a virtualenv whose pyvenv.cfg points its home at ~/.aws
        self.aws = self.home / ".aws"
        self.aws.mkdir()
        (self.aws / "credentials").write_text("[default]\naws_secret_access_key = fake\n")
        # named like the Python a virtualenv's home holds, executable, and not an interpreter
        executable(self.aws / "python3", "aws sso login --profile default\n")
        self.venv = self.home / "proj" / ".venv"
        (self.venv / "bin").mkdir(parents=True)
        (self.venv / "bin" / "python").symlink_to(sys.executable)
        (self.venv / "pyvenv.cfg").write_text(f"home = {self.aws}\nversion = 3.11.7\n")
        self.venv_command = hostile_script(self.venv / "bin" / "hostile-server")
        self.config = tmp / "cellblock.yaml"
        self.state = tmp / "state"

    def secrets(self) -> list[tuple[str, dict[str, Any]]]:
        """Each attempt at what must stay out of every jail here."""
        return [
            ("read_file", {"path": str(self.cargo / "credentials.toml")}),
            ("list_dir", {"path": str(self.cargo), "expect": ["credentials.toml"]}),
            ("list_dir", {"path": str(self.cargo / "bin"), "expect": ["cargo"]}),
            ("read_file", {"path": str(self.key)}),
            ("list_dir", {"path": str(self.ssh), "expect": ["id_ed25519", "known_hosts"]}),
            ("read_file", {"path": str(self.aws / "credentials")}),
            ("list_dir", {"path": str(self.aws), "expect": ["credentials"]}),
        ]


JAILED = ("cargo", "ssh", "venv")


@pytest.fixture(scope="module")
async def launched(tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = Home(tmp_path_factory.mktemp("launchers"))
    servers: dict[str, Any] = {
        "cargo": {"command": str(home.cargo_command), "jail": GRANTS},
        "ssh": {"command": str(home.ssh_command), "jail": GRANTS},
        "venv": {"command": str(home.venv_command), "jail": GRANTS},
        "keyed": {"command": str(home.keyed_command), "jail": GRANTS, "start": "lazy"},
        # the honest control: the same hostile server, unjailed, must read every secret
        "control": {"command": sys.executable, "args": [str(HOSTILE)], "jail": False},
    }
    write_config(home.config.parent, servers)
    async with gateway(home.config, home.state, env={"HOME": str(home.home)}) as client:
        yield client, home


async def test_the_control_reads_every_secret_so_the_attacks_are_real(launched: Any) -> None:
    client, home = launched
    for tool, arguments in home.secrets():
        outcome = await attempt(client, "control", tool, arguments)
        assert outcome["got_through"], f"control {tool} {arguments}: {outcome['detail']}"


@pytest.mark.parametrize("server", JAILED)
async def test_nothing_beside_a_launcher_gets_into_its_jail(launched: Any, server: str) -> None:
    client, home = launched
    escaped = []
    for tool, arguments in home.secrets():
        outcome = await attempt(client, server, tool, arguments)
        if outcome["got_through"]:
            escaped.append(f"{tool} {arguments}: {outcome['detail']}")
    assert escaped == []


async def test_the_command_itself_is_what_its_jail_sees_of_its_directory(launched: Any) -> None:
    client, home = launched
    bin_dir = {"path": str(home.cargo / "bin"), "expect": ["hostile-server"]}
    assert (await attempt(client, "cargo", "list_dir", bin_dir))["got_through"]
    # the #! helper is there as the one file that runs the server, and the key beside it is not
    assert (await attempt(client, "ssh", "read_file", {"path": str(home.helper)}))["got_through"]
    assert (await attempt(client, "ssh", "list_dir", {"path": str(home.ssh), "expect": ["askpass"]}))["got_through"]


def test_show_lists_only_the_launcher_files_of_the_home_with_their_reasons(launched: Any) -> None:
    _, home = launched
    done = cli(
        {"HOME": str(home.home), "CELLBLOCK_STATE_DIR": str(home.state)}, "show", "--json", "--config", str(home.config)
    )
    assert done.returncode == 0, done.stderr
    described = {s["name"]: s for s in json.loads(done.stdout)}
    inside = str(home.home) + "/"
    of_home = {
        name: {m["path"]: m["why"] for m in described[name]["mounts"] if m["path"].startswith(inside)}
        for name in (*JAILED, "keyed")
    }
    assert of_home == {
        "cargo": {str(home.cargo_command): "the command itself"},
        "ssh": {
            str(home.ssh_command): "the command itself",
            str(home.helper): f"interpreter named by #! of {home.ssh_command}",
        },
        "venv": {str(home.venv): "virtualenv, for the command itself"},
        "keyed": {str(home.keyed_command): "the command itself"},
    }
