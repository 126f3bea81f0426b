"""Attempts to run programs: one named outright, a copy run through the dynamic loader, one in memory."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence

from .attempt import Attempt, error_label, never_raises

__all__ = ["EXEC_TIMEOUT", "LOADERS", "exec_binary", "load_copy", "memfd_exec"]

EXEC_TIMEOUT = 5.0  # seconds for an exec'd binary to finish; still running counts as having run


@never_raises("exec")
def exec_binary(argv: Sequence[str], timeout: float = EXEC_TIMEOUT, pass_fds: Sequence[int] = ()) -> Attempt:
    """Try to run `argv`. Through if it ran: exit status 0, output on stdout, or still running at the deadline."""
    argv = [str(a) for a in argv]
    target = argv[0] if argv else ""
    if not argv:
        return Attempt("exec", target, False, "empty argv")
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False, pass_fds=pass_fds
        )
    except subprocess.TimeoutExpired:
        return Attempt("exec", target, True, f"still running after {timeout:g}s (killed)")
    except OSError as exc:
        return Attempt("exec", target, False, f"exec: {error_label(exc)}")
    # stderr does not count: a loader or interpreter that refuses to run the target says so there
    ran = proc.returncode == 0 or len(proc.stdout) > 0
    detail = f"exit status {proc.returncode}, {len(proc.stdout)} bytes on stdout, {len(proc.stderr)} on stderr"
    return Attempt("exec", target, ran, detail)


# The dynamic loaders of the machines the jail runs on, first that exists wins.
LOADERS = (
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/ld-linux-armhf.so.3",
    "/lib/ld-linux.so.2",
)


def _copy(source: str, target: str) -> None:
    with open(source, "rb") as src, open(target, "wb") as dst:
        dst.write(src.read())
    os.chmod(target, 0o755)


@never_raises("load_copy")
def load_copy(target: str, source: str) -> Attempt:
    """Copy the program `source` to `target` and run it through the dynamic loader. Through if it ran."""
    loader = next((path for path in LOADERS if os.path.exists(path)), None)
    if loader is None:
        return Attempt("load_copy", target, False, "no dynamic loader here")
    try:
        _copy(source, target)
    except OSError as exc:
        return Attempt("load_copy", target, False, f"could not copy {source}: {error_label(exc)}")
    try:
        outcome = exec_binary([loader, target])
    finally:
        with contextlib.suppress(OSError):
            os.unlink(target)
    return Attempt("load_copy", target, outcome.got_through, f"{loader} {target}: {outcome.detail}")


@never_raises("memfd_exec")
def memfd_exec(source: str) -> Attempt:
    """Copy the program `source` into a memfd and execute it from there. Through if it ran."""
    try:
        fd = os.memfd_create("cellblock-probe", 0)
    except OSError as exc:
        return Attempt("memfd_exec", source, False, f"memfd_create: {error_label(exc)}")
    try:
        with open(source, "rb") as src:
            os.write(fd, src.read())
        outcome = exec_binary([f"/proc/self/fd/{fd}"], pass_fds=(fd,))
    except OSError as exc:
        return Attempt("memfd_exec", source, False, f"could not copy {source}: {error_label(exc)}")
    finally:
        os.close(fd)
    return Attempt("memfd_exec", source, outcome.got_through, outcome.detail)
