"""The gateway: the one MCP server a client runs. The only package that imports the MCP SDK.

Its folders, in the direction of their imports: `wire/` (bytes and framing), `config/`,
`audit/`, `downstream/` (the servers behind it), `serve/` (the long-running process), `clients/`
(other tools' config files) and `cli/` (the commands). docs/architecture.md walks through them."""

__all__: list[str] = []
