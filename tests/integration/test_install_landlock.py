"""`cellblock install` in a Landlock jail: the installer reaches the registry through the gateway,
and a hostile install script gets no further than the bwrap jail would let it.

The package comes from a registry on loopback (tests/registry.py). Its `postinstall` tries a key in
the user's real home, a write there, and a direct connection to a listener of the host, then writes
what it got into its own directory (the positive control: that write lands, and the install
succeeds). The control: the same script run by the same user with no jail gets all three.
As root, npm, pip and uv change the modes of what they install, which a Landlock jail of root may
not do by path: the gateway makes those changes for it, beneath the install alone (sandbox/modes.py).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.landlock import landlock_abi
from tests.integration.test_install_limits import SYSTEM_PATH, as_user_in
from tests.integration.test_limits_user import SYSTEM_PYTHON, user_area
from tests.registry import npm_package, npm_registry
from tests.sandbox.conftest import ensure_user

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(landlock_abi() < 1 or gate_missing() is not None, reason="needs a Landlock jail with a gate"),
]

ATTACK = """
const fs = require("fs"), net = require("net");
const said = {};
const home = process.argv[2], port = Number(process.argv[3]);
try { said.key = fs.readFileSync(home + "/.ssh/id_decoy", "utf8"); } catch (e) { said.key = e.code; }
try { fs.writeFileSync(home + "/planted", "x"); said.write = "ok"; } catch (e) { said.write = e.code; }
const done = () => { fs.writeFileSync(process.argv[4] || "said.json", JSON.stringify(said)); process.exit(0); };
const socket = net.connect(port, "127.0.0.1");
socket.on("connect", () => { said.connect = "ok"; socket.end(); done(); });
socket.on("error", (e) => { said.connect = e.code; done(); });
"""


def package(home: str, port: int) -> dict[str, str]:
    return npm_package("cb-landlock", f"node attack.js {home} {port}", **{"attack.js": ATTACK})


@pytest.fixture
def user() -> Iterator[pwd.struct_passwd]:
    """An ordinary user with a decoy key in its home."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("runs cellblock install as another user: needs root and runuser")
    if shutil.which("npm", path=SYSTEM_PATH) is None or not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"the user's install needs npm on {SYSTEM_PATH} and {SYSTEM_PYTHON}")
    found = ensure_user()
    ssh = Path(found.pw_dir) / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    (ssh / "id_decoy").write_text("DECOY-KEY")
    for path in (ssh, ssh / "id_decoy"):
        os.chown(path, found.pw_uid, found.pw_gid)
    yield found
    shutil.rmtree(ssh)
    Path(found.pw_dir, "planted").unlink(missing_ok=True)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def arrived(server: socket.socket) -> int:
    server.setblocking(False)
    count = 0
    while True:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return count
        count += 1


def test_as_a_user_a_landlock_install_reaches_the_registry_and_its_script_nothing_else(
    user: pwd.struct_passwd, listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    with npm_registry({"cb-landlock": package(user.pw_dir, port)}) as url:
        area, root, packages = user_area(user.pw_uid, user.pw_gid)
        try:
            as_user = as_user_in(user, area, root, packages, url)
            config = area / "c.yaml"
            server = {"install": {"npm": "cb-landlock@1.0.0"}, "jail": {"backend": "landlock"}}
            config.write_text(yaml.safe_dump({"version": 1, "servers": {"cb": server}}))
            command = [*as_user, SYSTEM_PYTHON, "-m", "cellblock.gateway.cli.main", "install", "cb"]
            done = subprocess.run([*command, "--config", str(config)], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            [said_file] = (area / "data").rglob("cb-landlock/said.json")  # the positive control
            said = json.loads(said_file.read_text())
            assert said == {"key": "EACCES", "write": "EACCES", "connect": "EACCES"}, said
            assert not Path(user.pw_dir, "planted").exists()
            assert arrived(listener) == 0
            # the control: the same script, the same user, no jail
            script = area / "attack.js"
            script.write_text(ATTACK)
            out = area / "control.json"
            out.touch()
            os.chown(out, user.pw_uid, user.pw_gid)
            node = shutil.which("node", path=SYSTEM_PATH) or "node"
            subprocess.run([*as_user, node, str(script), user.pw_dir, str(port), str(out)], check=True, timeout=60)
            assert json.loads(out.read_text()) == {"key": "DECOY-KEY", "write": "ok", "connect": "ok"}
            assert arrived(listener) == 1
        finally:
            shutil.rmtree(area)


MODE = """
const fs = require("fs");
let said;
try { fs.chmodSync(process.argv[2], 0o666); said = "ok"; } catch (e) { said = e.code; }
fs.writeFileSync(process.argv[3] || "mode.json", JSON.stringify({ mode: said }));
"""


def test_as_root_a_landlock_install_changes_modes_in_its_tree_and_nowhere_else(tmp_path: Path) -> None:
    """npm's changes of mode are made for it, beneath the install, and the package's script cannot
    make a file of root's outside it readable by all."""
    if os.geteuid() != 0:
        pytest.skip("the gateway makes the mode changes of root's installers only")
    decoy = tmp_path / "root-only"
    decoy.write_text("root's")
    decoy.chmod(0o600)
    files = npm_package("cb-modes", f"node mode.js {decoy}", **{"mode.js": MODE})
    (tmp_path / "run").mkdir(mode=0o700)
    config = tmp_path / "c.yaml"
    server = {"install": {"npm": "cb-modes@1.0.0"}, "jail": {"backend": "landlock"}}
    config.write_text(yaml.safe_dump({"version": 1, "servers": {"cb": server}}))
    with npm_registry({"cb-modes": files}) as url:
        env = {
            "CELLBLOCK_DATA_DIR": str(tmp_path / "data"),
            "CELLBLOCK_STATE_DIR": str(tmp_path / "state"),
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
            "npm_config_registry": url,
        }
        command = [sys.executable, "-m", "cellblock.gateway.cli.main", "install", "cb", "--config", str(config)]
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    # the positive control: the install succeeds, which npm's own changes of mode, refused, failed
    assert done.returncode == 0, done.stderr[-3000:]
    [said] = (tmp_path / "data").rglob("cb-modes/mode.json")
    assert json.loads(said.read_text()) == {"mode": "EPERM"}
    assert stat.S_IMODE(decoy.stat().st_mode) == 0o600
    # the control: the same script as root, unjailed, makes the file readable by all
    script = tmp_path / "mode.js"
    script.write_text(MODE)
    node = shutil.which("node") or "node"
    subprocess.run([node, str(script), str(decoy), str(tmp_path / "control.json")], check=True, timeout=60)
    assert json.loads((tmp_path / "control.json").read_text()) == {"mode": "ok"}
    assert stat.S_IMODE(decoy.stat().st_mode) == 0o666
