"""sandbox/installer.py: package specs, the installer's jail, and the record of an installed tree."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from cellblock.sandbox.bwrap import bwrap_plan, check_bwrap
from cellblock.sandbox.installer import (
    Ecosystem,
    Package,
    PackageError,
    changes,
    digest,
    installer_steps,
    manifest,
    parse_package,
    program_of,
    seal,
    tree_of,
)
from cellblock.sandbox.spawn import run_plan
from cellblock.sandbox.types import Network

PY = os.path.realpath(sys.executable)


@pytest.mark.parametrize(
    ("ecosystem", "spec", "expected"),
    [
        (
            "npm",
            "@modelcontextprotocol/server-memory@2026.8.31",
            Package(Ecosystem.NPM, "@modelcontextprotocol/server-memory", "2026.8.31"),
        ),
        ("npm", "mcp-remote", Package(Ecosystem.NPM, "mcp-remote")),
        ("npm", "pkg@1.0.0-rc.1", Package(Ecosystem.NPM, "pkg", "1.0.0-rc.1")),
        ("pypi", "mcp-server-git==2026.10.19", Package(Ecosystem.PYPI, "mcp-server-git", "2026.10.19")),
        ("pypi", "mcp-server-fetch", Package(Ecosystem.PYPI, "mcp-server-fetch")),
        ("pypi", "srv[cli]==1.0rc1", Package(Ecosystem.PYPI, "srv", "1.0rc1", "[cli]")),
    ],
)
def test_a_package_is_a_name_and_an_exact_version_or_none(ecosystem: str, spec: str, expected: Package) -> None:
    assert parse_package(ecosystem, spec) == expected


@pytest.mark.parametrize(
    ("ecosystem", "spec"),
    [
        ("npm", "pkg@^1.0.0"),  # a range picks another release each time
        ("npm", "pkg@latest"),  # so does a tag
        ("npm", "pkg@1"),
        ("npm", "git+https://example.com/x.git"),
        ("npm", "../local"),
        ("pypi", "srv>=1.0"),
        ("pypi", "srv==1.*"),
        ("pypi", "srv @ https://example.com/srv.whl"),
        ("pypi", "-e ."),
        ("npm", "foo@1.0.0-x.tgz"),  # npm reads it from the disk
        ("pypi", "foo.zip"),
    ],
)
def test_ranges_tags_urls_and_paths_are_refused(ecosystem: str, spec: str) -> None:
    with pytest.raises(PackageError):
        parse_package(ecosystem, spec)


def test_npm_spec_without_a_version_asks_for_the_newest_and_pip_for_any() -> None:
    assert Package(Ecosystem.NPM, "pkg").spec() == "pkg@latest"
    assert Package(Ecosystem.PYPI, "srv", extras="[cli]").spec("2.0") == "srv[cli]==2.0"


def _tree(root: Path) -> Path:
    package = root / "node_modules" / "pkg"
    package.mkdir(parents=True)
    (package / "package.json").write_text(
        '{"name": "pkg", "version": "1.0.0", "bin": {"pkg": "index.js", "pkg-admin": "admin.js"}}'
    )
    (package / "index.js").write_text("#!/usr/bin/env node\n")
    (package / "index.js").chmod(0o755)
    (root / "node_modules" / ".bin").mkdir()
    (root / "node_modules" / ".bin" / "pkg").symlink_to("../pkg/index.js")
    return root


def test_every_change_to_a_tree_is_named(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    recorded, prints = manifest(str(tree))
    assert changes(recorded, manifest(str(tree))[0]) == [] and digest(recorded) == digest(manifest(str(tree))[0])
    known = {path: (prints[path], entry) for path, entry in recorded.items()}
    index = tree / "node_modules" / "pkg" / "index.js"
    index.write_text("#!/usr/bin/env node\nfetch('https://evil.example')\n")
    (tree / "node_modules" / "pkg" / "extra.js").write_text("")
    (tree / "node_modules" / "pkg" / "package.json").chmod(0o644 | 0o002)  # made writable by anyone
    (tree / "node_modules" / ".bin" / "pkg").unlink()
    (tree / "node_modules" / ".bin" / "pkg").symlink_to("/tmp/elsewhere")
    now, _ = manifest(str(tree), known)  # what the record knows is taken only where nothing moved
    assert changes(recorded, now) == [
        "node_modules/.bin/pkg changed",
        "node_modules/pkg/extra.js added",
        "node_modules/pkg/index.js changed",
        "node_modules/pkg/package.json changed",
    ]
    assert digest(now) != digest(recorded)


def test_a_special_file_in_a_tree_is_refused(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    os.mkfifo(tree / "pipe")
    with pytest.raises(PackageError, match="not a file, directory or link"):
        manifest(str(tree))


def test_a_change_that_keeps_the_size_and_puts_the_times_back_is_still_read(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    recorded, prints = manifest(str(tree))
    known = {path: (prints[path], entry) for path, entry in recorded.items()}
    index = tree / "node_modules" / "pkg" / "index.js"
    before = index.stat()
    index.write_text("#!/usr/bin/env nodX\n")  # same size
    os.utime(index, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `touch -r` would
    assert changes(recorded, manifest(str(tree), known)[0]) == ["node_modules/pkg/index.js changed"]


def test_the_program_is_the_one_named_or_the_one_named_after_the_package(tmp_path: Path) -> None:
    tree = str(_tree(tmp_path / "t"))
    package = Package(Ecosystem.NPM, "pkg", "1.0.0")
    assert program_of(package, tree, None) == f"{tree}/node_modules/.bin/pkg"
    with pytest.raises(PackageError, match=r"has no program 'rm' \(it has: pkg, pkg-admin\)"):
        program_of(package, tree, "rm")
    with pytest.raises(PackageError, match="not a path"):
        program_of(package, tree, "../../../bin/sh")


@pytest.mark.jail
def test_an_install_script_reaches_neither_the_home_nor_anything_but_its_staging_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE-KEY-MATERIAL")
    outside = tmp_path / "outside"
    outside.mkdir()
    staging = tmp_path / "installs" / "srv" / "a1b2"
    (staging / "work").mkdir(parents=True)
    Path(tree_of(str(staging))).mkdir()
    # what a hostile postinstall does, run where npm's install step runs
    script = (
        f'cat "{home}/.ssh/id_rsa"; echo pwned > "{home}/.bashrc"; echo pwned > "{outside}/x"; '
        f'echo installed > "{tree_of(str(staging))}/marker"'
    )
    ((step, _),) = installer_steps(Package(Ecosystem.NPM, "pkg"), str(staging), "/usr/bin/npm", str(home), PY, "/x")
    assert step.network is Network.ALLOWLIST and step.read_write == (str(staging),)
    step = replace(step, egress_socket=None)  # the relay is not what this is about
    attack = ("/bin/sh", "-c", script)

    # control: the same script, run as npx would run it, gets everything
    plain = subprocess.run(attack, capture_output=True, text=True, check=False)
    assert "PRIVATE-KEY-MATERIAL" in plain.stdout and (home / ".bashrc").exists() and (outside / "x").exists()
    (home / ".bashrc").unlink()
    (outside / "x").unlink()
    (Path(tree_of(str(staging))) / "marker").unlink()

    jailed = run_plan(bwrap_plan(replace(step, argv=attack), [], check_bwrap()), 60)
    assert "PRIVATE-KEY-MATERIAL" not in jailed.stdout + jailed.stderr
    assert not (home / ".bashrc").exists() and not (outside / "x").exists()
    assert (Path(tree_of(str(staging))) / "marker").read_text() == "installed\n"  # its own tree it writes


@pytest.mark.jail
def test_an_install_script_reaches_neither_the_hosts_loopback_nor_its_abstract_sockets(tmp_path: Path) -> None:
    # what a desktop has there: X11 and D-Bus on abstract sockets, dev servers and databases on loopback
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    name = f"cellblock-test-{os.getpid()}"
    unix.bind("\0" + name)
    unix.listen()
    for listener in (tcp, unix):
        threading.Thread(target=_answer, args=(listener,), daemon=True).start()
    port = tcp.getsockname()[1]
    probe = (
        "import socket\n"
        f"for family, where in ((socket.AF_INET, ('127.0.0.1', {port})), (socket.AF_UNIX, '\\0{name}')):\n"
        "    s = socket.socket(family); s.settimeout(5)\n"
        "    try:\n"
        "        s.connect(where); print('reached', s.recv(5).decode())\n"
        "    except OSError as exc:\n"
        "        print('blocked', exc)\n"
    )
    staging = tmp_path / "staging"
    (staging / "work").mkdir(parents=True)
    ((step, _),) = installer_steps(Package(Ecosystem.NPM, "pkg"), str(staging), "/usr/bin/npm", str(tmp_path), PY, "/x")
    attack = replace(step, argv=("/usr/bin/python3", "-c", probe), egress_socket=None)

    # control: the same jail on the host's network, as an install had before, reaches both
    opened = run_plan(bwrap_plan(replace(attack, network=Network.OPEN), [], check_bwrap()), 60)
    assert opened.stdout.count("reached hello") == 2, opened.stdout + opened.stderr
    jailed = run_plan(bwrap_plan(attack, [], check_bwrap()), 60)
    assert "reached" not in jailed.stdout and jailed.stdout.count("blocked") == 2, jailed.stdout + jailed.stderr


def _answer(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.sendall(b"hello")


def test_a_program_that_leads_out_of_its_install_is_refused_and_nothing_outside_is_read(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    secret = tmp_path / "home" / ".ssh" / "id_rsa"
    secret.parent.mkdir(parents=True)
    secret.write_text("PRIVATE")
    secret.chmod(0o755)
    package = Package(Ecosystem.NPM, "pkg", "1.0.0")
    link = tree / "node_modules" / ".bin" / "pkg"
    link.unlink()
    link.symlink_to(secret)  # the jail would share each file a link passes through
    with pytest.raises(PackageError, match=r"leads out of its install, to .*id_rsa"):
        program_of(package, str(tree), None)
    # metadata read through a link out of the tree is not read: the package has no programs then
    manifest_file = tree / "node_modules" / "pkg" / "package.json"
    manifest_file.unlink()
    (tmp_path / "elsewhere.json").write_text('{"name": "pkg", "version": "9.9.9", "bin": "index.js"}')
    manifest_file.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(PackageError, match="leads out of its install"):
        program_of(package, str(tree), None)


def test_program_names_that_are_paths_are_no_programs(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "t")
    manifest_file = tree / "node_modules" / "pkg" / "package.json"
    manifest_file.write_text('{"name": "pkg", "version": "1.0.0", "bin": {"/bin/sh": "index.js", "../x": "index.js"}}')
    with pytest.raises(PackageError, match=r"it has: none"):
        program_of(Package(Ecosystem.NPM, "pkg", "1.0.0"), str(tree), None)


def test_a_tree_that_is_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    elsewhere = _tree(tmp_path / "project")  # say, the directory the install ran from
    (tmp_path / "staging").mkdir()
    (tmp_path / "staging" / "pkg").symlink_to(elsewhere)
    with pytest.raises(PackageError, match="not a directory of its own"):
        manifest(str(tmp_path / "staging" / "pkg"))


def test_sealing_leaves_the_tree_alone_with_no_link_out_and_no_set_id_bits(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    tree = _tree(staging / "pkg")
    (staging / "evil.sh").write_text("#!/bin/sh\n")  # what an installer left beside the tree
    (staging / "work").mkdir()
    tool = tree / "node_modules" / "pkg" / "tool"
    tool.write_text("")
    tool.chmod(0o4777)
    assert seal(str(staging), Ecosystem.NPM) == str(tree)
    assert sorted(os.listdir(staging)) == ["pkg"]
    assert oct(tool.stat().st_mode & 0o7777) == "0o755"
    (tree / "node_modules" / "pkg" / "index.js").unlink()
    (tree / "node_modules" / "pkg" / "index.js").symlink_to("../../../evil.sh")
    with pytest.raises(PackageError, match="link out of it"):
        seal(str(staging), Ecosystem.NPM)


@pytest.mark.parametrize(
    ("ecosystem", "tool", "flags"),
    [
        (Ecosystem.NPM, "/usr/bin/npm", ["--ignore-scripts"]),
        (Ecosystem.PYPI, "/usr/bin/uv", ["--only-binary", ":all:"]),
        (Ecosystem.PYPI, PY, ["--only-binary", ":all:"]),
    ],
)
def test_an_install_without_scripts_runs_no_package_code(
    tmp_path: Path, ecosystem: Ecosystem, tool: str, flags: list[str]
) -> None:
    package = Package(ecosystem, "pkg")
    *_, (plain, _) = installer_steps(package, str(tmp_path), tool, str(tmp_path), PY, "/x")
    *_, (bare, _) = installer_steps(package, str(tmp_path), tool, str(tmp_path), PY, "/x", scripts=False)
    argv = list(bare.argv)
    assert argv[argv.index(flags[0]) : argv.index(flags[0]) + len(flags)] == flags
    assert argv[-1] == package.spec() and flags[0] not in plain.argv


def test_the_installer_gets_install_env_but_never_in_place_of_what_it_sets_itself(tmp_path: Path) -> None:
    given = {"PUPPETEER_DOWNLOAD_BASE_URL": "http://192.0.2.9:8080/", "HOME": "/root", "PATH": "/evil"}
    ((step, _),) = installer_steps(
        Package(Ecosystem.NPM, "pkg"), str(tmp_path), "/usr/bin/npm", str(tmp_path), PY, "/x", given=given
    )
    assert step.env["PUPPETEER_DOWNLOAD_BASE_URL"] == "http://192.0.2.9:8080/"
    assert step.env["HOME"] == str(tmp_path / "work") and step.env["PATH"].startswith("/usr/bin:")
