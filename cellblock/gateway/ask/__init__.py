"""Asking the user: the forms a question takes, and how it reaches the client or the CLI."""

__all__: list[str] = []
