"""`cellblock install` and `update`: the command line of gateway/downstream/packages.py, and the
version `update` writes back into the config where it pinned the old one.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cellblock.gateway.config.loading import load_config, parse_config
from cellblock.gateway.config.model import ConfigError, LocalServer
from cellblock.gateway.downstream.packages import InstallError, Record, install, read_record
from cellblock.gateway.state import atomic_write_text
from cellblock.sandbox.installer import Package
from cellblock.sandbox.types import JailError

__all__ = ["install_command", "update_command"]


def install_command(names: list[str], all_servers: bool, config_path: str | None) -> int:
    """`cellblock install SERVER… | --all`. Returns the exit code."""
    config, _ = load_config(config_path)
    with_install = [n for n, s in config.servers.items() if isinstance(s, LocalServer) and s.install is not None]
    if all_servers:
        names = with_install
        if not names:
            print("cellblock: no server in the config has install:; nothing to do", file=sys.stderr)
            return 0
    failed = 0
    for name in names:
        server = config.servers.get(name)
        if name not in with_install or not isinstance(server, LocalServer):
            print(f"cellblock: '{name}' is not a server with install: in the config", file=sys.stderr)
            return 2
        try:
            install(name, server, config.install_limits_of(name))
        except (InstallError, JailError) as exc:
            print(f"cellblock: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def update_command(name: str, to: str | None, config_path: str | None) -> int:
    """`cellblock update SERVER [--to VERSION]`: install another version (by default the newest);
    a version the config pins is changed there too. Returns the exit code."""
    config, source = load_config(config_path)
    server = config.servers.get(name)
    if not isinstance(server, LocalServer) or server.install is None:
        print(f"cellblock: '{name}' is not a server with install: in the config", file=sys.stderr)
        return 2
    before = read_record(name)
    pinned = server.install.package
    source = source.resolve()  # a config kept as a link (dotfiles) is changed where it lives
    if pinned.version is not None and source.read_text(encoding="utf-8").count(pinned.spec()) != 1:
        print(
            f"cellblock: {source} pins {pinned.spec()} for '{name}' where update cannot change it alone (not "
            "once, as written); change the version there by hand, then run `cellblock install "
            f"{name}`",
            file=sys.stderr,
        )
        return 1
    try:
        record = install(name, server, config.install_limits_of(name), version=to, newest=to is None)
    except (InstallError, JailError) as exc:
        print(f"cellblock: {exc}", file=sys.stderr)
        return 1
    if pinned.version is not None and pinned.version != record.version:
        _repin(source, name, pinned, record)
    was = f"from {before.version} " if before is not None else ""
    print(
        f"cellblock: '{name}' moved {was}to {record.version}; if its catalog changed, the lock holds it "
        f"at the next start (`cellblock review`)",
        file=sys.stderr,
    )
    return 0


def _repin(source: Path, name: str, pinned: Package, record: Record) -> None:
    """Write the newly installed version into the config, where it pinned the old one."""
    text = source.read_text(encoding="utf-8")
    old, new = pinned.spec(), pinned.spec(record.version)
    if text.count(old) != 1:
        raise ConfigError(
            f"{source}: {record.package.spec()} is installed, but {old} appears {text.count(old)} times in the "
            f"config; set servers.{name}.install to {new} by hand (until then '{name}' does not start)"
        )
    changed = text.replace(old, new)
    config = parse_config(changed, str(source))
    server = config.servers[name]
    if (
        not isinstance(server, LocalServer)
        or server.install is None
        or server.install.package.version != record.version
    ):
        raise ConfigError(f"{source}: could not change servers.{name}.install to {new}; set it by hand")
    atomic_write_text(source, changed, source.stat().st_mode & 0o777)
