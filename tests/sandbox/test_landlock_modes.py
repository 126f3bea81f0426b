"""A root installer's Landlock jail: its changes of mode made by the gateway, beneath the install alone
(sandbox/modes.py), attacked.

As root, a Landlock jail could change the mode of any file root owns by its path (Landlock governs
no mode): an installer's hands its chmod calls to the gateway instead. The attacks name a file
outside the install directly, through `..`, through a link inside the install that leads out, and
ask for a set-user-ID mode; each is judged by the mode the file has on the host afterwards. The
positive control: the installer's own file gets its mode. The control: the same calls unjailed, as
root, change every mode.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.landlock import landlock_abi, landlock_plan
from cellblock.sandbox.types import JailSpec, Mount, MountMode, Network
from tests.sandbox.test_landlock import run, script, unjailed
from tests.sandbox.test_landlock_gate import Proxy

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(landlock_abi() < 1 or gate_missing() is not None, reason="needs a Landlock jail with a gate"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the gateway makes the mode changes of root's installers only"),
]

PYTHON = os.path.realpath(sys.executable)
INTERPRETER = Mount(os.path.realpath(sys.base_prefix), MountMode.READ_ONLY, "python")

ATTEMPTS = """
attempt("own", lambda: os.chmod(own, 0o755))
attempt("own_by_dirfd", lambda: os.chmod("by-dirfd", 0o700, dir_fd=os.open(install, os.O_RDONLY)))
attempt("outside", lambda: os.chmod(outside, 0o666))
attempt("dotdot", lambda: os.chmod(install + "/../outside", 0o666))
attempt("link", lambda: os.chmod(install + "/link", 0o666))
attempt("set_id", lambda: os.chmod(own, 0o4755))
"""


def place(tmp_path: Path) -> tuple[Path, Path, str]:
    """The install directory (with its own files and a link out of it), a root-owned file beside it,
    and the attempts' code."""
    install = tmp_path / "install"
    install.mkdir()
    (install / "own").write_text("x")
    (install / "by-dirfd").write_text("x")
    (install / "own").chmod(0o644)
    (install / "by-dirfd").chmod(0o644)
    outside = tmp_path / "outside"
    outside.write_text("root's")
    outside.chmod(0o600)
    (install / "link").symlink_to(outside)
    return install, outside, script(ATTEMPTS, install=str(install), own=str(install / "own"), outside=str(outside))


def modes(install: Path, outside: Path) -> dict[str, int]:
    return {
        "own": stat.S_IMODE((install / "own").stat().st_mode),
        "by_dirfd": stat.S_IMODE((install / "by-dirfd").stat().st_mode),
        "outside": stat.S_IMODE(outside.stat().st_mode),
    }


def attempt(tmp_path: Path, code: str, install: Path, **extra: Any) -> dict[str, Any]:
    """Run `code` as root in a Landlock jail that may write `install`, its network through a gate."""
    proxy = Proxy(tmp_path / "egress.sock")
    try:
        spec = JailSpec(
            name="install of cb",
            argv=(PYTHON, "-I", "-S", "-c", code),
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "user")},
            read_write=(str(install),),
            network=Network.ALLOWLIST,
            egress_socket=proxy.path,
            **extra,
        )
        return run(landlock_plan(spec, [INTERPRETER], str(install / "private")))
    finally:
        proxy.close()


def test_a_root_installers_mode_changes_land_beneath_its_install_and_nowhere_else(tmp_path: Path) -> None:
    install, outside, code = place(tmp_path)
    said = attempt(tmp_path, code, install, modes_beneath=str(install))
    assert said["own"] == said["own_by_dirfd"] == "ok"  # the positive control
    assert said["outside"] == said["dotdot"] == said["link"] == said["set_id"] == "PermissionError", said
    assert modes(install, outside) == {"own": 0o755, "by_dirfd": 0o700, "outside": 0o600}
    # the control: unjailed, as root, every change lands (the set-user-ID one last)
    outside.chmod(0o600)
    assert set(unjailed(code).values()) == {"ok"}
    assert modes(install, outside) == {"own": 0o4755, "by_dirfd": 0o700, "outside": 0o666}


def test_a_root_jail_that_is_no_installer_still_may_not_change_a_mode_by_path(tmp_path: Path) -> None:
    """Without `modes_beneath` (a server's jail) the calls are refused outright, the install's own file too."""
    install, outside, code = place(tmp_path)
    said = attempt(tmp_path, code, install)
    assert said["own"] == said["outside"] == "PermissionError", said
    assert modes(install, outside) == {"own": 0o644, "by_dirfd": 0o644, "outside": 0o600}
