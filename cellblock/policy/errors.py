"""The root of Cellblock's error tree.

    CellblockError
    ├── ConfigError        (gateway.config)      a config file is missing or invalid
    ├── DownstreamError    (gateway.downstream)  a downstream server failed; the message names it
    ├── ControlError       (gateway.control)     no gateway at a control socket, or a bad answer
    ├── JailError          (sandbox.types)       a jail cannot be built; the server does not start
    ├── LockError          (policy.lock)         a lock or pending file cannot be read or written
    ├── CatalogError       (policy.lock)         a server's catalog cannot be locked
    ├── CredentialError    (gateway.credentials) a credential is missing, or no safe keyring
    │   └── LoginNeeded    (gateway.oauth)       an OAuth server needs `cellblock auth login`
    ├── ClientConfigError  (gateway.clients)     a client's MCP config cannot be read (also a ValueError)
    └── WrapError          (gateway.wrap)        wrap/unwrap cannot go ahead; nothing was changed

Each package subclasses `CellblockError` for its own failures; the CLI maps any of them to a
`cellblock:` line on stderr and an exit code.
"""

__all__ = ["CellblockError"]


class CellblockError(Exception):
    """Base of every error Cellblock raises on purpose; the message says what failed and what to do."""
