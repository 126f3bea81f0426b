"""What no grant may be, whatever a trace says: the rules every path and program a proposal (or a
share) would add to a jail passes.

A scan's proposal and a learn trace's are built from what a server did, and the server chooses
what it does: it can make its jail refuse any path it likes, spelled as it likes. So each path and
program a proposal would add is judged here (when the proposal is made and again before `--apply`
writes it: `scan/vet.py`), and each host by `scan/gatehosts.py`.

A path is judged as the kernel saw it: absolute, with no `.` or `..` component (the kernel resolves
`missing/..` only where `missing` is, and `link/..` from where the link leads), no `~` or `${`
(which the config would expand), no control character; and both as written and as its links
resolve on the host, it is never `/`, the home or a directory above it, a secret or a directory
holding one (`~/.ssh`, `~/.aws`, the keyrings, `~/.git-credentials`, `~/.npmrc`, the cloud
clients' and the shells' histories: `HOME_SECRETS`, the session's sockets), nor Cellblock's own
directories, one inside them, or one holding them; nor any of these under another name (the
same device and inode: a bind mount; a directory holding, within two levels, what a home holds
secret: a backup of a home, another user's); nor a socket, a pipe or a device, or a directory
with one in it (read-only or not, a socket is connected to).

A path made writable (a new `read_write` entry, or one moved there from `read_only`) is besides
never a hidden entry (a name starting with `.`) or one inside one — where programs keep what they
run on their own: a shell's and a login's startup files, `~/.config` (autostart, user services),
`~/.local` (programs, Python's `.pth` files), a repository's `.git` (hooks) — nor a directory of
programs the user runs by name (each on `$PATH`, `~/bin`, macOS's `~/Library` of launch agents),
the system's (`/usr`, `/etc`, `/opt`, …) or cron's, inside or above, nor a folder that holds one
directly or is inside a virtualenv (a repository with its `.git`, `.envrc`, `.mcp.json`, a `bin`,
a virtualenv), nor a home's own `package.json`, `go.work`, `conftest.py`, ...: a server that may
write one of those runs code outside its jail (the rules of `policy/grantrules.py`, which wrap's
shares of missing paths read too).

No part of a path leads into a place a jail may write (a `read_write` grant of this server or of
another in the config), by its own spelling or through a link: a server that may write there can
put a link in place of what the path names once it is granted, and a grant follows links when
its jail is built, so `~/link-into-its-grant/x` granted read-only becomes `~/.ssh/id_rsa` at the
next start.

A program (`exec.allow`) is a file this machine has, that no other user could have put there or
replace: a file the server made in its jail's own `/tmp` or home, or in a scan's copy, is not the
host's file of that name.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import stat
from collections.abc import Sequence
from pathlib import Path

from cellblock.gateway.scan.findings import SECRET_PARTS
from cellblock.gateway.scan.scratch import ScanError, service
from cellblock.gateway.state import default_config_path, own_dirs, swappable
from cellblock.gateway.terminal import printable
from cellblock.policy.constraints import within
from cellblock.policy.grantrules import held_runner, hidden_part, home_tool_config, program_dirs
from cellblock.sandbox.sockets import host_sockets

__all__ = ["NotGrantable", "as_shown", "check_path", "check_program", "grantable_path"]

# Longest path and name the kernel takes (PATH_MAX, NAME_MAX): anything longer is no path it opened.
PATH_MAX = 4095
NAME_MAX = 255
SHOWN = 300  # characters of a refused entry a note shows
# Where a home keeps credentials besides SECRET_PARTS (which mark a secret anywhere): tokens of
# git, npm, PyPI, cloud and database clients, and the shells' histories, which hold what was typed.
HOME_SECRETS = (
    *(".git-credentials", ".npmrc", ".yarnrc.yml", ".pypirc", ".pgpass", ".my.cnf", ".vault-token"),
    *(".config/gcloud", ".azure", ".oci", ".terraform.d", ".cargo/credentials.toml", ".config/hub"),
    *(".bash_history", ".zsh_history", ".python_history", ".psql_history", ".mysql_history"),
)
LISTED = 10000  # entries of a directory looked at for a copy of a home


class NotGrantable(ScanError):
    """An entry a proposal must never add to a jail; the message says why."""


def check_path(path: str, own: Sequence[str | Path] = (), write: bool = False, writable: Sequence[str] = ()) -> None:
    """`path` may be granted (`write`: read_write): see the module's docstring. `own`: more of
    Cellblock's own files (the config file the proposal goes into); `writable`: the places jails
    may write (the config's `read_write` grants).

    Raises:
        NotGrantable: it may not, and why.
    """
    _check_spelling(path)
    if any(part in path or path.endswith(part.rstrip("/")) for part in SECRET_PARTS):
        raise NotGrantable(f"{as_shown(path)} looks like a secret")
    real = os.path.realpath(path)
    _check_no_service(path, real)
    for form in dict.fromkeys((path, real)):
        through = "" if form == path else f" (it leads to {as_shown(real)})"
        if form == "/":
            raise NotGrantable(f"{as_shown(path)} is the whole filesystem{through}")
        if any(within(home, form) for home in _homes()):
            raise NotGrantable(f"{as_shown(path)} is your home or holds it{through}")
        secret = next((s for s in _secrets() if within(s, form) or within(form, s)), None)
        if secret is not None:
            raise NotGrantable(f"{as_shown(path)} is or holds {secret}, a secret or a socket of your session{through}")
        mine = next((o for o in _own(own) if within(o, form) or within(form, o)), None)
        if mine is not None:
            raise NotGrantable(f"{as_shown(path)} is or holds {mine}, Cellblock's own{through}")
        if write:
            _check_writable(path, form, through)
    _check_other_names(path, real, own)
    _check_steerable(path, writable)


def _check_other_names(path: str, real: str, own: Sequence[str | Path]) -> None:
    """`real` is no home, secret or directory of Cellblock's own under another name: by what it
    is (device and inode), not the same directory as one or as one above one, nor inside a secret
    or Cellblock's own (a bind mount, a spelling the file system folds); and no copy of a home (a
    backup, a snapshot, another user's), which holds within two levels what a home holds secret."""
    kept = [*_secrets(), *_own(own)]
    above = _identities([at for k in [*_homes(), *kept] for at in (k, *map(str, Path(k).parents))])
    same = above.get(_identity(real) or (-1, -1))
    if same is not None:
        raise NotGrantable(f"{as_shown(path)} is {same}, or a directory holding it, under another name")
    inside = _identities(kept)
    for at in (real, *map(str, Path(real).parents)):
        found = inside.get(_identity(at) or (-1, -1))
        if found is not None:
            raise NotGrantable(f"{as_shown(path)} is inside {found} under another name ({as_shown(at)})")
    copied = _home_copy(real)
    if copied is not None:
        raise NotGrantable(
            f"{as_shown(path)} holds {as_shown(copied)}, a secret a home holds: it is a home under another name "
            "(a copy, a backup, another user's); grant what the server needs in it by hand"
        )


def _identity(path: str) -> tuple[int, int] | None:
    """What `path` is on the machine: its device and inode (None where there is nothing)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _identities(paths: Sequence[str]) -> dict[tuple[int, int], str]:
    found: dict[tuple[int, int], str] = {}
    for path in paths:
        identity = _identity(path)
        if identity is not None:
            found.setdefault(identity, path)
    return found


# What a home holds that is secret, relative to it (`SECRET_PARTS`, a file's name as its directory's)
_MARKS = tuple(
    dict.fromkeys(
        p.strip("/") if p.endswith("/") or p.count("/") == 1 else os.path.dirname(p).strip("/") for p in SECRET_PARTS
    )
)


def _home_copy(real: str) -> str | None:
    """What `real`, its entries or theirs hold that a home holds secret, if anything."""
    level = [real] if os.path.isdir(real) else []
    for _ in range(3):  # the directory, its entries, theirs
        for directory in level:
            found = next((m for m in _MARKS if os.path.lexists(os.path.join(directory, m))), None)
            if found is not None:
                return os.path.join(directory, found)
        deeper: list[str] = []
        for directory in level:
            with contextlib.suppress(OSError), os.scandir(directory) as entries:
                deeper += [e.path for e in itertools.islice(entries, LISTED) if e.is_dir(follow_symlinks=False)]
        level = deeper[:LISTED]
    return None


def _check_no_service(path: str, real: str) -> None:
    """Neither `real` nor an entry of it is a socket, a pipe or a device: granted, read-only or not,
    it lets the server talk to what is behind it (a database that trusts the user, a service). A
    directory that cannot be listed may hold one: it is not granted either."""
    found = [(path, service(real))]
    if os.path.isdir(real):
        try:
            with os.scandir(real) as entries:
                # every entry, by the kind its directory lists (no call for a file, a directory or a
                # link: a link in it leads, in the jail, where the jail shows); any other is looked at
                found += [(e.path, service(e.path)) for e in entries if not _plain(e)]
        except OSError as exc:
            raise NotGrantable(
                f"{as_shown(path)} cannot be listed ({exc.strerror}), so whether it holds a socket, a pipe or a "
                "device is not known; grant it by hand if the server needs it"
            ) from exc
    where, kind = next(((p, k) for p, k in found if k is not None), (path, None))
    if kind is not None:
        held = "" if where == path else f" holds {as_shown(where)}, which"
        raise NotGrantable(
            f"{as_shown(path)}{held} is {kind}: granted, read-only or not, it lets the server reach what is behind "
            "it (a service that trusts you); grant it by hand if the server needs it"
        )


def _plain(entry: os.DirEntry[str]) -> bool:
    """A file, a directory or a link, by what its directory says of it."""
    return entry.is_symlink() or entry.is_file(follow_symlinks=False) or entry.is_dir(follow_symlinks=False)


def _check_steerable(path: str, writable: Sequence[str]) -> None:
    places = list(dict.fromkeys([*writable, *map(os.path.realpath, writable)]))
    parts = path.split("/")
    for end in range(2, len(parts) + 1):
        prefix = "/".join(parts[:end])
        real = os.path.realpath(prefix)
        place = next((p for p in places if within(real, p)), None)
        if place is not None:
            how = "" if real == prefix else f" ({as_shown(prefix)} leads to {as_shown(real)})"
            raise NotGrantable(
                f"{as_shown(path)} leads into {place}{how}, where a jail may write: a server there can put a link "
                "in its place to any file of yours before the next start, and a grant follows links; grant what "
                "it leads to by hand if the server needs it"
            )


def _check_writable(path: str, form: str, through: str) -> None:
    hidden = hidden_part(form)
    if hidden is not None:
        raise NotGrantable(
            f"{as_shown(path)} is or is inside {as_shown(hidden)}{through}, a hidden entry: where programs keep what "
            "they run on their own (a shell's startup files, autostart, a repository's hooks), so a proposal "
            "never makes one writable; grant it read_write by hand if the server must write there"
        )
    runs = next((p for p in _programs() if within(p, form) or within(form, p)), None)
    if runs is not None:
        raise NotGrantable(
            f"{as_shown(path)} is or holds {runs}{through}, where programs are kept that run outside the jail, "
            "so a proposal never makes it writable; grant it read_write by hand if the server must write there"
        )
    held = home_tool_config(form, _homes()) or held_runner(form)
    if held is not None:
        raise NotGrantable(
            f"{as_shown(path)} is not made writable{through}: {as_shown(held)}, so a server that may write there "
            "runs code outside its jail; if you mean it to, share it for good in your config under "
            "servers.<server>.jail.read_write"
        )


def check_program(path: str) -> None:
    """`path` may be added to `exec.allow`: written as the kernel saw it, and no secret.

    Raises:
        NotGrantable: it may not, and why.
    """
    _check_spelling(path)
    real = os.path.realpath(path)
    if any(part in form for part in SECRET_PARTS for form in (path, real)):
        raise NotGrantable(f"{as_shown(path)} looks like a secret")
    try:
        info = os.stat(real)
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        raise NotGrantable(
            f"{as_shown(path)} is no program on this machine: what the server ran there was a file of its jail's "
            "own (its /tmp or home) or of a scan's copy, not the host's"
        )
    if info.st_uid not in (os.getuid(), 0):
        unsafe: str | None = f"it belongs to uid {info.st_uid}"
    elif info.st_mode & 0o022:
        unsafe = f"it is writable by others (mode {info.st_mode & 0o7777:o})"
    else:
        unsafe = swappable(Path(real))
    if unsafe is not None:
        raise NotGrantable(f"{as_shown(path)} could be another user's program: {unsafe}")


def _check_spelling(path: str) -> None:
    if not path.isprintable():
        raise NotGrantable(f"{as_shown(path)} holds a control character")
    if not path.startswith("/") or path.startswith("//") or "${" in path:
        raise NotGrantable(f"{as_shown(path)} is not an absolute path as the kernel saw it")
    parts = path.split("/")[1:]
    if ".." in parts:
        raise NotGrantable(
            f"{as_shown(path)} goes through '..', which the kernel resolves through what the jail shows; "
            "grant the path it means by hand if the server needs it"
        )
    if path != "/" and ("" in parts or "." in parts):
        raise NotGrantable(f"{as_shown(path)} is not written as one path (an empty or '.' part)")
    if len(path) > PATH_MAX or any(len(part) > NAME_MAX for part in parts):
        raise NotGrantable(f"{as_shown(path)} is longer than any path the kernel opens")


def grantable_path(named: str) -> str:
    """The path a grant would name for `named`, a path as the kernel was given it: the same
    without `.` parts, doubled or trailing slashes (which the kernel reads so too).

    Raises:
        NotGrantable: it goes through `..` or is not absolute.
    """
    if not named.startswith("/"):
        raise NotGrantable(f"{as_shown(named)} is not an absolute path as the kernel saw it")
    parts = [p for p in named.split("/") if p not in ("", ".")]
    path = "/" + "/".join(parts)
    _check_spelling(path)
    return path


def _homes() -> list[str]:
    homes = [os.path.expanduser("~")]
    with contextlib.suppress(KeyError):  # a uid without a passwd entry has only $HOME
        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    return list(dict.fromkeys([*homes, *map(os.path.realpath, homes)]))


def _secrets() -> list[str]:
    """What holds a secret of the user's: the secret files and directories of each home, and the
    sockets of the session and the machine that every jail hides (`sandbox/sockets.py`)."""
    parts = [*(p.strip("/") for p in SECRET_PARTS), *HOME_SECRETS]
    found = [os.path.join(home, part) for home in _homes() for part in parts]
    found += [s.path for s in host_sockets()]
    return list(dict.fromkeys([*found, *map(os.path.realpath, found)]))


def _programs() -> list[str]:
    """Where programs are kept that run outside the jail (`policy/grantrules.py`), as written and resolved."""
    found = program_dirs(_homes(), os.environ.get("PATH", ""))
    return list(dict.fromkeys([*found, *map(os.path.realpath, found)]))


def _own(extra: Sequence[str | Path]) -> list[str]:
    found = [str(p) for p in (*own_dirs(), default_config_path(), *extra)]
    return list(dict.fromkeys([*found, *map(os.path.realpath, found)]))


def as_shown(text: str) -> str:
    """`text` (a server's choice) as safe to print, and short enough to read."""
    return printable(text if len(text) <= SHOWN else text[:SHOWN] + "…")
