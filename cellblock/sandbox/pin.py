"""Inside a jail: allow only the listed executables to be executed, then start the server.

Run as ``python3 -I -S pin.py --allow PATH [--allow PATH ...] -- ARGV...`` by the gateway's
interpreter inside the jail. It restricts `execve` with Landlock to the listed files, plus what
each needs to start (the ELF loader named in its program header, the interpreter named on a
``#!`` line), then replaces itself with ARGV. Reading and writing are left to the jail's mounts;
Landlock here handles only execution, so everything not listed fails with EACCES, including
files the server writes itself.

Standard library only: it runs inside the jail, with nothing but the interpreter mounted.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import sys

__all__ = ["ELF_MAGIC", "SHEBANG_BYTES", "exec_closure", "is_elf", "main", "restrict_exec", "shebang"]

# Landlock system call numbers: the same on x86-64 and aarch64 (the generic syscall table).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
ACCESS_FS_EXECUTE = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
# How deep to follow "#!" interpreters and loaders; real chains are one or two long.
MAX_DEPTH = 4
ELF_MAGIC = b"\x7fELF"
# How much of a file the kernel reads for its "#!" line (BINPRM_BUF_SIZE since Linux 5.1).
SHEBANG_BYTES = 256


def _say(text: str) -> None:
    sys.stderr.write(f"cellblock-pin: {text}\n")


def _elf_interpreter(path: str) -> str | None:
    """The PT_INTERP (program loader) of a little-endian ELF file, if it names one."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:4] != ELF_MAGIC or head[5] != 1:
                return None
            wide = head[4] == 2
            # e_phoff, e_phentsize, e_phnum; then p_type, p_offset, p_filesz in each program header
            if wide:
                (phoff,), (size, count) = struct.unpack_from("<Q", head, 32), struct.unpack_from("<HH", head, 54)
            else:
                (phoff,), (size, count) = struct.unpack_from("<I", head, 28), struct.unpack_from("<HH", head, 42)
            for index in range(count):
                handle.seek(phoff + index * size)
                entry = handle.read(size)
                if struct.unpack_from("<I", entry, 0)[0] != 3:  # PT_INTERP
                    continue
                if wide:
                    offset, length = struct.unpack_from("<Q", entry, 8)[0], struct.unpack_from("<Q", entry, 32)[0]
                else:
                    offset, length = struct.unpack_from("<I", entry, 4)[0], struct.unpack_from("<I", entry, 16)[0]
                handle.seek(offset)
                return handle.read(min(length, 4096)).rstrip(b"\x00").decode()
    except (OSError, struct.error, UnicodeDecodeError, IndexError):
        return None
    return None


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


def exec_closure(paths: list[str]) -> list[str]:
    """`paths` plus what executing each one also executes: its ELF loader, its `#!` interpreter."""
    found: dict[str, None] = {}
    todo = [(p, 0) for p in paths]
    while todo:
        path, depth = todo.pop(0)
        if path in found or depth > MAX_DEPTH:
            continue
        found[path] = None
        words = shebang(path)
        for needed in (_elf_interpreter(path), words[0] if words else None):
            if needed:
                todo.append((needed, depth + 1))
    return list(found)


def _syscall(number: int, *args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(number, *args)
    if result < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return int(result)


def restrict_exec(allowed: list[str]) -> None:
    """Allow `execve` of exactly `allowed` (files) for this process and all it starts.

    Raises:
        OSError: Landlock is missing (kernel before 5.13, or disabled) or a path cannot be opened.
    """
    _syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    attr = struct.pack("<Q", ACCESS_FS_EXECUTE)  # handled_access_fs: only execution is governed
    ruleset = _syscall(SYS_CREATE_RULESET, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    try:
        for path in allowed:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("<Qi", ACCESS_FS_EXECUTE, fd)  # packed landlock_path_beneath_attr
                _syscall(
                    SYS_ADD_RULE,
                    ctypes.c_int(ruleset),
                    ctypes.c_int(RULE_PATH_BENEATH),
                    ctypes.c_char_p(rule),
                    ctypes.c_uint32(0),
                )
            finally:
                os.close(fd)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)


def main(argv: list[str]) -> int:
    if "--" not in argv:
        _say("usage: pin.py --allow PATH [...] -- ARGV...")
        return 2
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    allowed = [options[i + 1] for i, word in enumerate(options[:-1]) if word == "--allow"]
    if not command or not allowed:
        _say("nothing to run, or no executable allowed")
        return 2
    try:
        restrict_exec(exec_closure(allowed))
    except OSError as exc:
        _say(f"cannot restrict execution (Landlock): {exc}; the server is not started")
        return 126
    try:
        os.execv(command[0], command)
    except OSError as exc:
        _say(f"cannot start {command[0]}: {exc}")
        return 127
    return 0  # not reached: execv replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
