"""Ending one request with an error, never the server."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def end_queued(req: Any, message: str, status_code: int) -> None:
    """End a request a decode scheduler queued a moment ago, as sglang's own per-request errors do (its
    prealloc queue streams the error and frees what the request holds)."""
    from sglang.srt.disaggregation.utils import prepare_abort

    logger.warning("request %s refused: %s", req.rid, message)
    req.to_finish = None
    prepare_abort(req, message, status_code=status_code)
