"""Tool search's ranking: the tools a client may call, ranked for a request in words (docs/search.md).
Plain code and its data (`words.json`); the gateway's face of it is serve/search.py."""

__all__: list[str] = []
