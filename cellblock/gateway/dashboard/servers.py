"""What the dashboard's Servers row tells of one server beyond `cellblock ps`'s line: its lock, its
jail, its package, and the last lines it wrote to stderr while it is failed or restarting, each
as text from a `ps` reply's server (`serve/details.py`), escaped (`visible`).

A `ps` reply relays a server's own strings (its stderr, a path it was granted by name): none of it
is trusted here, whatever its type; what is not of the expected shape is left out.
"""

from __future__ import annotations

from typing import Any

from cellblock.policy.text import visible
from cellblock.sandbox.limits import size

__all__ = ["jail_lines", "lock_text", "package_text", "server_details", "stderr_lines"]

# as many lines as the gateway keeps (`downstream/stderr.py`'s TAIL_LINES), each as long (LINE_CHARS)
TAIL_LINES, LINE_CHARS = 20, 300


def server_details(server: dict[str, Any]) -> dict[str, Any]:
    """The keys the page shows in a server's details, every string escaped."""
    return {
        "start": visible(str(server.get("start", ""))),
        "lock": lock_text(server.get("lock")),
        "jail_lines": jail_lines(server.get("jail_detail")),
        "package": package_text(server.get("package")),
        "stderr": stderr_lines(server.get("stderr")),
    }


def stderr_lines(lines: Any) -> list[str]:
    """The last lines, at most `TAIL_LINES`, each cut (the gateway cuts them already; a reply is
    not trusted to)."""
    if not isinstance(lines, list):
        return []
    kept = [line for line in lines if isinstance(line, str)][-TAIL_LINES:]
    return [visible(line if len(line) <= LINE_CHARS else f"{line[: LINE_CHARS - 1]}…") for line in kept]


def lock_text(lock: Any) -> str:
    """The lock's status in a few words: `approved (sha256 …, N items)`, `held: first contact …`."""
    if not isinstance(lock, dict):
        return "unknown"
    status = lock.get("status")
    digest = f"sha256 {lock['hash']}, " if isinstance(lock.get("hash"), str) else ""
    items = lock.get("items") if isinstance(lock.get("items"), int) else "?"
    if status == "approved":
        return visible(f"approved ({digest}{items} item(s))")
    if status == "held":
        why = "first contact" if lock.get("first") is True else "changed since approved"
        return visible(f"held: {why} ({digest}{items} item(s) held)")
    if status == "none":
        return "no lock yet (its catalog was not seen)"
    if status == "off":
        return "off (lock.enabled: false)"
    return visible(f"unreadable: {lock.get('error', status)}")


def jail_lines(jail: Any) -> list[str]:
    """The jail as the gateway runs it, a line each: backend, network and hosts, grants, limits."""
    if not isinstance(jail, dict):
        return []
    backend = jail.get("backend") or f"{jail.get('configured_backend') or 'auto'} (not started yet)"
    lines = [f"backend {backend}", f"network {jail.get('network')}"]
    hosts = _strings(jail.get("allow_hosts"))
    if hosts:
        lines[-1] += f": {', '.join(hosts)}"
    lines += [f"read-only {path}" for path in _strings(jail.get("read_only"))]
    lines += [f"read-write {path}" for path in _strings(jail.get("read_write"))]
    lines.append(f"home {jail.get('home')}, tmp {'yes' if jail.get('tmp') else 'no'}")
    limits = jail.get("limits")
    if isinstance(limits, dict):
        memory = limits.get("memory")
        memory_text = size(memory) if isinstance(memory, int) and not isinstance(memory, bool) else "?"
        lines.append(f"limits: processes {limits.get('processes')}, memory {memory_text}")
    if isinstance(jail.get("limits_enforced"), str):
        lines.append(f"enforced: {jail['limits_enforced']}")
    return [visible(line) for line in lines]


def package_text(package: Any) -> str | None:
    """`pypi x==1.2 (sha256:…)`, or that it is not installed; None for a server without `install:`."""
    if not isinstance(package, dict):
        return None
    if not isinstance(package.get("installed"), str):
        return visible(f"{package.get('package')}: not installed")
    return visible(f"{package['installed']} ({package.get('digest')})")


def _strings(value: Any) -> list[str]:
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []
