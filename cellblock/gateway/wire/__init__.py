"""Bytes and framing: pipes, JSON-RPC lines, the client's wire, the answers sent before the SDK loads. No policy."""

__all__: list[str] = []
