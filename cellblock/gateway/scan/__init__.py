"""`cellblock scan`: a server run jailed under a tracer, its tools exercised, its claims checked."""

__all__: list[str] = []
