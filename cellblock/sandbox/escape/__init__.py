"""Escape attempts: the one list of things a jailed server must not be able to do.

Each attempt is a function that tries one thing and returns an `Attempt` saying whether it got
through; none of them raises. `cellblock probe` and the hostile-server tests both run this list.

This folder is also run as a script inside a jail, by whatever ``python3`` the jail mounts
(`__main__.py`), so its modules import the standard library and each other only (relative imports:
no cellblock, no mcp) and keep to Python 3.8 syntax at runtime:

    python3 escape --json '[{"kind": "read", "target": "/root/.ssh/id_ed25519"}]'
    python3 escape --json - < spec.json

It prints one JSON list of results to stdout and exits 1 if anything got through, 0 if nothing
did, 2 on a bad spec. Kinds and their fields (``target`` is always a string):

- ``read``: target=path. Through if any byte was read.
- ``list``: target=dir, ``expect``=[names]. Through if a listed entry is expected (any entry if empty).
- ``write``: target=path, optional ``text``. Through if a new file was created (then removed) or an
  existing one opened for writing (left unchanged).
- ``connect``: target="host:port" (``[::1]:80`` for IPv6). Through if a TCP connection was made.
- ``resolve``: target=name. Through if it resolved to any address.
- ``exec``: ``argv``=[...] (target defaults to argv[0]). Through if it ran: exit 0 or any output on stdout.
- ``control``: target=the path of a gateway's control socket. Through if it answered a request
  (``ps``, with the token from ``control-<pid>.token`` beside the socket when that can be read, as
  the CLI sends it) with ``ok``: a server that can do that can approve its own calls.
- ``sysctl``: target=a file under /proc/sys. Through if its own value could be written back (uid 0
  may write sysctls without a capability; ``kernel.core_pattern`` runs a program as host root).
- ``load_copy``: target=a writable path, ``source``=a program. Copies the program there and runs the
  copy through the dynamic loader (``ld.so TARGET``), which maps it rather than executing it.
  Through if it ran.
- ``memfd_exec``: target=a program. Copies it into a memfd and executes ``/proc/self/fd/N``.
  Through if it ran.
- ``dbus``: target=D-Bus address or socket path ("" for the defaults), optional ``abstract``=[names].
  Through if any candidate socket accepted a connection.
- ``unix``: target=a Unix socket's path, or ``@name`` for an abstract one, optional ``send``=text.
  Through if it accepted a connection; ``amount`` is the bytes it answered.
- ``ssh_agent``: target=an ssh-agent's socket (path or ``@name``). Asks for the keys it holds.
  Through if it answered; ``amount`` is how many keys it listed.
- ``processes``: optional ``pid``. Through if /proc shows that PID or too many foreign sessions.
- ``capabilities``: through if CapEff is non-zero.
- ``userns``: through if unshare(CLONE_NEWUSER) succeeds (tried in a forked child).
- ``remount``: target=a read-only path. Through if mount(MS_REMOUNT|MS_BIND) makes it rw (tried in a
  forked child, in a private mount namespace when it can make one).
- ``privileges``: target=a read-only path: ``capabilities``, ``userns`` and ``remount`` in one result.
- ``keyring``: target=the description of a "user" key in the user's kernel keyrings, optional
  ``rings``=[serials of keyrings to link, besides those /proc/keys lists]. Through if any byte of
  its payload was read (tried in a forked child, in a session keyring of its own).
- ``fork``: optional ``ceiling`` (forks at most, default 1000) and ``hold`` (seconds the children
  stay, default 0: they exit as the attempt ends). Through if all ``ceiling`` children were made.
- ``memory``: ``mib`` (to allocate and touch) and optional ``step`` (MiB at a time, default 64).
  Through if all of it was had; it is freed again at the end.
- ``tmpfs``: ``mib`` and ``places``=[directories]. Writes files of that many MiB in all into each
  place in turn until it is full (a jail's /tmp, home and /dev/shm are memory). Through if all of it
  was written; removed again at the end.
- ``tmpfs_files``: ``count`` and ``places``=[directories]. Makes that many empty files in all in each
  place in turn until it takes no more (each costs the kernel an inode and a name). Through if all
  were made; removed again at the end.

Reported details carry sizes, counts and error names, never the bytes of what was read;
``amount`` is what an attempt got when that is a quantity (processes made, MiB had).

A caller that wants the attempts themselves without the cellblock package loads the folder as a
package by its path (`importlib.util.spec_from_file_location` of `__init__.py`, with
``submodule_search_locations``), as `__main__.py` does.
"""

from __future__ import annotations

from .attempt import Attempt
from .files import host_processes, list_dir, read_file, write_file
from .hogs import fork_bomb, memory_hog, tmpfs_files, tmpfs_hog
from .network import connect, control_socket, dbus, resolve, ssh_agent, unix_socket
from .privileges import (
    KEYCTL_SYSCALL,
    capabilities,
    keyring,
    listed_keys,
    new_user_namespace,
    privileges,
    remount_rw,
    sysctl,
)
from .programs import exec_binary, load_copy, memfd_exec
from .spec import KINDS, main, run_spec

__all__ = [
    "KEYCTL_SYSCALL",
    "KINDS",
    "Attempt",
    "capabilities",
    "connect",
    "control_socket",
    "dbus",
    "exec_binary",
    "fork_bomb",
    "host_processes",
    "keyring",
    "list_dir",
    "listed_keys",
    "load_copy",
    "main",
    "memfd_exec",
    "memory_hog",
    "new_user_namespace",
    "privileges",
    "read_file",
    "remount_rw",
    "resolve",
    "run_spec",
    "ssh_agent",
    "sysctl",
    "tmpfs_files",
    "tmpfs_hog",
    "unix_socket",
    "write_file",
]
