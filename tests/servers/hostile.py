"""Hostile: a downstream MCP server whose tools try to break out of its jail.

Run as ``python tests/servers/hostile.py [--escape PATH]``. It speaks stdio and serves both
protocol eras on one `Server`, like probe.py. Each tool runs one attempt from
``cellblock/sandbox/escape/`` and returns the `Attempt` as structured content
(``name``, ``target``, ``got_through``, ``detail``) plus one line of text; a tool never fails
because the jail stopped it.

The attempts are loaded as a package from their folder (found relative to this one, or
``--escape``), not through the cellblock package, so a jail only has to mount the sandbox
directory. It is not put on sys.path: that directory's ``types.py`` would shadow the standard
library's.
"""

import argparse
import importlib.util
import os
import socket
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPDeprecationWarning
from pydantic import BaseModel

ESCAPE = Path(__file__).resolve().parent.parent.parent / "cellblock" / "sandbox" / "escape"
ESCAPE_MODULE = "cellblock_escape_attempts"  # a name no package import can collide with


def load_escape(path: Path | str = ESCAPE) -> ModuleType:
    """Import the escape attempts from the folder `path` as a standalone package (once per process).

    Raises:
        ImportError: no escape attempts at `path`.
    """
    if ESCAPE_MODULE in sys.modules:
        return sys.modules[ESCAPE_MODULE]
    folder = Path(path)
    spec = importlib.util.spec_from_file_location(
        ESCAPE_MODULE, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load escape attempts from {path}; pass --escape PATH of cellblock/sandbox/escape")
    module = importlib.util.module_from_spec(spec)
    sys.modules[ESCAPE_MODULE] = module  # dataclasses looks its module up while building Attempt
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[ESCAPE_MODULE]
        raise
    return module


class AttemptOut(BaseModel):
    name: str
    target: str
    got_through: bool
    detail: str
    amount: int | None = None


Result = Annotated[types.CallToolResult, AttemptOut]


def _result(attempt: Any) -> types.CallToolResult:
    """An escape.Attempt as a tool result: structured content and its one-line summary."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=attempt.line())],
        structured_content=attempt.to_dict(),
    )


# --- tools -----------------------------------------------------------------------------


def read_file(path: str) -> Result:
    """Try to read a byte of `path`."""
    return _result(load_escape().read_file(path))


def list_dir(path: str, expect: list[str]) -> Result:
    """Try to list `path`; through if a name in `expect` shows (any entry if `expect` is empty)."""
    return _result(load_escape().list_dir(path, expect))


def write_file(path: str, text: str = "cellblock hostile server was here\n") -> Result:
    """Try to create `path` (removed again) or open an existing file at `path` for writing (left
    unchanged); `$VAR` in it is the server's own (`$TMPDIR`: its tmp, wherever its jail puts it)."""
    return _result(load_escape().write_file(os.path.expandvars(path), text))


def connect(host: str, port: int) -> Result:
    """Try a TCP connection to `host`:`port`."""
    return _result(load_escape().connect(host, port))


def resolve(name: str) -> Result:
    """Try to resolve a DNS name."""
    return _result(load_escape().resolve(name))


def exec_binary(argv: list[str]) -> Result:
    """Try to run `argv`; through on exit status 0 or any output."""
    return _result(load_escape().exec_binary(argv))


def dbus(address: str = "", abstract: list[str] | None = None) -> Result:
    """Try to connect to D-Bus: `address`, /run/user/<uid>/bus, the system bus, and `abstract` socket names."""
    return _result(load_escape().dbus(address, abstract or ()))


def host_processes(pid: int) -> Result:
    """Look in /proc for the host's process `pid`, or for many processes outside this session."""
    return _result(load_escape().host_processes(pid))


def privileges(ro_path: str) -> Result:
    """Check CapEff, try unshare(CLONE_NEWUSER), and try remounting the read-only `ro_path` read-write."""
    return _result(load_escape().privileges(ro_path))


def keyring(description: str, rings: list[int] | None = None) -> Result:
    """Try to read the "user" key `description` from the user's kernel keyrings, linking `rings` (serials)
    besides those /proc/keys lists (only its size is reported)."""
    return _result(load_escape().keyring(description, rings or ()))


def fork_bomb(ceiling: int = 1000, hold: float = 0) -> Result:
    """Fork children that sleep, up to `ceiling`; with `hold` they stay that many seconds (at most 120)."""
    return _result(load_escape().fork_bomb(ceiling, hold))


def memory_hog(mib: int, step: int = 64) -> Result:
    """Allocate and touch `mib` MiB, `step` MiB at a time, then free it."""
    return _result(load_escape().memory_hog(mib, step))


def tmpfs_hog(mib: int, places: list[str]) -> Result:
    """Write `mib` MiB of files into the directories `places`, each until it is full, then remove them."""
    return _result(load_escape().tmpfs_hog(mib, places))


def tmpfs_files(count: int, places: list[str]) -> Result:
    """Make `count` empty files in the directories `places`, each until it takes no more, then remove them."""
    return _result(load_escape().tmpfs_files(count, places))


def drop_and_run(path: str, text: str) -> Result:
    """Write `text` to `path` as an executable file, try to run it, and remove it again."""
    import os

    try:
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o755)
    except OSError as exc:
        return _result(load_escape().Attempt("drop_and_run", path, False, f"could not write: {exc.strerror}"))
    try:
        return _result(load_escape().exec_binary([path]))
    finally:
        os.unlink(path)


def control_socket(path: str) -> Result:
    """Ask the gateway's control socket at `path` for `ps` (a server that can may approve its own calls)."""
    return _result(load_escape().control_socket(path))


def sysctl(path: str) -> Result:
    """Write the sysctl at `path` its own value back (nothing changes if it gets through)."""
    return _result(load_escape().sysctl(path))


def load_copy(target: str, source: str) -> Result:
    """Copy the program `source` to `target` and run the copy through the dynamic loader."""
    return _result(load_escape().load_copy(target, source))


def memfd_exec(source: str) -> Result:
    """Copy the program `source` into a memfd and execute it from /proc/self/fd."""
    return _result(load_escape().memfd_exec(source))


def unix_socket(target: str, send: str = "") -> Result:
    """Connect to the Unix socket `target` (a path, or @name for an abstract one), send `send`, read the answer."""
    return _result(load_escape().unix_socket(target, send))


def ssh_agent(target: str) -> Result:
    """Ask the ssh-agent at `target` (a path, or @name) for the keys it holds."""
    return _result(load_escape().ssh_agent(target))


def lend(path: str) -> threading.Thread:
    """Listen at `path` (a server made it after the others started: no jail hides it) and hand
    whoever connects first a Unix socket made here, on this process's network (the host's, for a
    `network: open` jail), then wait until it is done with it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def hand() -> None:
        with listener, listener.accept()[0] as conn, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as made:
            socket.send_fds(conn, [b"s"], [made.fileno()])
            conn.recv(1)

    thread = threading.Thread(target=hand, daemon=True)
    thread.start()
    return thread


def lend_socket(path: str) -> Result:
    """Listen at `path` and hand a Unix socket made on this jail's network to the first who connects."""
    escape = load_escape()
    try:
        lend(path)
    except OSError as exc:
        return _result(escape.Attempt("lend", path, False, f"bind: {escape.attempt.error_label(exc)}"))
    return _result(escape.Attempt("lend", path, True, "listening; hands a socket made here to the first who connects"))


def borrowed_socket(path: str, target: str) -> Result:
    """Take the socket another server lends at `path` and connect it to the abstract socket `target`
    (@name), which is looked up on the network the socket was made on, not this jail's."""
    escape = load_escape()
    stage = "borrow"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(path)
            _, fds, _, _ = socket.recv_fds(conn, 1, 1)
            with socket.socket(fileno=fds[0]) as lent:
                stage = "connect"
                lent.settimeout(10)
                lent.connect("\0" + target.removeprefix("@"))
                answer = lent.recv(64)
    except (OSError, IndexError) as exc:
        label = escape.attempt.error_label(exc) if isinstance(exc, OSError) else "no socket was handed over"
        return _result(escape.Attempt("borrowed", target, False, f"{stage}: {label}"))
    detail = f"connected through the socket lent at {path}; it answered {len(answer)} byte(s)"
    return _result(escape.Attempt("borrowed", target, True, detail, len(answer)))


def secret_service(address: str, looking_for: str) -> Result:
    """Read every secret the Secret Service on the D-Bus bus at `address` holds, as the keyring's
    own clients do; through if `looking_for` is among them (only counts are reported)."""
    from jeepney import DBusErrorResponse
    from jeepney.io.blocking import open_dbus_connection
    from secretstorage import get_all_collections
    from secretstorage.exceptions import SecretStorageException

    escape = load_escape()
    try:
        with open_dbus_connection(bus=address) as connection:
            secrets = [item.get_secret() for c in get_all_collections(connection) for item in c.get_all_items()]
    except (OSError, DBusErrorResponse, SecretStorageException) as exc:
        label = escape.attempt.error_label(exc)
        return _result(escape.Attempt("secret_service", address, False, f"connect: {label}"))
    found = looking_for.encode() in secrets
    detail = f"read {len(secrets)} secret(s){', the one looked for among them' if found else ''}"
    return _result(escape.Attempt("secret_service", address, found, detail, len(secrets)))


TOOLS = (
    read_file,
    list_dir,
    write_file,
    connect,
    resolve,
    exec_binary,
    dbus,
    host_processes,
    privileges,
    keyring,
    drop_and_run,
    load_copy,
    memfd_exec,
    unix_socket,
    ssh_agent,
    secret_service,
    lend_socket,
    borrowed_socket,
    sysctl,
    fork_bomb,
    memory_hog,
    tmpfs_hog,
    tmpfs_files,
    control_socket,
)


def build_server(name: str = "hostile") -> MCPServer:
    server = MCPServer(name, version="0.1.0", instructions="Tries to escape its jail; every tool reports.")
    for fn in TOOLS:
        server.add_tool(fn)
    return server


async def serve(server: MCPServer) -> None:
    lowlevel = server._lowlevel_server
    options = lowlevel.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="hostile")
    parser.add_argument("--escape", default=str(ESCAPE), help="path of cellblock/sandbox/escape")
    args = parser.parse_args(argv)
    load_escape(args.escape)  # fail at start, not on the first call
    warnings.simplefilter("ignore", MCPDeprecationWarning)
    anyio.run(serve, build_server(args.name))


if __name__ == "__main__":
    main()
