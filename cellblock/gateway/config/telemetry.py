"""`telemetry:`: where spans and counters of what the audit records are sent (docs/audit.md#telemetry)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import field_validator

from cellblock.gateway.config.base import StrictModel

__all__ = ["TelemetryConfig"]


class TelemetryConfig(StrictModel):
    # the OpenTelemetry collector's OTLP/HTTP address (its /v1/traces and /v1/metrics are sent to)
    otlp: str
    service_name: str = "cellblock"

    @field_validator("otlp")
    @classmethod
    def _address(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.username or parts.password:
            raise ValueError("telemetry.otlp must hold no user or password: a secret never goes in the config")
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(
                f"telemetry.otlp must be the http(s) address of a collector, like http://127.0.0.1:4318, not {value!r}"
            )
        return value.rstrip("/")
