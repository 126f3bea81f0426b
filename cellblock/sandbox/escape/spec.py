"""Escape attempts run from a JSON spec, which is checked whole before anything runs.

``escape --json SPEC`` (``-`` reads stdin) prints one JSON list of results to stdout and exits 1 if
anything got through, 0 if nothing did, 2 on a bad spec.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .attempt import Attempt
from .files import WRITE_TEXT, host_processes, list_dir, read_file, write_file
from .hogs import FORK_CEILING, MEMORY_STEP, fork_bomb, memory_hog, tmpfs_files, tmpfs_hog
from .network import connect, control_socket, dbus, host_port, resolve, ssh_agent, unix_socket
from .privileges import capabilities, keyring, new_user_namespace, privileges, remount_rw, sysctl
from .programs import exec_binary, load_copy, memfd_exec

__all__ = ["KINDS", "main", "run_spec"]


def _strs(entry: dict[str, Any], key: str) -> list[str]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key!r} must be a list of strings (got {value!r})")
    return value


def _pid(entry: dict[str, Any]) -> int | None:
    value = entry.get("pid")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"'pid' must be an integer (got {value!r})")
    return value


def _number(entry: dict[str, Any], key: str, default: float) -> float:
    value = entry.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key!r} must be a number of at least 0 (got {value!r})")
    return value


def _text(entry: dict[str, Any]) -> str:
    value = entry.get("text", WRITE_TEXT)
    if not isinstance(value, str):
        raise ValueError(f"'text' must be a string (got {value!r})")
    return value


KINDS = (
    "read",
    "list",
    "write",
    "connect",
    "resolve",
    "exec",
    "dbus",
    "processes",
    "capabilities",
    "userns",
    "remount",
    "privileges",
    "keyring",
    "load_copy",
    "memfd_exec",
    "fork",
    "memory",
    "tmpfs",
    "tmpfs_files",
    "sysctl",
    "control",
    "unix",
    "ssh_agent",
)
_NEEDS_TARGET = frozenset(
    {
        *("read", "list", "write", "connect", "resolve", "remount", "privileges", "keyring"),
        *("load_copy", "memfd_exec", "sysctl", "control", "unix", "ssh_agent"),
    }
)


def _bind(kind: str, entry: dict[str, Any]) -> Callable[[], Attempt]:
    """The attempt one spec entry describes, ready to run.

    Raises:
        ValueError: the entry lacks a field its kind needs, or a field has the wrong type.
    """
    target = entry.get("target", "")
    if not isinstance(target, str) or (kind in _NEEDS_TARGET and not target):
        raise ValueError(f"{kind!r} needs 'target' as a non-empty string (got {target!r})")
    if kind == "read":
        return lambda: read_file(target)
    if kind == "list":
        expect = _strs(entry, "expect")
        return lambda: list_dir(target, expect)
    if kind == "write":
        text, keep = _text(entry), entry.get("keep") is True
        return lambda: write_file(target, text, keep)
    if kind == "connect":
        host, port = host_port(target)
        return lambda: connect(host, port)
    if kind == "resolve":
        return lambda: resolve(target)
    if kind == "exec":
        argv = _strs(entry, "argv")
        if not argv:
            raise ValueError("'exec' needs 'argv' as a non-empty list of strings")
        return lambda: exec_binary(argv)
    if kind == "dbus":
        abstract = _strs(entry, "abstract")
        return lambda: dbus(target, abstract)
    if kind == "unix":
        send = entry.get("send", "")
        if not isinstance(send, str):
            raise ValueError(f"'send' must be a string (got {send!r})")
        return lambda: unix_socket(target, send)
    if kind == "ssh_agent":
        return lambda: ssh_agent(target)
    if kind == "processes":
        pid = _pid(entry)
        return lambda: host_processes(pid)
    if kind == "capabilities":
        return capabilities
    if kind == "userns":
        return new_user_namespace
    if kind == "remount":
        return lambda: remount_rw(target)
    if kind == "privileges":
        return lambda: privileges(target)
    if kind == "keyring":
        rings = entry.get("rings", [])
        if not isinstance(rings, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in rings):
            raise ValueError(f"'rings' must be a list of key serials (got {rings!r})")
        return lambda: keyring(target, rings)
    if kind == "load_copy":
        source = entry.get("source")
        if not isinstance(source, str) or not source:
            raise ValueError("'load_copy' needs 'source' as a non-empty string (a program to copy)")
        return lambda: load_copy(target, source)
    if kind == "memfd_exec":
        return lambda: memfd_exec(target)
    if kind == "sysctl":
        return lambda: sysctl(target)
    if kind == "control":
        return lambda: control_socket(target)
    if kind == "fork":
        ceiling, hold = int(_number(entry, "ceiling", FORK_CEILING)), _number(entry, "hold", 0)
        return lambda: fork_bomb(ceiling, hold)
    if kind == "memory":
        mib, step = int(_number(entry, "mib", 0)), int(_number(entry, "step", MEMORY_STEP)) or MEMORY_STEP
        return lambda: memory_hog(mib, step)
    if kind == "tmpfs":
        mib, places = int(_number(entry, "mib", 0)), _strs(entry, "places")
        return lambda: tmpfs_hog(mib, places)
    if kind == "tmpfs_files":
        count, places = int(_number(entry, "count", 0)), _strs(entry, "places")
        return lambda: tmpfs_files(count, places)
    raise ValueError(f"unknown kind {kind!r}; known kinds: {', '.join(KINDS)}")


def _plan(spec: Any) -> list[Callable[[], Attempt]]:
    """Check a whole spec before anything runs.

    Raises:
        ValueError: the spec is not a list of ``{"kind": ..., ...}`` objects of known kinds with
            the fields their kind needs.
    """
    if not isinstance(spec, list):
        raise ValueError(f"spec must be a JSON list of attempts (got {type(spec).__name__})")
    plan: list[Callable[[], Attempt]] = []
    for i, entry in enumerate(spec):
        if not isinstance(entry, dict):
            raise ValueError(f"attempt {i} must be an object (got {entry!r})")
        try:
            plan.append(_bind(str(entry.get("kind")), entry))
        except ValueError as exc:
            raise ValueError(f"attempt {i}: {exc}") from exc
    return plan


def run_spec(spec: Any) -> list[Attempt]:
    """Run every attempt a JSON-shaped spec describes, in order.

    Raises:
        ValueError: the spec is malformed (nothing has run).
    """
    return [thunk() for thunk in _plan(spec)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: run ``--json SPEC`` (``-`` reads stdin), print the results, return 1 if anything got through."""
    parser = argparse.ArgumentParser(prog="escape", description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, metavar="SPEC", help="JSON list of attempts, or - for stdin")
    args = parser.parse_args(argv)
    try:
        spec = json.loads(sys.stdin.read() if args.json == "-" else args.json)
        results = run_spec(spec)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        print(f"escape: bad spec: {exc}", file=sys.stderr)
        return 2
    json.dump([r.to_dict() for r in results], sys.stdout)
    sys.stdout.write("\n")
    for r in results:
        print(f"escape: {r.line()}", file=sys.stderr)
    return 1 if any(r.got_through for r in results) else 0
