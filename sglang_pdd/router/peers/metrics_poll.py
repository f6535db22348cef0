"""Reading servers' `/metrics` pages on a timer, for the router's feeds (bandwidth, load)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

logger = logging.getLogger(__name__)


async def poll_forever(session, urls: list[str], interval_s: float, on_page: Callable[[str, str], object],
                       what: str) -> None:
    """Every `interval_s`, `on_page(url, text)` with each server's page; a page that cannot be read
    or parsed is skipped (logged as `what`)."""
    import aiohttp  # the router extra's dependency; only the router process needs it

    while True:
        for url in urls:
            try:
                async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    if r.status == 200:
                        on_page(url, await r.text())
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                logger.debug("%s: %s/metrics: %s", what, url, e)
            except ValueError as e:  # a malformed page (the exposition parser): skipped, the poll goes on
                logger.warning("%s: %s/metrics is not a readable exposition: %s", what, url, e)
        await asyncio.sleep(interval_s)
