"""Log records that say which request they are about, as plain text or as JSON lines.

`LOG_FORMAT=json` turns every record into one JSON object per line (time, level, logger, message,
request_id, and the exception when there is one), which log shippers read without a parser of their
own. The filter is on the handler, so records from every library get the request id too.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

import chatsite.request_context as request_context


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (empty outside a request) to every record the handler formats."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = request_context.request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", ""),
            "process": record.process,
            "thread": record.threadName,
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)
