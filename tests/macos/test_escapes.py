"""The escapes issue 20 lists, tried from inside each profile by a venv's Python: each must get
nothing through, and each has its control, the same attempt unjailed, which must get through (else
the test would prove nothing). An attempt got through when it printed the world's marker: the
decoy's content, a sibling's environment value, or its own word that a connection or a command
succeeded."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cellblock.gateway.serve.control import socket_path
from cellblock.gateway.state import runtime_dir
from cellblock.sandbox.unix import bind_private
from tests.macos.jail import plan, run

pytestmark = pytest.mark.macos

DATA_VOLUME = "/System/Volumes/Data"
DOCKER_SOCKETS = ("~/.docker/run/docker.sock", "/var/run/docker.sock")
APP = "Calculator"  # what `open -a` starts (in the background); quit after unless it was running

# each attempt runs as `python -c CODE MARKER ARG...` and prints MARKER only if it got through
READ = "import sys\ntry:\n    print(open(sys.argv[2]).read())\nexcept OSError as exc:\n    print(exc)\n"
CONNECT = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[2])\nprint(sys.argv[1])\n"
RUN = "import subprocess, sys\nif subprocess.run(sys.argv[2:]).returncode == 0:\n    print(sys.argv[1])\n"
# sysctl {CTL_KERN, KERN_PROCARGS2, pid}: another process's argv and environment
PROCARGS = (
    "import ctypes, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "mib = (ctypes.c_int * 3)(1, 49, int(sys.argv[2]))\nbuf = ctypes.create_string_buffer(1 << 20)\n"
    "size = ctypes.c_size_t(len(buf))\n"
    "if libc.sysctl(mib, 3, buf, ctypes.byref(size), None, 0) == 0:\n"
    "    print(buf.raw[: size.value].replace(b'\\0', b'\\n').decode('latin-1'))\n"
    "else:\n    print('sysctl failed, errno', ctypes.get_errno())\n"
)


@dataclass
class World:
    """What the attempts aim at, all made by the test and removed after it."""

    marker: str
    decoy: str  # a file under the real home, holding the marker
    link: str  # a symlink to it, inside the read_write grant
    sibling: int  # the pid of a process with the marker in its environment
    control: str  # a listener where, and as, the gateway binds its control socket
    docker: str  # Docker's socket when it answers, else a listener the test made
    labels: list[str] = field(default_factory=list)

    def label(self) -> str:
        """A new launchd job label, removed after the test."""
        self.labels.append(f"dev.cellblock.escape.{secrets.token_hex(4)}")
        return self.labels[-1]


def case_form(path: str, change: Callable[[str], str]) -> str:
    """`path` with its /Users component changed; the rest as it is."""
    return change("/Users") + path.removeprefix("/Users")


@dataclass(frozen=True)
class Escape:
    name: str
    code: str
    args: Callable[[World], list[str]]
    # only where the volume is case-insensitive (the default): elsewhere the control fails, a skip
    case_form: bool = False


ESCAPES = [
    Escape("the home, plainly", READ, lambda w: [w.decoy]),
    Escape("the home through the Data volume", READ, lambda w: [DATA_VOLUME + w.decoy]),
    Escape("/USERS", READ, lambda w: [case_form(w.decoy, str.upper)], case_form=True),
    Escape("/users", READ, lambda w: [case_form(w.decoy, str.lower)], case_form=True),
    Escape("the whole path swapcased", READ, lambda w: [w.decoy.swapcase()], case_form=True),
    Escape(
        "/USERS through the Data volume", READ, lambda w: [DATA_VOLUME + case_form(w.decoy, str.upper)], case_form=True
    ),
    Escape("a symlink into the home", READ, lambda w: [w.link]),
    Escape("kern.procargs2 of another process", PROCARGS, lambda w: [str(w.sibling)]),
    Escape("the gateway's control socket", CONNECT, lambda w: [w.control]),
    Escape("Docker's socket", CONNECT, lambda w: [w.docker]),
    Escape("launchctl submit", RUN, lambda w: ["/bin/launchctl", "submit", "-l", w.label(), "--", "/bin/sleep", "600"]),
    Escape("open -a", RUN, lambda _: ["/usr/bin/open", "-g", "-j", "-a", APP]),
]


def answering(path: str) -> bool:
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(os.path.expanduser(path))
        except OSError:
            return False
    return True


def app_running() -> bool:
    script = f'application "{APP}" is running'
    return subprocess.run(["osascript", "-e", script], capture_output=True, text=True).stdout.strip() == "true"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    marker = f"cellblock-escape-{secrets.token_hex(8)}"
    home = tempfile.mkdtemp(prefix=".cellblock-decoy-", dir=os.path.expanduser("~"))
    ssh = Path(home) / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "id_decoy").write_text(marker)
    decoy = os.path.realpath(ssh / "id_decoy")
    (tmp_path / "rw").mkdir(exist_ok=True)
    os.symlink(decoy, tmp_path / "rw" / "id_link")
    short = tempfile.mkdtemp(prefix="cb-", dir="/tmp")  # a socket's path must fit in 104 bytes
    docker = next((os.path.expanduser(p) for p in DOCKER_SOCKETS if answering(p)), os.path.join(short, "docker.sock"))
    control = str(socket_path(runtime_dir()))
    # bound as the gateway binds its sockets; a connection waits in the backlog, no thread needed
    sockets = [bind_private(path, 8) for path in [control, *([docker] if docker.startswith(short) else [])]]
    sibling = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], env={**os.environ, "CELLBLOCK_DECOY": marker}
    )
    was_running = app_running()
    made = World(marker, decoy, str(tmp_path / "rw" / "id_link"), sibling.pid, control, docker)
    try:
        yield made
    finally:
        sibling.kill()
        sibling.wait()
        for server in sockets:
            server.close()
        os.unlink(control)
        shutil.rmtree(short)
        shutil.rmtree(home)
        for label in made.labels:
            subprocess.run(["/bin/launchctl", "remove", label], capture_output=True, check=False)
        if not was_running and app_running():
            subprocess.run(["osascript", "-e", f'quit app "{APP}"'], capture_output=True, check=False)


@pytest.mark.parametrize("escape", ESCAPES, ids=lambda e: e.name)
def test_nothing_gets_through(
    escape: Escape, world: World, profile: dict[str, object], venv_python: Path, private: Path
) -> None:
    def attempt(jail: dict[str, object] | bool) -> subprocess.CompletedProcess[str]:
        return run(plan([str(venv_python), "-c", escape.code, world.marker, *escape.args(world)], jail, private))

    control = attempt(False)
    if world.marker not in control.stdout:
        said = f"{control.stdout[-1000:]} {control.stderr[-1000:]}"
        if escape.case_form:
            pytest.skip(f"this volume is case-sensitive: the case form does not reach the file unjailed ({said})")
        pytest.fail(f"the control (unjailed) did not get through either, so this proves nothing: {said}")
    jailed = attempt(profile)
    assert world.marker not in jailed.stdout, f"{escape.name} got through the jail ({profile}): {jailed.stdout[-2000:]}"
