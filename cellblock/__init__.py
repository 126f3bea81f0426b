"""Cellblock: one MCP server in front of all your MCP servers."""

__all__ = ["__version__"]

__version__ = "0.1.0"
