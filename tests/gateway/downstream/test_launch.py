"""launch_plan: the one place a server's jail is chosen, per platform and config."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.gateway.cli.probe import ESCAPE
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream import jailreport, jailspec
from cellblock.gateway.downstream.jailreport import tell_jail
from cellblock.gateway.downstream.jailspec import PIN, jail_spec
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.gateway.downstream.roots import granted_roots
from cellblock.sandbox import escape, moved, pin, scope, sockets
from cellblock.sandbox.marks import how_marked
from cellblock.sandbox.mounts import Mounts, mountinfo
from cellblock.sandbox.sockets import ABSTRACT_SCOPE_ABI, SCOPE, Bound, Moved, abstract_gap
from cellblock.sandbox.types import JailError, JailSpec, MountMode

NULL = "/dev/null in its place"


def server(jail: str = "") -> LocalServer:
    text = f"version: 1\nservers:\n  s:\n    command: {sys.executable}\n    env: {{A: b}}\n{jail}"
    config = parse_config(text)
    local = config.servers["s"]
    assert isinstance(local, LocalServer)
    return local


def test_jail_false_runs_the_command_itself_and_says_so() -> None:
    plan = launch_plan("s", server("    jail: false\n"))
    # in a cgroup or scope of its own that marks its processes, where this machine offers one
    assert plan.argv[-1:] == (sys.executable,) and (plan.argv == (sys.executable,)) == (how_marked() is None)
    assert plan.env["A"] == "b" and "PATH" not in plan.env  # the SDK adds only its allow-listed basics


def test_on_macos_the_plan_is_sandbox_exec_with_the_grants(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    shared = tmp_path / "shared"
    shared.mkdir()
    plan = launch_plan("s", server(f"    jail: {{read_only: ['{shared}']}}\n"), private=tmp_path / "private")
    assert plan.argv[:2] == ("/usr/bin/sandbox-exec", "-p") and plan.argv[-1] == sys.executable
    # macOS reaches /tmp through a symlink; the profile names the real /private/tmp path, as a -D parameter
    real = f"/private{shared}" if str(shared).startswith("/tmp/") else str(shared)
    defines = dict(plan.argv[i + 1].split("=", 1) for i in range(3, len(plan.argv) - 1, 2))
    assert all(plan.argv[i] == "-D" for i in range(3, len(plan.argv) - 1, 2))
    name = next(k for k, v in defines.items() if v == real)
    assert f'(subpath (param "{name}"))' in plan.argv[2] and real not in plan.argv[2]
    assert plan.env["TMPDIR"] == str(tmp_path / "private" / "tmp")
    # no cwd in the config: the server starts in its private temp dir, not the gateway's (often ~)
    assert plan.cwd == str(tmp_path / "private" / "tmp")


def test_on_macos_without_a_temp_dir_a_server_starts_in_its_grant_or_at_the_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert launch_plan("s", server("    jail: {tmp: false}\n")).cwd == "/"
    jail = f"    jail: {{tmp: false, read_only: ['{tmp_path}']}}\n"
    assert launch_plan("s", server(jail)).cwd == str(tmp_path)


def test_on_macos_exec_allow_lists_each_link_its_target_the_interpreter_and_sh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    script = tmp_path / "tool"
    script.write_text(f"#!{sys.executable}\n")
    script.chmod(0o755)
    link = tmp_path / "tool-link"
    link.symlink_to(script)
    plan = launch_plan("s", server(f"    jail: {{tmp: false, exec: {{allow: ['{link}']}}}}\n"))
    values = {plan.argv[i + 1].split("=", 1)[1] for i in range(3, len(plan.argv) - 1, 2)}
    real_python = str(Path(sys.executable).resolve())
    wanted = [str(link), str(script), real_python, "/bin/sh"]
    assert {f"/private{p}" if p.startswith("/tmp/") else p for p in wanted} <= values


@pytest.mark.parametrize(
    ("jail", "refusal"),
    [
        ("    jail: {network: allowlist, allow_hosts: [a.example]}\n", "allowlist is not available on macOS"),
        ("    jail: {exec: {sha256: {/bin/ls: " + "a" * 64 + "}}}\n", "sha256 is not available on macOS"),
    ],
)
def test_on_macos_what_has_no_seatbelt_form_yet_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, jail: str, refusal: str
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(JailError, match=refusal):
        launch_plan("s", server(jail), egress_socket=str(tmp_path / "e.sock"), private=tmp_path)


def test_on_windows_only_jail_false_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(JailError, match="set 'jail: false'"):
        launch_plan("s", server())
    assert launch_plan("s", server("    jail: false\n")).argv == (sys.executable,)


def test_an_allowlist_server_without_its_proxy_is_refused() -> None:
    with pytest.raises(JailError, match="egress proxy"):
        launch_plan("s", server("    jail: {network: allowlist, allow_hosts: [a.example]}\n"))


def local(body: dict[str, object]) -> LocalServer:
    parsed = LocalServer.model_validate(body)
    return parsed


def test_roots_are_the_users_grants_never_caches_cellblocks_own_or_the_servers_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    for variable, sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_STATE_HOME", ".local/state")):
        monkeypatch.setenv(variable, str(home / sub))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    work, notes = home / "projects", home / "notes"
    code = tmp_path / "opt" / "server"
    grants = {
        "work": work,
        "notes": notes,
        "cellblock cache": home / ".cache" / "cellblock" / "npm-files",  # what wrap gave npx servers
        "another cache": home / ".cache" / "uv",
        "npm's cache": home / ".npm" / "_npx",
        "state": tmp_path / "state" / "locks",
        "code": code,
    }
    for path in grants.values():
        path.mkdir(parents=True)
    (code / "index.js").write_text("// the server\n")
    server = local(
        {
            "command": sys.executable,
            "args": [str(code / "index.js"), str(work)],
            # the command's own virtualenv too: it holds what the server runs
            "jail": {
                "read_only": [str(notes), str(code), str(Path(sys.executable).parent.parent)],
                "read_write": [str(p) for p in grants.values()],
            },
        }
    )
    assert granted_roots(server) == sorted([str(notes), str(work)])
    assert granted_roots(local({"command": sys.executable, "jail": False})) == []


def test_roots_leave_out_code_named_relative_to_the_cwd_or_after_an_equals_and_installed_tools(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    relative, required, work = home / "proj", home / "lib", home / "work"
    tools = home / ".local" / "pipx" / "venvs" / "other"
    for directory in (relative / "dist", required, work, tools):
        directory.mkdir(parents=True)
    (relative / "dist" / "index.js").write_text("// the server\n")
    (required / "hook.js").write_text("// loaded first\n")
    server = local(
        {
            "command": sys.executable,
            "args": ["dist/index.js", f"--require={required / 'hook.js'}"],
            "cwd": str(relative),
            "jail": {"read_only": [str(relative), str(required), str(tools)], "read_write": [str(work)]},
        }
    )
    assert granted_roots(server) == [str(work)]


def test_a_grant_of_or_inside_what_cellblock_keeps_from_servers_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    state, run, cache = home / "state", tmp_path / "run", home / ".cache" / "cellblock"
    audit = tmp_path / "logs" / "audit.jsonl"
    for directory in (state / "catalogs", run / "bus", cache / "npm-s", audit.parent):
        directory.mkdir(parents=True)
    audit.touch()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    (tmp_path / "via").symlink_to(state)
    refused = {
        str(state / "catalogs"): f"is inside {state}",
        str(tmp_path / "via"): f"is {state}",  # through a symlink too
        str(run / "bus"): f"is inside {run}",  # the session's runtime dir: D-Bus, the keyring
        str(audit): f"is {audit}",  # an audit log outside the state dir, named by the config
        str(cache): "is Cellblock's cache, which holds every server's package cache",
    }
    for path, reason in refused.items():
        jail = f"    jail: {{read_write: ['{path}']}}\n"
        with pytest.raises(JailError, match=f"server 's': jail.read_write path {path} {reason}"):
            launch_plan("s", server(jail), own=(audit,))
    # a server's own package cache inside Cellblock's is the usual grant for npx and uvx
    plan = launch_plan("s", server(f"    jail: {{read_write: ['{cache / 'npm-s'}']}}\n"), own=(audit,))
    assert any(m.path == str(cache / "npm-s") for m in plan.mounts)


def test_a_grant_that_is_what_cellblock_keeps_from_servers_under_a_mounts_name_is_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A bind mount shows a directory under a second name: a grant of it (or of a place inside it) is
    refused as the directory's own name is, not shown empty. The mounts are the host's, with binds
    added as /etc/fstab would make them."""
    home = tmp_path / "home"
    state, run, cache, work = home / "state", tmp_path / "run", home / ".cache" / "cellblock", tmp_path / "work"
    for directory in (state / "catalogs", run / "bus", cache / "npm-s", work):
        directory.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    host = mountinfo()
    tree = Mounts(host)
    binds = {"alias": state, "part": state / "catalogs", "above": tmp_path, "stash": cache, "desk": work}
    added = []
    for n, (name, source) in enumerate(binds.items()):
        (tmp_path / name).mkdir()
        where, on = tree.where(str(source)), tree.at(str(tmp_path / name))
        assert where is not None and on is not None
        added.append(replace(on, root=where[1], point=str(tmp_path / name), id=1_000_000 + n, parent=on.id))
    monkeypatch.setattr(Mounts, "read", classmethod(lambda _: Mounts([*host, *added])))
    refused = {
        "alias": f"is {state} under another name: Cellblock's own",
        "alias/catalogs": f"is inside {state} under another name: Cellblock's own",
        "part": f"is inside {state} under another name",  # a mount of a directory inside it
        "above/run": f"is {run} under another name: your session's runtime directory",
        "stash": f"is Cellblock's cache under another name ({cache}), which holds every server's package cache",
    }
    for grant, reason in refused.items():
        path = tmp_path / grant
        with pytest.raises(JailError, match=re.escape(f"server 's': jail.read_only path {path} {reason}")):
            plan_of(path)
    # as a grant of the directory by its own name: a server's cache inside Cellblock's, a parent
    # (which shows them hidden), an ordinary directory are granted
    for grant in ("stash/npm-s", "above", "desk"):
        assert plan_of(tmp_path / grant).read_only == (str(tmp_path / grant),)


def plan_of(grant: Path) -> JailSpec:
    config = server(f"    jail: {{read_only: ['{grant}']}}\n")
    assert config.jail is not False
    return jail_spec("s", config, config.jail)[0]


def test_a_server_whose_grants_take_too_long_to_look_through_for_a_moved_socket_does_not_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A listing that does not answer (a network mount) holds the search of the grants, never the
    start: past the deadline the server is refused, naming the grant and the socket. The control:
    the same start, the listing answering, within the deadline."""
    grant = tmp_path / "grant"
    (grant / "nfs").mkdir(parents=True)
    where = Mounts.read().where(str(grant))
    assert where is not None
    monkeypatch.setattr(
        jailspec, "bound_sockets", lambda: Bound(elsewhere=(Moved("/tmp/ssh-Ab12/agent.1", where[0], 1),))
    )
    let_go = threading.Event()
    scandir = os.scandir

    def held(path: Any) -> Any:
        if str(path) == str(grant / "nfs"):
            let_go.wait(60)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", held)
    monkeypatch.setattr(moved, "SEARCH_SECONDS", 0.05)
    try:
        with pytest.raises(JailError) as refused:
            plan_of(grant)
    finally:
        let_go.set()
        for thread in threading.enumerate():
            if thread.name == "cellblock-socket-search":
                thread.join(60)
    assert str(refused.value).startswith(
        f"server 's': jail grant {grant} could hold the file of the socket bound at '/tmp/ssh-Ab12/agent.1'"
    )
    monkeypatch.setattr(moved, "SEARCH_SECONDS", 10.0)
    assert plan_of(grant).read_only == (str(grant),)


def test_an_allowed_program_a_writable_grant_holds_is_refused_unless_its_bytes_are_pinned(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    tool = work / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\n")
    tool.chmod(0o755)

    def spec(jail: dict[str, object]) -> tuple[str, ...]:
        config = local({"command": sys.executable, "jail": {"exec": {"allow": [str(tool)]}} | jail})
        assert config.jail is not False
        return jail_spec("s", config, config.jail)[0].exec_allow

    with pytest.raises(JailError, match=f"exec.allow program {tool} is inside the read_write grant {work}"):
        spec({"read_write": [str(work)]})
    # read-only, or pinned by its digest, it is what the server runs
    assert str(tool) in spec({"read_only": [str(work)]})
    pin = {str(tool): hashlib.sha256(tool.read_bytes()).hexdigest()}
    assert str(tool) in spec({"read_write": [str(work)], "exec": {"allow": [str(tool)], "sha256": pin}})


def test_the_scripts_run_in_a_jail_are_the_sandbox_modules() -> None:
    """The pin and scope launchers and the escape probe are mounted into jails by path: a moved module must move it."""
    assert Path(pin.__file__).resolve() == PIN
    assert Path(scope.__file__).resolve() == Path(SCOPE)
    assert Path(escape.__file__).resolve().parent == ESCAPE


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory standing for /tmp, short enough for sockets, with what a session keeps there: an
    ssh-agent's socket (named by SSH_AUTH_SOCK), a bus dbus-launch made (named by nothing) and a
    database's socket in a project; each listening."""
    with tempfile.TemporaryDirectory(prefix="cb-launch-", dir="/tmp") as directory:
        root = Path(directory)
        for sub in ("ssh-Ab12", "proj"):
            (root / sub).mkdir()
        paths = [root / "ssh-Ab12" / "agent.7", root / "dbus-Q9x", root / "proj" / ".s.PGSQL.5432"]
        with contextlib.ExitStack() as listening:
            for path in paths:
                sock = listening.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
                sock.bind(str(path))
                sock.listen(1)
            monkeypatch.setenv("SSH_AUTH_SOCK", str(paths[0]))
            yield root


def test_the_sockets_a_grant_holds_are_each_shown_as_dev_null_named_and_told(
    session: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    link = tmp_path / "link"
    link.symlink_to(session)
    plan = launch_plan("s", server(f"    jail: {{read_only: ['{session}', '{link}']}}\n"))
    hidden = {m.path: m.why for m in plan.mounts if m.mode is MountMode.HIDDEN}
    agent, bus, database = (str(session / p) for p in ("ssh-Ab12/agent.7", "dbus-Q9x", "proj/.s.PGSQL.5432"))
    assert hidden[agent] == f"an ssh-agent's socket, which signs with your SSH keys (SSH_AUTH_SOCK): {NULL}"
    assert hidden[bus].startswith("a D-Bus bus, which reaches the keyring") and hidden[bus].endswith(NULL)
    assert hidden[database] == f"a Unix socket a program on this machine listens on: {NULL}"
    # also where the grant through a symlink shows it
    assert f"{link}/ssh-Ab12/agent.7" in hidden
    # bound over each, after the grant that shows it
    args = list(plan.argv)
    grant = next(i for i in range(len(args) - 2) if args[i : i + 3] == ["--ro-bind", str(session), str(session)])
    masked = next(i for i in range(len(args) - 2) if args[i : i + 3] == ["--dev-bind", "/dev/null", agent])
    assert grant < masked
    # and the log says so at the first start
    with caplog.at_level(logging.WARNING, logger="cellblock.gateway.downstream.jailreport"):
        tell_jail("s", plan)
    assert "server 's': its jail keeps from it what its grants hold: " in caplog.text
    assert f"{agent} (an ssh-agent's socket" in caplog.text and f"{database} (a Unix socket" in caplog.text


def test_a_grant_of_a_socket_or_a_directory_of_them_is_refused_naming_what_it_is(
    session: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = session / "ssh-Ab12" / "agent.7"
    stale = session / "stale.sock"  # a socket file nothing listens on any more: in no list
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(stale))
    displays = session / "X11-unix"
    displays.mkdir()
    monkeypatch.setattr(sockets, "SOCKET_DIRS", ((str(displays), "X11's sockets"),))
    refused = {
        str(agent): f"is {agent}: an ssh-agent's socket, which signs with your SSH keys (SSH_AUTH_SOCK), which "
        "Cellblock keeps from every server; remove it from jail.read_only",
        str(stale): f"is {stale}: a Unix socket, a way into the program that listens on it, which Cellblock keeps "
        "from every server; remove it from jail.read_only",
        str(
            displays
        ): f"is {displays}: X11's sockets, which Cellblock keeps from every server; grant another directory",
    }
    for path, reason in refused.items():
        with pytest.raises(JailError) as refusal:
            launch_plan("s", server(f"    jail: {{read_only: ['{path}']}}\n"))
        assert str(refusal.value) == f"server 's': jail.read_only path {path} {reason}"


def test_every_jail_starts_in_the_abstract_socket_scope_or_an_open_one_says_it_cannot(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A jail on the host's network reaches the host's abstract sockets by name; any other one
    through a socket made on the host's network and handed to it: every jail is scoped."""
    config = server("    jail: {network: open}\n")
    closed = server("    jail: {network: none}\n")
    allowlist = server("    jail: {network: allowlist, allow_hosts: [example.com]}\n")
    assert config.jail is not False and closed.jail is not False and allowlist.jail is not False
    monkeypatch.setattr(jailspec, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI)
    monkeypatch.setattr(jailreport, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI)
    python = os.path.realpath(sys.executable)
    scoped = (python, "-I", "-S", SCOPE, "--")
    for local in (config, closed):
        assert local.jail is not False
        spec, mounts = jail_spec("s", local, local.jail)
        assert spec.argv == (*scoped, sys.executable) and not spec.gaps
        assert any(m.path == SCOPE for m in mounts)
    # outermost: the egress relay runs in the domain too
    spec, _ = jail_spec("s", allowlist, allowlist.jail, egress_socket="/run/egress.sock")
    assert spec.argv[:5] == scoped and "relay.py" in spec.argv[8] and spec.argv[-1] == sys.executable
    # where the kernel has no such scope: no launcher, and said in show, doctor and the start log
    monkeypatch.setattr(jailspec, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI - 1)
    monkeypatch.setattr(jailreport, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI - 1)
    spec, mounts = jail_spec("s", config, config.jail)
    assert spec.argv == (sys.executable,) and not any(m.path == SCOPE for m in mounts)
    assert spec.gaps == (abstract_gap("s", ABSTRACT_SCOPE_ABI - 1),)
    assert "abstract Unix socket" in spec.gaps[0] and "use network: allowlist or none" in spec.gaps[0]
    with caplog.at_level(logging.WARNING, logger="cellblock.gateway.downstream.jailreport"):
        tell_jail("s", launch_plan("s", config))
    assert spec.gaps[0] in caplog.text
    # a jail of its own network reaches none by name: no gap to say
    assert jail_spec("s", closed, closed.jail)[0].gaps == ()


def test_on_macos_a_socket_a_grant_holds_is_denied_in_the_profile(
    session: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    plan = launch_plan("s", server(f"    jail: {{read_only: ['{session}'], network: open}}\n"), private=tmp_path)
    defines = dict(plan.argv[i + 1].split("=", 1) for i in range(3, len(plan.argv) - 1, 2) if plan.argv[i] == "-D")
    hidden = {v for k, v in defines.items() if k.startswith("HIDDEN_")}
    agent = f"/private{session}/ssh-Ab12/agent.7"  # /tmp is /private/tmp there
    assert agent in hidden
    name = next(k for k, v in defines.items() if v == agent)
    assert f'(literal (param "{name}"))' in plan.argv[2]
    assert SCOPE not in plan.argv  # macOS has no abstract sockets: its network rules refuse every Unix socket


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [2, 16])
async def test_servers_starting_together_plan_their_jails_on_at_most_one_thread_per_core(
    monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    """Sixteen plans at once take `PLANNED_AT_ONCE` worker threads (2 here), the others wait for
    one, rather than a thread each that then stays, idle, with its memory; the control, with a
    limit of 16, takes one per server."""
    import anyio
    import anyio.from_thread

    from cellblock.gateway.downstream import launch

    at_once, most, release, full = [0], [0], threading.Event(), anyio.Event()
    lock = threading.Lock()

    def plan() -> Any:
        with lock:
            at_once[0] += 1
            most[0] = max(most[0], at_once[0])
            if at_once[0] == limit:
                anyio.from_thread.run_sync(full.set)
        release.wait(10)  # held until the test has looked
        with lock:
            at_once[0] -= 1
        return None

    monkeypatch.setattr(launch, "PLANNED_AT_ONCE", limit)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(launch.plan_off_loop, plan)
            await full.wait()
            await anyio.wait_all_tasks_blocked()  # every other plan is waiting for a thread by now
            waiting = launch._planning.get().statistics().tasks_waiting
            release.set()
    assert (most[0], waiting) == (limit, 16 - limit)
