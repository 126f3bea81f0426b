"""Other tools' MCP config files (Claude Desktop, Cursor, ...) and `cellblock wrap`. No MCP SDK import."""

__all__: list[str] = []
