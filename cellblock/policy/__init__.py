"""Pure policy layer: no MCP SDK, no OS access beyond its own state files."""

from cellblock.policy.errors import CellblockError

__all__ = ["CellblockError"]
