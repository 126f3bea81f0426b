"""What `cellblock wrap` says: the plan it is about to carry out (or, with `--dry-run`, would),
`wrap --list`'s known client configs and whether each is wrapped, and its lines on stderr."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

from cellblock.gateway.clients.blocks import read_blocks
from cellblock.gateway.clients.entry import ENTRY_KEY, is_cellblock_entry
from cellblock.gateway.clients.kinds import entry_dict, known_locations
from cellblock.gateway.clients.plan import Plan
from cellblock.gateway.clients.rewrite import yaml_entry

__all__ = ["list_clients", "print_plan", "say"]


def print_plan(plan: Plan, out: TextIO, dry_run: bool) -> None:
    verb = "would" if dry_run else "will"
    print(f"# {plan.path} ({plan.kind}) {verb} start only:", file=out)
    command, args = plan.command
    print(json.dumps({ENTRY_KEY: entry_dict(plan.kind, command, args)}, indent=2), file=out)
    added = [m for m in plan.moved if not m.reused]
    print(f"\n# {verb} be added to {plan.config_path}:", file=out)
    print("servers:", file=out)
    print("".join(yaml_entry(m, plan) for m in added).rstrip(), file=out)
    for moved in plan.moved:
        if moved.reused:
            print(f"# '{moved.entry.name}' is already in {plan.config_path} as '{moved.starter.name}'", file=out)
    if plan.secrets:
        print(f"\n# secrets that {verb} move to the keyring (values not shown):", file=out)
        for server, secret in plan.secrets:
            print(f"#   {server}: {secret.kind} {secret.key} -> keyring entry '{secret.entry}'", file=out)
    for note in plan.notes:
        print(f"# note: {note}", file=out)


def list_clients(home: Path, cwd: Path, out: TextIO | None = None) -> int:
    """The known client configs on this machine and whether each is wrapped."""
    out = out or sys.stdout
    found = 0
    for kind, path in known_locations(home, cwd):
        if not path.is_file():
            continue
        found += 1
        try:
            blocks = read_blocks(kind, path.read_text(encoding="utf-8"))
            entries = [e for b in blocks for e in b.entries]
            if entries and all(is_cellblock_entry(e) for e in entries):
                state = "wrapped"
            elif any(is_cellblock_entry(e) for e in entries):
                state = f"partly wrapped ({len(entries) - 1} other servers)"
            else:
                state = f"{len(entries)} server(s), not wrapped"
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            state = f"unreadable: {str(exc).splitlines()[0]}"
        print(f"{kind}\t{state}\t{path}", file=out)
    if not found:
        say("no known MCP client config found here")
    return 0


def say(text: str) -> None:
    print(f"cellblock: {text}", file=sys.stderr)
