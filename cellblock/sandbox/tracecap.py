"""The writer of a learn trace: strace's output, read from a pipe, written to a file no one else
can read, stripped of what may hold a secret, and cut at a size.

Run by strace itself (`strace -o '|…'`) as `python -I -S tracecap.py FILE BYTES`: stdlib only.

- The file is created 0600, never over an existing one or through a symlink.
- What is kept of each line is what a learn proposal needs (the call, its paths, its addresses,
  its result): a program's arguments (`execve`'s list: bwrap's `--setenv NAME VALUE` among them)
  become `[...]`, and the bytes of what is sent or received on a socket become `""`, except a
  query sent to a name server's port 53 (the name looked up is what it says). strace prints no
  environment without `-v`.
- After BYTES the file gets one last line saying it was cut, and the rest is read and dropped,
  so that strace never waits on a full pipe (nor dies of a closed one, taking the jail with it).
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["main", "redact"]

CUT = b"# cellblock: the trace was cut here at its size limit\n"
_EXEC = re.compile(rb"\bexecve(?:at)?\(")
_SOCKET = re.compile(rb"\b(?:sendto|sendmsg|sendmmsg|recvfrom|recvmsg|recvmmsg)(?:\(| resumed>)")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"(?:\.\.\.)?')


def _argv_end(line: bytes, start: int) -> int:
    """Where the bracketed list that opens at `start` ends (after its `]`), strings skipped."""
    depth, at, quoted = 0, start, False
    while at < len(line):
        char = line[at : at + 1]
        if quoted:
            if char == b"\\":
                at += 1
            elif char == b'"':
                quoted = False
        elif char == b'"':
            quoted = True
        elif char == b"[":
            depth += 1
        elif char == b"]":
            depth -= 1
            if depth == 0:
                return at + 1
        at += 1
    return len(line)


def redact(line: bytes) -> bytes:
    """`line` without a program's arguments or a socket's bytes (a DNS query's excepted)."""
    found = _EXEC.search(line)
    if found is not None:
        bracket = line.find(b"[", found.end())
        if bracket != -1:
            line = line[:bracket] + b"[...]" + line[_argv_end(line, bracket) :]
        return line
    found = _SOCKET.search(line)
    if found is not None and b"htons(53)" not in line:
        head, rest = line[: found.end()], line[found.end() :]
        return head + _STRING.sub(b'""', rest)
    return line


def main(argv: list[str]) -> int:
    path, limit = argv[1], int(argv[2])
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    written, source = 0, sys.stdin.buffer
    try:
        for line in source:
            if written > limit:
                continue
            kept = redact(line)
            if written + len(kept) > limit:
                kept, written = CUT, limit + 1
            else:
                written += len(kept)
            os.write(fd, kept)
    finally:
        os.close(fd)
    return 0


if __name__ == "__main__":
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # what strace passes on to the jail is not ours to hold
    sys.exit(main(sys.argv))
