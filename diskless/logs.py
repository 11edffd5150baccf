"""structlog setup: JSON lines when stderr is not a terminal, readable console output otherwise.

Every event, and every stdlib record (botocore, grpc), passes ``security/redact.py`` first, so
credentials never reach the log."""

from __future__ import annotations

import logging
import sys

import structlog

from diskless.security import redact


def configure_logging(level: str = "INFO") -> None:
    renderer: structlog.typing.Processor
    renderer = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    logging.basicConfig(level=level, stream=sys.stderr, format="%(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(redact.RedactingFilter())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact.processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
