"""The root of Cellblock's error tree.

    CellblockError
    ├── ConfigError        (gateway.config.base)            a config file is missing or invalid
    │   └── ConfigEditError (gateway.config.edit)           the config cannot be changed in place
    ├── DownstreamError    (gateway.downstream.rounds)      a downstream server failed; the message names it
    ├── ControlError       (gateway.serve.control)          no gateway at a control socket, or a bad answer
    ├── JailError          (sandbox.types)                  a jail cannot be built; the server does not start
    │   └── InstallError   (gateway.downstream.packages)    a server's package is not installed as asked
    ├── LockError          (policy.lock)                    a lock or pending file cannot be read or written
    ├── CatalogError       (policy.lock)                    a server's catalog cannot be locked
    ├── CredentialError    (gateway.credentials)            a credential is missing, or no safe keyring
    │   ├── LoginNeeded    (gateway.downstream.oauth)       an OAuth server needs `cellblock auth login`
    │   └── DiscoveryRefused (gateway.downstream.discovery) an OAuth URL the gateway will not fetch or open
    ├── RuntimeDirError    (gateway.state)                  no private directory for state or sockets
    ├── AuditUnwritten     (gateway.audit.log)              an event could not be written to the audit log
    ├── ClientConfigError  (gateway.clients.kinds)          a client's MCP config cannot be read (also a ValueError)
    ├── PlaceholderError   (gateway.clients.placeholders)   a secret reference cannot be resolved; nothing written
    ├── WrapError          (gateway.clients.entry)          wrap/unwrap cannot go ahead; nothing was changed
    └── ScanError          (gateway.scan.scratch)           a scan cannot be run as asked
        └── NotGrantable   (gateway.scan.gate)              an entry no proposal may add to a jail

Each package subclasses `CellblockError` for its own failures; the CLI maps any of them to a
`cellblock:` line on stderr and an exit code. `tests/test_error_tree.py` holds this tree to the
code's.
"""

__all__ = ["CellblockError"]


class CellblockError(Exception):
    """Base of every error Cellblock raises on purpose; the message says what failed and what to do."""
