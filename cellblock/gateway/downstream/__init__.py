"""The servers behind the gateway: supervision, local (jailed) and remote connections, credentials."""

__all__: list[str] = []
