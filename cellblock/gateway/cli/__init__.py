"""The `cellblock` commands, one module per command group."""

__all__: list[str] = []
