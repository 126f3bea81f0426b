"""Inside a jail: make what may run the only thing that can, then start the server.

Run by the gateway's interpreter inside the jail, isolated (``python3 -I -S``)::

    pin.py --allow PATH ... --exec PATH ... --seccomp FILE -- ARGV...

Before it replaces itself with ARGV it:

1. enters a user and mount namespace of its own (bwrap's mounts are out of reach of any process in
   the jail; in its own namespace they are locked as they are, and may only be restricted further);
2. remounts every mount `noexec`, except those holding an ``--exec`` path (the allowed programs,
   their loaders and libraries, the server's own installation): a file the server writes (in
   `/tmp`, its home, a granted directory), the gateway's own interpreter, any other file, cannot
   be mapped executable, so not even the dynamic loader (``ld.so /tmp/x``) can run it;
3. drops every capability it had in that namespace (bounding set included) and locks the
   securebits, then checks that none is left;
4. restricts `execve` with Landlock to the ``--allow`` files;
5. installs the seccomp filter in FILE (the jail's filter, plus `memfd_create`: a file made in
   memory is on no mount, so nothing above would stop running one).

Any step that fails stops here: the server is not started. Everything it imports is imported at
the top, before step 2 makes the interpreter's own files unmappable.

Standard library only: it runs inside the jail, with nothing but the interpreter mounted.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import stat
import struct
import sys

__all__ = [
    "ELF_MAGIC",
    "SHEBANG_BYTES",
    "drop_capabilities",
    "install_seccomp",
    "is_elf",
    "landlock_ruleset",
    "landlock_version",
    "main",
    "restrict_exec",
    "restrict_self",
    "shebang",
]

# Landlock system call numbers: the same on x86-64 and aarch64 (the generic syscall table).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
ACCESS_FS_EXECUTE = 1
# What a rule on a file (not a directory) may allow: execute, write, read, truncate, device ioctl.
ACCESS_FS_FILE = 0x1 | 0x2 | 0x4 | (1 << 14) | (1 << 15)
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
# seccomp(2) itself, for a filter with a listener: its number per machine, and its operation and flag
SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER = 1, 1 << 3
# once the gateway has read a call, a signal to the caller no longer fails it (EINTR) while the
# gateway is making it: it would be told the call failed after it was made (Linux 5.19)
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
# SECBIT_NOROOT, its lock, SECBIT_NO_CAP_AMBIENT_RAISE and its lock: uid 0 gains nothing at execve
SECUREBITS = 0x01 | 0x02 | 0x40 | 0x80
CAPABILITY_VERSION_3 = 0x20080522
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_REMOUNT, MS_BIND, MS_NOEXEC = 0x20, 0x1000, 0x8
# statvfs flag -> mount flag: a remount must repeat every flag the mount has (locked ones above all)
MOUNT_FLAGS = ((0x1, 0x1), (0x2, 0x2), (0x4, 0x4), (0x8, 0x8), (0x10, 0x10), (0x400, 0x400), (0x800, 0x800))
ST_RELATIME, MS_RELATIME = 0x1000, 1 << 21
ELF_MAGIC = b"\x7fELF"
# How much of a file the kernel reads for its "#!" line (BINPRM_BUF_SIZE since Linux 5.1).
SHEBANG_BYTES = 256
_LIBC = ctypes.CDLL(None, use_errno=True)


def _say(text: str) -> None:
    sys.stderr.write(f"cellblock-pin: {text}\n")


def _head(path: str, size: int) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError:
        return None


def is_elf(path: str) -> bool:
    """Whether `path` is an ELF file (a program the kernel loads itself, not a script)."""
    head = _head(path, len(ELF_MAGIC))
    return head == ELF_MAGIC


def shebang(path: str) -> list[str] | None:
    """The interpreter `path`'s ``#!`` line names and its one optional argument, read as Linux reads them.

    None when the file has no ``#!`` line the kernel would run: none at all, no interpreter name, or
    a name cut off by the 256 bytes the kernel reads. The argument is one string, as the kernel
    passes it (``#!/usr/bin/env -S node --flag`` gives ``["/usr/bin/env", "-S node --flag"]``).
    """
    head = _head(path, SHEBANG_BYTES)
    if head is None or not head.startswith(b"#!"):
        return None
    line, newline, _ = head[2:].partition(b"\n")
    found = re.match(rb"[ \t]*([^ \t\0]+)([ \t\0]?)", line)
    if found is None:
        return None
    name, stop = found.groups()
    if not stop and not newline and len(head) == SHEBANG_BYTES:
        return None  # the name runs past what the kernel reads: it refuses to guess the rest
    # the argument is a C string to the kernel: a NUL ends it, and a NUL right after the name means none
    argument = b"" if stop == b"\0" else line[found.end() :].partition(b"\0")[0].strip(b" \t")
    return [os.fsdecode(name), os.fsdecode(argument)] if argument else [os.fsdecode(name)]


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return int(result)


def _syscall(number: int, *args: object) -> int:
    return _check(_LIBC.syscall(number, *args), f"system call {number}")


def own_namespaces() -> None:
    """Enter a user and mount namespace of this process's own, as the same uid and gid.

    Mapping uid 0 needs CAP_SETFCAP in the jail, which has no capabilities: when the jail runs as
    root (a gateway run as root) the uid is left unmapped, so the server sees itself, and files,
    as the overflow uid (65534); what it may do is decided by its real uid all the same.

    Raises:
        OSError: the kernel refuses (no user namespaces, or the jail refused them).
    """
    uid, gid = os.getuid(), os.getgid()
    _check(_LIBC.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    if uid != 0:
        _write("/proc/self/uid_map", f"{uid} {uid} 1")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as handle:
        fields = [line.split(" ")[4] for line in handle]
    # the kernel escapes space, tab, newline and backslash as octal
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f) for f in fields]


def _holder(path: str, points: list[str]) -> str:
    """The mount point of the mount `path` is on: the longest one above it."""
    real = os.path.realpath(path)
    return max((p for p in points if real == p or real.startswith(p.rstrip("/") + "/")), key=len, default="/")


def forbid_exec(keep: list[str]) -> list[str]:
    """Remount `noexec` every mount but those holding a path in `keep`; return the mount points kept.

    Raises:
        OSError: a mount cannot be remounted.
    """
    points = _mount_points()
    kept = {_holder(path, points) for path in keep}
    for point in dict.fromkeys(points):
        if point in kept:
            continue
        info = os.statvfs(point)
        flags = sum(ms for st, ms in MOUNT_FLAGS if info.f_flag & st) | (
            MS_RELATIME if info.f_flag & ST_RELATIME else 0
        )
        _check(_LIBC.mount(None, point.encode(), None, MS_REMOUNT | MS_BIND | flags | MS_NOEXEC, None), point)
    return sorted(kept)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


def drop_capabilities() -> None:
    """Drop every capability, the bounding and ambient sets included, and check that none is left.

    Raises:
        OSError: a capability is still held afterwards, or the kernel refused a step.
    """
    _check(_LIBC.prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0), "securebits")
    _check(_LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient capabilities")
    with open("/proc/sys/kernel/cap_last_cap") as handle:
        last = int(handle.read())
    for cap in range(last + 1):
        _check(_LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"bounding capability {cap}")
    header, data = _CapHeader(CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    _check(_LIBC.capset(ctypes.byref(header), data), "capset")
    with open("/proc/self/status") as handle:
        held = [line for line in handle if line.startswith("Cap") and line.split()[1].strip("0")]
    if held:
        raise OSError(f"capabilities still held: {' '.join(h.split(':')[0] for h in held)}")


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install_seccomp(program: bytes, listener: bool = False) -> int:
    """Install a compiled seccomp BPF program (8 bytes an instruction) for this process and all it
    starts. With `listener`, return the descriptor its notifications are read and answered on
    (a program with a user-notification action needs one); else -1.

    Raises:
        OSError: the kernel refused it.
    """
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if not listener:
        _check(_LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")
        return -1
    number = SYS_SECCOMP.get(os.uname().machine)
    if number is None:
        raise OSError(f"no seccomp system call number is known for {os.uname().machine}")
    try:
        flags = SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV
        return _syscall(number, SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(fprog))
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # EINVAL: a kernel before 5.19, which waits interruptibly
            raise
    return _syscall(number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, ctypes.byref(fprog))


def landlock_version() -> int:
    """The kernel's Landlock ABI version, or 0 where Landlock is missing (or disabled)."""
    version = _LIBC.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return max(int(version), 0)


def landlock_ruleset(fs: int, rules: list[tuple[str, int]], net: int = 0, scoped: int = 0) -> int:
    """A Landlock ruleset that handles the file rights `fs`, the network rights `net` and the scopes
    `scoped`, allowing each (path, rights) of `rules` beneath that path (a file: its file rights
    only); its descriptor, for `restrict_self`.

    Raises:
        OSError: Landlock is missing (kernel before 5.13, or disabled), it does not know a right
            asked for, or a path cannot be opened.
    """
    _syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    # struct landlock_ruleset_attr, cut after its last field in use: a kernel older than a field
    # refuses a struct that long, even with the field zero
    attr = struct.pack("<QQQ", fs, net, scoped)[: 24 if scoped else 16 if net else 8]
    ruleset = _syscall(SYS_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    try:
        for path, access in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                allowed = access if stat.S_ISDIR(os.fstat(fd).st_mode) else access & ACCESS_FS_FILE
                rule = struct.pack("<Qi", allowed, fd)  # packed landlock_path_beneath_attr
                _check(
                    _LIBC.syscall(
                        SYS_ADD_RULE,
                        ctypes.c_int(ruleset),
                        ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.c_char_p(rule),
                        ctypes.c_uint32(0),
                    ),
                    f"a Landlock rule for {path}",
                )
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def restrict_self(ruleset: int) -> None:
    """Enter the Landlock domain of `ruleset` (and close it): this thread and all it starts from now on.

    Raises:
        OSError: the kernel refused.
    """
    try:
        _check(_LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


def restrict_exec(allowed: list[str]) -> None:
    """Allow `execve` of exactly `allowed` (files) for this process and all it starts.

    Raises:
        OSError: Landlock is missing (kernel before 5.13, or disabled) or a path cannot be opened.
    """
    # handled_access_fs: only execution is governed
    restrict_self(landlock_ruleset(ACCESS_FS_EXECUTE, [(path, ACCESS_FS_EXECUTE) for path in allowed]))


def _values(options: list[str], flag: str) -> list[str]:
    return [options[i + 1] for i, word in enumerate(options[:-1]) if word == flag]


def main(argv: list[str]) -> int:
    if "--" not in argv:
        _say("usage: pin.py --allow PATH [...] --exec PATH [...] --seccomp FILE -- ARGV...")
        return 2
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    allowed, keep, seccomp = _values(options, "--allow"), _values(options, "--exec"), _values(options, "--seccomp")
    if not command or not allowed or len(seccomp) != 1:
        _say("nothing to run, no executable allowed, or not one seccomp filter")
        return 2
    try:
        with open(seccomp[0], "rb") as handle:
            program = handle.read()
        own_namespaces()
        forbid_exec(keep)
        drop_capabilities()
        restrict_exec(allowed)
        install_seccomp(program)
    except OSError as exc:
        _say(f"cannot lock the jail down for exec.allow: {exc}; the server is not started")
        return 126
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _say(f"cannot start {command[0]}: {exc}")
        return 127
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
