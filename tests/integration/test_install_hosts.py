"""`cellblock install` of a package whose install script downloads, as puppeteer's does.

The package comes from a registry on loopback (tests/registry.py); its npm `postinstall` fetches a
file from a test host on loopback, as a browser download would, through the proxy variables the
installer's jail sets. Each case is judged on the host, by the requests the test host received,
and by what the install says and leaves in the installed tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import cli
from tests.registry import npm_package, npm_registry

pytestmark = [pytest.mark.jail]

BROWSER = b"pretend browser build\n"
# The package's postinstall: fetch URL into the package's directory, as puppeteer fetches Chrome.
FETCH = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=60) as answer:
        data = answer.read()
except OSError as exc:
    print(f"download failed: {exc}", file=sys.stderr)
    sys.exit(1)
with open("browser.bin", "wb") as handle:
    handle.write(data)
print(f"downloaded {len(data)} bytes")
"""


class Host:
    """A download host on loopback that counts the requests it answers."""

    def __init__(self) -> None:
        self.requests = 0
        host = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                host.requests += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(BROWSER)))
                self.end_headers()
                self.wfile.write(BROWSER)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def serving(self) -> Iterator[Host]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join()


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str], Host, Host]]:
    """The test's folder, the environment `cellblock install` runs with, the host the package's
    script downloads from, and another host."""
    tmp = tmp_path_factory.mktemp("install-hosts")
    (tmp / "run").mkdir(mode=0o700)
    with Host().serving() as target, Host().serving() as other:
        download = f"python3 fetch.py http://{target.address}/browser.zip"
        packages = {
            "cb-downloads": npm_package("cb-downloads", download, **{"fetch.py": FETCH}),
            # the same download, its failure ignored (as puppeteer 25 only warns)
            "cb-tolerant": npm_package("cb-tolerant", f"{download} || true", **{"fetch.py": FETCH}),
            # the same download from where the variable puppeteer reads says (its mirror)
            "cb-mirrored": npm_package(
                "cb-mirrored", 'python3 fetch.py "$PUPPETEER_DOWNLOAD_BASE_URL/browser.zip"', **{"fetch.py": FETCH}
            ),
        }
        with npm_registry(packages) as url:
            env = {
                "CELLBLOCK_DATA_DIR": str(tmp / "data"),
                "CELLBLOCK_STATE_DIR": str(tmp / "state"),
                "XDG_RUNTIME_DIR": str(tmp / "run"),
                "npm_config_registry": url,
            }
            yield tmp, env, target, other


def install(
    place: tuple[Path, dict[str, str], Host, Host], name: str, package: str = "cb-downloads", **install: Any
) -> tuple[subprocess.CompletedProcess[str], Path | None]:
    """`cellblock install NAME` of the package with `install` keys added; how it ended, and the
    file the script downloaded into the installed tree, if the install was recorded."""
    tmp, env, _, _ = place
    config = tmp / f"{name}.yaml"
    server = {"install": {"npm": f"{package}@1.0.0", **install}}
    config.write_text(yaml.safe_dump({"version": 1, "servers": {name: server}}))
    done = cli(env, "install", name, "--config", str(config))
    record = Path(env["CELLBLOCK_DATA_DIR"]) / "installs" / f"{name}.json"
    if not record.exists():
        return done, None
    tree = Path(json.loads(record.read_text())["tree"])
    return done, tree / "node_modules" / package / "browser.bin"


def test_an_install_script_download_is_refused_naming_the_host_and_both_ways_on(
    place: tuple[Path, dict[str, str], Host, Host],
) -> None:
    target = place[2]
    before = target.requests
    done, tree = install(place, "refused")
    assert done.returncode == 1 and tree is None, done.stderr
    assert target.requests == before  # the connection was never made
    assert "download failed" in done.stderr
    said = " ".join(done.stderr.split())  # the message as one line, however it wraps
    assert f"its install reached for {target.address}, which the installer's jail refused" in said, said
    assert f"set `hosts: [{target.address}]` under servers.refused.install in the config" in said
    assert "set `scripts: false` there. Then run `cellblock install refused`" in said
    assert "cellblock: installing cb-downloads@1.0.0 for 'refused'" in done.stderr  # the progress line
    assert "failed after " in done.stderr


def test_an_install_reaches_the_hosts_its_config_names(place: tuple[Path, dict[str, str], Host, Host]) -> None:
    target = place[2]
    before = target.requests
    done, tree = install(place, "allowed", hosts=[target.address])
    assert done.returncode == 0, done.stderr
    assert tree is not None and tree.read_bytes() == BROWSER
    assert target.requests == before + 1
    assert f"reaches the registry and {target.address}" in done.stderr
    assert "installed cb-downloads@1.0.0 for 'allowed'" in done.stderr


def test_an_install_without_scripts_runs_none_and_succeeds(place: tuple[Path, dict[str, str], Host, Host]) -> None:
    target = place[2]
    before = target.requests
    done, tree = install(place, "no-scripts", scripts=False)
    assert done.returncode == 0, done.stderr
    assert tree is not None and not tree.exists() and tree.parent.is_dir()  # installed, the script never ran
    assert target.requests == before
    assert "no install scripts" in done.stderr


def test_an_install_that_succeeds_without_its_download_says_which_host_was_refused(
    place: tuple[Path, dict[str, str], Host, Host],
) -> None:
    target = place[2]
    before = target.requests
    done, tree = install(place, "tolerant", package="cb-tolerant")
    assert done.returncode == 0 and tree is not None and not tree.exists(), done.stderr
    assert target.requests == before
    note = next(line for line in done.stderr.splitlines() if line.startswith("cellblock: note: 'tolerant': "))
    assert f"its install reached for {target.address}, which the installer's jail refused" in note
    assert f"set `hosts: [{target.address}]`" in note and "`scripts: false`" in note


def test_an_install_script_reaching_a_host_not_listed_is_refused_though_another_is(
    place: tuple[Path, dict[str, str], Host, Host],
) -> None:
    _, _, target, other = place
    before = target.requests
    done, tree = install(place, "other", hosts=[other.address])
    assert done.returncode == 1 and tree is None, done.stderr
    assert target.requests == before and other.requests == 0
    said = " ".join(done.stderr.split())
    assert f"set `hosts: [{other.address}, {target.address}]`" in said, said


def test_control_the_same_script_outside_the_installers_jail_reaches_the_host(
    place: tuple[Path, dict[str, str], Host, Host], tmp_path: Path
) -> None:
    target = place[2]
    before = target.requests
    script = tmp_path / "fetch.py"
    script.write_text(FETCH)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(
        [sys.executable, str(script), f"http://{target.address}/browser.zip"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "browser.bin").read_bytes() == BROWSER and target.requests == before + 1


def test_wrap_shows_each_install_starting_and_failing_with_the_refused_host_and_both_ways_on(
    place: tuple[Path, dict[str, str], Host, Host], tmp_path: Path
) -> None:
    _, env, target, _ = place
    client_config = tmp_path / "claude_desktop_config.json"
    client_config.write_text(
        json.dumps({"mcpServers": {"dl": {"command": "npx", "args": ["-y", "cb-downloads@1.0.0"]}}})
    )
    config = tmp_path / "cellblock.yaml"
    before = target.requests
    done = cli(
        {**env, "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}, "wrap", str(client_config), "--config", str(config)
    )
    assert done.returncode == 1, done.stderr
    assert yaml.safe_load(config.read_text())["servers"]["dl"]["install"] == {"npm": "cb-downloads@1.0.0"}
    lines = done.stderr.splitlines()
    started = next(i for i, line in enumerate(lines) if line.startswith("cellblock: installing cb-downloads@1.0.0"))
    assert "failed after " in lines[started + 1], done.stderr
    said = " ".join(done.stderr.split())
    assert f"set `hosts: [{target.address}]` under servers.dl.install in the config" in said, said
    assert "not installed: dl" in said and target.requests == before


def test_wrap_lets_an_install_download_from_the_mirror_its_client_entry_names(
    place: tuple[Path, dict[str, str], Host, Host], tmp_path: Path
) -> None:
    """No hand edit: the entry's PUPPETEER_DOWNLOAD_BASE_URL, which npx would have given the install,
    is given to it, and its host is the one more the install may reach."""
    _, env, target, _ = place
    mirror = f"http://{target.address}/chrome"
    entry = {"command": "npx", "args": ["-y", "cb-mirrored@1.0.0"], "env": {"PUPPETEER_DOWNLOAD_BASE_URL": mirror}}
    client_config = tmp_path / "claude_desktop_config.json"
    client_config.write_text(json.dumps({"mcpServers": {"mirrored": entry}}))
    config = tmp_path / "cellblock.yaml"
    before = target.requests
    done = cli(
        {**env, "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}, "wrap", str(client_config), "--config", str(config)
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(config.read_text())["servers"]["mirrored"]["install"] == {
        "npm": "cb-mirrored@1.0.0",
        "hosts": [target.address],
        "env": {"PUPPETEER_DOWNLOAD_BASE_URL": mirror},
    }
    assert target.requests == before + 1
    record = json.loads((Path(env["CELLBLOCK_DATA_DIR"]) / "installs" / "mirrored.json").read_text())
    assert (Path(record["tree"]) / "node_modules" / "cb-mirrored" / "browser.bin").read_bytes() == BROWSER


def test_install_env_takes_an_install_no_further_than_its_hosts(
    place: tuple[Path, dict[str, str], Host, Host],
) -> None:
    """install.env may name where a script downloads from, and a proxy of its own to go by; the
    installer's jail still reaches only the registry and `hosts`. The control: the same variables
    with that host listed, and the download is made from it."""
    _, _, target, other = place
    proxy = f"http://{other.address}"
    env = {"PUPPETEER_DOWNLOAD_BASE_URL": f"{proxy}/chrome", "NO_PROXY": "*", "no_proxy": "*"}
    env |= dict.fromkeys(("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"), proxy)
    before = (target.requests, other.requests)
    done, tree = install(place, "env-escape", package="cb-mirrored", hosts=[target.address], env=env)
    assert done.returncode == 1 and tree is None, done.stderr
    assert (target.requests, other.requests) == before  # nothing reached either host
    said = " ".join(done.stderr.split())
    assert f"its install reached for {other.address}, which the installer's jail refused" in said, said

    done, tree = install(place, "env-listed", package="cb-mirrored", hosts=[other.address], env=env)
    assert done.returncode == 0 and tree is not None and tree.read_bytes() == BROWSER, done.stderr
    assert (target.requests, other.requests) == (before[0], before[1] + 1)
