"""The long-running gateway: the catalog, the call pipeline, approvals, the lock review, the control socket."""

__all__: list[str] = []
