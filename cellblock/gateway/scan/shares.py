"""The gate a running gateway's shares pass (`serve/shares.py`): the rules of `gate.py` for a path
shared with a server, and `scan --apply`'s writer for one shared always.

The same two things judge a path a call asks to share and a path a scan proposes: `check_path`
(never the home or above, a secret, Cellblock's own, a socket; made writable, never a hidden or a
program folder), and `apply_proposal`, which writes the server's `jail:` alone into the config
file atomically, after loading the edited file back and judging what it adds again.
"""

from __future__ import annotations

import copy
from pathlib import Path

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import ConfigError, LocalServer
from cellblock.gateway.state import StateWriteError, locked, state_dir
from cellblock.policy.pathargs import covered

# The scan's gate and config writer are imported when a call first names a path to share, not
# when the gateway starts: most gateways never share one, and every module stays in memory.

__all__ = ["ShareGate"]


class ShareGate:
    """`serve.shares.Gate` for the config file at `source` (None: no file, nothing is kept)."""

    def __init__(self, source: Path | None) -> None:
        self._source = source

    def check(self, path: str, write: bool, writable: list[str]) -> str | None:
        from cellblock.gateway.scan.gate import NotGrantable, check_path

        try:
            check_path(path, [self._source] if self._source else [], write=write, writable=writable)
        except NotGrantable as exc:
            return str(exc)
        return None

    def keep(self, server: str, path: str, write: bool) -> bool:
        """Write the grant into the config; False when the config shares `path` so already.

        Raises:
            StateWriteError: it was not written (no config, no such jailed server, the gate
                refuses it, or the file could not be changed), and why.
        """
        from cellblock.gateway.scan.proposal import Proposal, apply_proposal, configured, tidy, writable
        from cellblock.gateway.scan.scratch import ScanError

        if self._source is None:
            raise StateWriteError("the gateway was started without a config file to write the grant into")
        source = self._source.resolve()  # a linked config (dotfiles) is written where it leads, stays a link
        with locked(state_dir() / "config-edit"):  # the lock `allow-host` and a gateway's "always" take
            try:
                config = parse_config(source.read_text(), str(source))
            except (OSError, ConfigError) as exc:
                raise StateWriteError(f"{source} could not be read again to add the grant: {exc}") from exc
            entry = config.servers.get(server)
            if entry is None:
                names = ", ".join(config.servers) or "none"
                raise StateWriteError(f"there is no server '{server}' in {source} (its servers: {names})")
            if not isinstance(entry, LocalServer):
                raise StateWriteError(f"'{server}' is a remote server in {source}: no jail of ours, no path to share")
            if entry.jail is False:
                raise StateWriteError(f"server '{server}' has jail: false in {source}: it sees every path already")
            if covered(path, entry.jail.read_only, entry.jail.read_write, write):
                return False
            why = self.check(path, write, [p for p in writable(config) if p != path])
            if why is not None:
                raise StateWriteError(f"{path} may not be shared with '{server}': {why}")
            key = "read_write" if write else "read_only"
            current = configured(entry.jail)
            proposed = copy.deepcopy(current)
            proposed[key].append(path)
            proposal = Proposal(tidy(current), tidy(proposed), config=source, writable=writable(config))
            if path not in proposal.proposed.get(key, []):
                raise StateWriteError(f"{path} was not written into {source}: {'; '.join(proposal.notes)}")
            try:
                apply_proposal(source, server, proposal, entry)
            except ScanError as exc:
                raise StateWriteError(str(exc)) from exc
        return True
