"""Structured logs: one JSON object per line, with trajectory and batch ids when known.

    log.info("finished", extra={"trajectory_id": tid, "batch_id": bid, "state": "completed"})

`ROLLOUT_LOG_FORMAT=text` switches to plain lines for a human at a terminal.
"""

from __future__ import annotations

import json
import logging
import os
import time

# Attributes every LogRecord has; anything else came in through `extra=`.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(process: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    if os.environ.get("ROLLOUT_LOG_FORMAT", "json") == "text":
        handler.setFormatter(logging.Formatter(f"%(asctime)s {process} %(levelname)s %(name)s %(message)s"))
    else:
        handler.setFormatter(JsonFormatter())
        logging.Formatter.converter = time.gmtime
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
