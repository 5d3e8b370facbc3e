"""One way to show an exception in a row, a log line or a message."""

from __future__ import annotations

from maskray.operators.keys import redact_uri_credentials


def one_line(exc: BaseException, *, with_type: bool = True, limit: int = 200) -> str:
    """An exception as one short line (client libraries put newlines and JSON in messages), with
    any credentials in a URI redacted (rows and messages are records too)."""
    text = redact_uri_credentials(" ".join(str(exc).split()))[:limit]
    if not text:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}" if with_type else text
