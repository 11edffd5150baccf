"""Keep credentials out of the logs: a structlog processor and a stdlib logging filter.

Secret values are registered where they are known: ``load_config`` registers the secret
settings (S3 keys, the cluster secret, key passwords), and the environment's credential
variables (``*SECRET*``, ``*PASSWORD*``, ``*ACCESS_KEY*``) are registered at import. Every log
event then has those values replaced by ``[redacted]`` wherever they appear (fields, messages,
rendered exceptions), fields whose names say they hold secrets are replaced whole, and the
``user:password@`` part of URLs is dropped. The filter does the same for stdlib loggers
(botocore, grpc), whose messages bypass structlog.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "[redacted]"
MIN_SECRET_LENGTH = 4  # shorter values would redact ordinary words
_SENSITIVE_FIELD = re.compile(r"secret|password|passwd|access_key|credential|salted", re.IGNORECASE)
_SENSITIVE_ENV = re.compile(r"SECRET|PASSWORD|PASSWD|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def register(values: Iterable[str | None]) -> None:
    global _pattern
    added = {v for v in values if v and len(v) >= MIN_SECRET_LENGTH} - _secrets
    if added:
        _secrets.update(added)
        # Longest first, so a secret containing another is replaced whole.
        _pattern = re.compile("|".join(re.escape(s) for s in sorted(_secrets, key=len, reverse=True)))


def register_environment(environ: Mapping[str, str]) -> None:
    register(value for key, value in environ.items() if _SENSITIVE_ENV.search(key))


def scrub(text: str) -> str:
    if _pattern is not None:
        text = _pattern.sub(REDACTED, text)
    return _URL_USERINFO.sub(REDACTED + "@", text)


def _clean(key: str, value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if _SENSITIVE_FIELD.search(key):
        return REDACTED
    if isinstance(value, str):
        return scrub(value)
    text = str(value)
    cleaned = scrub(text)
    return value if cleaned == text else cleaned


def processor(logger: Any, method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: place it after ``format_exc_info`` so exception text is scrubbed too."""
    return {key: (_clean(key, value) if key != "event" else scrub(str(value))) for key, value in event_dict.items()}


class RedactingFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_text is None:
            record.exc_text = scrub(logging.Formatter().formatException(record.exc_info))
        return True


register_environment(os.environ)
