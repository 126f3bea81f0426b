"""`catalog:`: how the client is offered the tools when there are too many to list (docs/search.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from cellblock.gateway.config.base import StrictModel

__all__ = ["CatalogConfig"]


class CatalogConfig(StrictModel):
    # off: every tool is listed; on: the list holds cellblock__find_tools, cellblock__call_tool and
    # the pinned tools, and the rest are found by a request in words; auto: on for a client that
    # takes fewer tools than the catalog has (search/clients.json), or when the list exceeds `budget`
    search: Literal["off", "on", "auto"] = "off"
    # exposed names always listed, whatever search finds
    pinned: list[str] = Field(default_factory=list)
    # how many tools one search answers with, at most
    results: int = Field(default=5, ge=1, le=20)
    # with `auto`: the tokens of the tool list (its JSON's characters / 4) above which any client
    # searches; a tenth of a 200,000-token context
    budget: int = Field(default=20_000, ge=0)

    @field_validator("search", mode="before")
    @classmethod
    def _yaml_boolean(cls, value: Any) -> Any:
        # `search: on` and `search: off` written bare are YAML 1.1 booleans
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
