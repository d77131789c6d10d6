"""Waiting in tests: poll a condition (sync or async) until it holds, on the test's event loop;
run work in the background until a condition holds."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    condition: Callable[[], Awaitable[T]],
    *,
    timeout: float = ...,
    what: str | Callable[[], str] = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    condition: Callable[[], T],
    *,
    timeout: float = ...,
    what: str | Callable[[], str] = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    condition: Callable[[], Any],
    *,
    timeout: float = 20.0,
    what: str | Callable[[], str] = "",
    interval: float = 0.02,
) -> T:
    """Poll ``condition`` every ``interval`` seconds until it returns something truthy (awaited
    when it is a coroutine function) and return that; fail naming ``what`` (or what it returns
    then, when it is a function) and the last value after ``timeout`` seconds (a loaded machine
    gets time, a broken one an explanation)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value: Any = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[no-any-return]  # T, or what T's awaitable gave
        if loop.time() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {described or condition}; "
                f"last: {value!r}"
            )
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running(
    work: Coroutine[Any, Any, object], *, until: Callable[[], object], what: str
) -> AsyncIterator[None]:
    """``work`` as a task from entry, once ``until`` holds (:func:`eventually`, naming ``what``),
    to exit, when it is cancelled and awaited."""
    task = asyncio.create_task(work)
    try:
        await eventually(until, what=what)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
