"""The root of Cellblock's error tree.

    CellblockError
    ├── ConfigError            (gateway.config)   a config file is missing or invalid
    └── DownstreamError        (gateway.downstream) a downstream server failed, named in the message

Each package subclasses `CellblockError` for its own failures; the CLI maps any of them to a
`cellblock:` line on stderr and an exit code.
"""

__all__ = ["CellblockError"]


class CellblockError(Exception):
    """Base of every error Cellblock raises on purpose; the message says what failed and what to do."""
