"""What `cellblock wrap` would do to a client's file and cellblock.yaml (`Plan`), each server it
moves (`Moved`): computed without changing anything (`clients/wrap.py: plan_wrap`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cellblock.gateway.clients.backups import beside, kept
from cellblock.gateway.clients.blocks import ClientEntry, ServersBlock
from cellblock.gateway.clients.entry import gateway_command, project_command
from cellblock.gateway.config.draft import Secret, Starter
from cellblock.gateway.config.loading import parse_config

__all__ = ["Moved", "Plan"]


@dataclass
class Moved:
    """One client entry on its way into cellblock.yaml."""

    block: ServersBlock
    entry: ClientEntry
    starter: Starter
    reused: bool = False  # cellblock.yaml already has this very server under this name


@dataclass
class Plan:
    """Everything wrap would do to PATH and cellblock.yaml, computed without changing anything."""

    path: Path
    kind: str
    text: str
    config_path: Path
    config_text: str | None  # the current cellblock.yaml, None when there is none
    moved: list[Moved] = field(default_factory=list)
    wrapped: bool = False  # PATH already starts only Cellblock
    project: bool = False  # PATH is a project's file, which others clone (backups.is_project_file)
    new_text: str = ""
    backup_text: str = ""
    new_config_text: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def secrets(self) -> list[tuple[str, Secret]]:
        """What wrap stores in the keyring: new servers' secrets, and what unwrap needs of reused ones."""
        return [(m.starter.name, s) for m in self.moved for s in m.starter.secrets if not m.reused or s.kind == "stash"]

    @property
    def checks(self) -> list[tuple[str, Secret]]:
        """Secrets of reused servers, which the keyring must already hold with the same value."""
        return [(m.starter.name, s) for m in self.moved if m.reused for s in m.starter.secrets if s.kind != "stash"]

    @property
    def command(self) -> tuple[str, list[str]]:
        """What the client's one entry starts."""
        return project_command(self.config_path) if self.project else gateway_command(self.config_path)

    @property
    def backups(self) -> list[Path]:
        """Where wrap keeps the original: always under Cellblock's state directory; beside a user's own file too."""
        return [kept(self.path)] if self.project else [beside(self.path), kept(self.path)]

    @property
    def allow_insecure(self) -> bool:
        if self.config_text is None:
            return False
        return parse_config(self.config_text, str(self.config_path)).credentials.allow_insecure
