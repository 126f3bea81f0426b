"""The directories a server is told it may work in when it asks for roots (`granted_roots`)."""

from __future__ import annotations

import contextlib
import os

from platformdirs import user_cache_dir

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.jailspec import JAIL_PATH, server_command
from cellblock.gateway.state import own_dirs
from cellblock.policy.constraints import within
from cellblock.sandbox.launchers import launcher_mounts
from cellblock.sandbox.types import JailError

__all__ = ["PACKAGE_CACHES", "granted_roots"]

# Where launchers keep the packages they fetch and the tools they install, under the home (besides
# the cache home): what servers run from, never a place for their work.
PACKAGE_CACHES = (
    *(".npm", ".bun", ".yarn", ".pnpm-store", ".local/share/pnpm", ".local/share/uv", ".cargo", ".rustup"),
    *(".local/pipx", ".local/lib", ".local/share/fnm", ".nvm", ".fnm", ".volta", ".asdf", ".pyenv", "go/pkg"),
    *(".m2", ".gradle"),
)


def granted_roots(server: LocalServer) -> list[str]:
    """The directories a server is told it may work in when it asks for roots: what its jail was
    granted (`read_only`, `read_write`), minus every grant that is not the user's work — one inside
    a package cache or a directory of Cellblock's own, or one holding the server's own code (its
    command's installation, a script its arguments name) — so it never offers the model a way to
    change the code it runs or Cellblock's state."""
    if server.jail is False:
        return []
    home = os.path.expanduser("~")
    caches = [user_cache_dir(), *(os.path.join(home, c) for c in PACKAGE_CACHES)]
    not_work = [os.path.realpath(p) for p in [*map(str, own_dirs()), *caches]]
    # what the command line names: a script, `--require=FILE`, relative to the server's cwd
    named = [part for arg in [server.command or "", *server.args] for part in (arg, arg.partition("=")[2]) if part]
    cwd = server.cwd or os.getcwd()
    code = [os.path.realpath(os.path.join(cwd, a)) for a in named if os.path.isfile(os.path.join(cwd, a))]
    # (an installed package's tree is in Cellblock's data directory, which is no one's work)
    with contextlib.suppress(JailError):  # a command that cannot be found holds no grant either
        command = server_command(server, None, os.environ.get("PATH", JAIL_PATH)) if server.install is None else ""
        mounts = launcher_mounts(command, home, os.environ.get("PATH", JAIL_PATH)) if command else []
        code += [os.path.realpath(m.path) for m in mounts]
    roots = []
    for path in sorted({*server.jail.read_only, *server.jail.read_write}):
        real = os.path.realpath(path)
        if not any(within(real, other) for other in not_work) and not any(within(c, real) for c in code):
            roots.append(path)
    return roots
