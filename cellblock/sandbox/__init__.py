"""OS layer: turns a server's jail settings into a launch plan. No MCP SDK import."""

__all__: list[str] = []
