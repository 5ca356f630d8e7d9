"""The one concurrency helper behind fetch, upload and delete: bounded, and failure-isolated."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..trust.errors import PlanCacheError
from .deadline import store_error

T = TypeVar("T")


async def each(
    keys: Sequence[str],
    action: Callable[[str], Awaitable[T]],
    what: str,
    limit: int,
    on_done: Callable[[int], None] | None,
    results: dict[str, T | PlanCacheError],
) -> None:
    """``action`` on every key, at most ``limit`` at once; each key's result or typed error.

    Actions retry on their own (:func:`~plancache.storage.deadline.with_retries`); a key's
    failure never stops the others. ``results`` fills in as keys finish, so a caller cancelled
    at its deadline still has the ones that did.
    """
    gate = asyncio.Semaphore(limit)

    async def one(key: str) -> None:
        async with gate:
            try:
                results[key] = await action(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                results[key] = store_error(f"cannot {what} {key}", exc)
        if on_done:
            on_done(1)

    await asyncio.gather(*(one(k) for k in keys))
