"""`cellblock dashboard`: a page on loopback that shows the running gateways and answers their
approvals, through the control sockets the CLI uses (docs/dashboard.md)."""

__all__: list[str] = []
