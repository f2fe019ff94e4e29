"""kiln serve's logs on stderr: one line per event, as text ("kiln serve: ...") or as JSON objects (time, level,
logger, message and the event's fields) for log collectors; with request logging, one line per inference."""

from __future__ import annotations

import json
import logging
import sys
import time

SERVER = "kiln.serve"  # server events; kiln.serve.* modules log under it
REQUESTS = "kiln.serve.requests"  # one INFO record per finished inference, when request logging is on
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the record's fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
               "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
               **getattr(record, "fields", {})}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """`kiln serve: MESSAGE`, as the server has always written it (then the traceback of an exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"kiln serve: {record.getMessage()}"
        return f"{line}\n{self.formatException(record.exc_info)}" if record.exc_info else line


def configure(fmt: str = "text", requests: bool = False, stream=None) -> None:
    """Send the server's records to `stream` (stderr) in `fmt`; `requests`: also one record per inference."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    server = logging.getLogger(SERVER)
    for old in list(server.handlers):
        server.removeHandler(old)
    server.addHandler(handler)
    server.setLevel(logging.INFO)
    server.propagate = False
    logging.getLogger(REQUESTS).setLevel(logging.INFO if requests else logging.WARNING)


def event(message: str, level: int = logging.INFO, **fields) -> None:
    """Log one server event: `message` for people, `fields` for machines (JSON keys)."""
    logging.getLogger(SERVER).log(level, message, extra={"fields": fields})
