"""No secret in the plugin's log lines: every record of the ``vllm.plancache`` logger is
redacted before any handler sees it.

Why a filter and not care at each call: the plugin logs store URLs, key references and error
details that SDKs wrote (a presigned URL, a SAS ``sig=``, ``pkcs11:…?pin-value=``), from
several modules and threads (the background push); one filter on the one logger they share
covers every line, tracebacks included, with the same :func:`plancache.trust.display.redact`
the CLI uses.
"""

from __future__ import annotations

import logging

from ..trust.display import redact

LOGGER = "vllm.plancache"


class RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


def install() -> None:
    """Idempotent: one filter on the plugin's logger."""
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, RedactFilter) for f in logger.filters):
        logger.addFilter(RedactFilter())
