"""The audit log: one JSON object per line, appended and flushed per event, file mode 0600.

This version records server lifecycle and egress decisions; tool calls, policy decisions and
lock events join it with the policy layer.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["Audit"]

logger = logging.getLogger(__name__)


class Audit:
    """Appends events to a JSONL file; a failed write is logged, never raised into the caller."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)

    def write(self, event: str, server: str, **fields: Any) -> None:
        record = {"ts": round(time.time(), 3), "event": event, "server": server, **fields}
        try:
            # line-buffered: each event reaches the file as one write, no fsync on the hot path
            self._file.write(json.dumps(record, separators=(",", ":"), default=str) + "\n")
        except (OSError, ValueError) as exc:
            logger.error("audit: could not write %s event for '%s': %s", event, server, exc)

    def close(self) -> None:
        self._file.close()
