"""The config file: its model and loading, the policies compiled from it, the starter policies."""

__all__: list[str] = []
