"""The audit log: one JSON line per event, budgets for what servers trigger, an HMAC chain, the report."""

__all__: list[str] = []
