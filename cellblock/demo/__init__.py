"""Built-in demo servers and the demo config used by `cellblock demo`."""
