"""Built-in demo servers and the demo config used by `cellblock demo`."""

__all__: list[str] = []
