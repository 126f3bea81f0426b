"""The texts `cellblock wrap` writes: the client's file starting only Cellblock, its backup with
each secret replaced by its keyring reference, and cellblock.yaml with the servers added (comments
and every existing line kept)."""

from __future__ import annotations

import re

import yaml

from cellblock.gateway.clients.blocks import ServersBlock, render_block, replace_span
from cellblock.gateway.clients.entry import ENTRY_KEY, WrapError
from cellblock.gateway.clients.kinds import entry_dict
from cellblock.gateway.clients.literals import replace_in_literals
from cellblock.gateway.clients.placeholders import placeholder
from cellblock.gateway.clients.plan import Moved, Plan

__all__ = ["backup_text", "client_text", "new_config_text", "yaml_entry"]


def client_text(plan: Plan, blocks: list[ServersBlock]) -> str:
    command, args = plan.command
    text = plan.text
    # later blocks first, so earlier spans stay where they are
    for block in sorted(blocks, key=lambda b: b.start, reverse=True):
        if not block.entries:
            continue
        replacement = render_block(plan.kind, block, text, {ENTRY_KEY: entry_dict(plan.kind, command, args)})
        text = replace_span(text, block.start, block.end, replacement)
    return text


def backup_text(plan: Plan, blocks: list[ServersBlock]) -> str:
    """The original file, with every secret value in its servers replaced by its keyring reference."""
    text = plan.text
    for block in sorted(blocks, key=lambda b: b.start, reverse=True):
        secrets = {
            secret.value: placeholder(secret.entry)
            for moved in plan.moved
            if moved.block is block
            for secret in moved.starter.secrets
        }
        redacted = replace_in_literals(text[block.start : block.end], secrets, toml=plan.kind == "codex")
        text = replace_span(text, block.start, block.end, redacted)
    return text


def new_config_text(plan: Plan, budget: int) -> str:
    added = [m for m in plan.moved if not m.reused]
    entries = "".join(yaml_entry(m, plan) for m in added)
    if plan.config_text is None:
        head = (
            "# Cellblock's config: the servers behind the one client entry. See docs/config.md.\n"
            f"# Written by `cellblock wrap {plan.path}`.\n"
            "version: 1\n"
            f"names: {{max_length: {budget}}}\n"
            # a server whose catalog is known is listed from it and started on its first call
            "defaults: {start: lazy}\n"
            "servers:\n"
        )
        return head + entries
    return _insert_servers(plan.config_text, entries)


def yaml_entry(moved: Moved, plan: Plan) -> str:
    body = yaml.safe_dump({moved.starter.name: moved.starter.config}, sort_keys=False, default_flow_style=False)
    lines = [f"  # '{moved.entry.name}' from {plan.path} ({plan.kind})\n"]
    lines += [f"  # note: {note}\n" for note in moved.starter.notes]
    lines += [f"  {line}\n" if line else "\n" for line in body.splitlines()]
    return "".join(lines)


def _insert_servers(text: str, entries: str) -> str:
    """`entries` (indented two spaces) appended to the `servers:` mapping of an existing config,
    at that mapping's own indentation; every existing line is kept.

    Raises:
        WrapError: `servers:` is written inline (`servers: {a: …}`), where nothing can be appended.
    """
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    start = next((i for i, line in enumerate(lines) if re.match(r"servers\s*:", line)), None)
    if start is None:
        return "".join(lines) + "servers:\n" + entries
    value = lines[start].split("#", 1)[0].split(":", 1)[1].strip()
    if value == "{}":
        lines[start] = "servers:" + (" #" + lines[start].split("#", 1)[1] if "#" in lines[start] else "\n")
    elif value:
        raise WrapError("servers: in the existing cellblock.yaml is written inline; make it a block mapping first")
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
        end += 1
    # keep trailing blank lines and column-0 comments with whatever follows the block
    while end - 1 > start and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1
    body = [line for line in lines[start + 1 : end] if line.strip() and not line.lstrip().startswith("#")]
    indent = re.match(r"[ ]*", body[0]).group(0) if body else "  "  # type: ignore[union-attr]
    if indent != "  ":
        entries = "".join(indent + line[2:] if line.startswith("  ") else line for line in entries.splitlines(True))
    return "".join([*lines[:end], entries, *lines[end:]])
