"""Shared by the jail tests that run as root and as an unprivileged user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SANDBOX = Path(__file__).resolve().parents[2] / "cellblock" / "sandbox"
USER = "cellblock-test"


def ensure_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
        return pwd.getpwnam(USER)


@pytest.fixture(params=["root", "user"])
def who(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str], str, int]]:
    """(name, argv prefix to run as them, their home, their uid)."""
    if os.geteuid() != 0:
        if request.param == "root":
            pytest.skip("the root case needs root")
        me = pwd.getpwuid(os.geteuid())
        yield me.pw_name, [], me.pw_dir, me.pw_uid
        return
    if request.param == "root":
        yield "root", [], "/root", 0
        return
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.fail("the unprivileged case needs useradd and runuser (util-linux, passwd)")
    user = ensure_user()
    yield USER, ["runuser", "-u", USER, "--"], user.pw_dir, user.pw_uid


@pytest.fixture
def area() -> Iterator[Path]:
    # world-traversable, so the unprivileged user can reach what it is granted
    path = Path(tempfile.mkdtemp(prefix="cellblock-jail-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def escape_copy(area: Path) -> Path:
    """The escape attempts (a folder run as a script) copied into a folder of their own outside the
    checkout, which may sit in a home the other user cannot enter (root's is 0700); the jail shares
    that folder."""
    copy = area / "attempts" / "escape"
    copy.parent.mkdir(mode=0o755)
    shutil.copytree(SANDBOX / "escape", copy, ignore=shutil.ignore_patterns("__pycache__"))
    copy.chmod(0o755)
    for module in copy.iterdir():
        module.chmod(0o644)
    return copy


@pytest.fixture
def user_home(tmp_path: Path) -> Path:
    """A home like a user's, with a key in it."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("DECOY-KEY\n")
    return home


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the same user the test started, with a secret in its environment."""
    process = subprocess.Popen(
        [os.path.realpath(sys.executable), "-I", "-S", "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={"DECOY_TOKEN": "DECOY-ENVIRON"},
    )
    yield process
    process.kill()
    process.wait()
