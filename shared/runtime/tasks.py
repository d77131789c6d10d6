"""Small asyncio helpers the service shells share: cancelling, owning and finishing tasks.

A service's stop must reach every task the service started, whatever library code the task sits
in. On Python 3.11 one cancel is not always enough: ``asyncio.wait_for`` returns the result when
the cancel lands as the awaited thing finishes (nats-py waits that way in ``next_msg``, requests
and flushes), and an ``asyncio.TaskGroup`` passes its parent's cancel to each child only once. So
the lifecycle runs a service's body in a context that marks it the owner of every task created
under it (:func:`owned_context`, recorded by :class:`TaskOwners`), and during a stop it cancels
again each owned task that was asked to stop but runs on (:meth:`TaskOwners.lost_cancels`).

Cleanup that must run to its end during that stop (write the queued Events, give the Lease back,
close an HTTP client after its last use) goes through :func:`finish`: it is not re-cancelled, and
the cancel that interrupted its caller is raised once it is done. Each cleanup bounds itself.
Loops that run until cancelled call :func:`checkpoint` each turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

_OWNER: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "tessera_task_owner", default=None
)

TaskFactory = Any
"""asyncio's task factory: ``(loop, coro, **kwargs) -> Future`` (typeshed has no name for it)."""


class ChangeCounter:
    """A version number tasks wait on to move (several waiters, no lost wake-ups): a mirror
    bumps it on each change it takes; a waiter notes the version, looks, and waits past it."""

    def __init__(self) -> None:
        self.version = 0
        self._condition = asyncio.Condition()

    async def bump(self) -> None:
        async with self._condition:
            self.version += 1
            self._condition.notify_all()

    async def wait_past(self, version: int, timeout: float | None = None) -> bool:
        """True once the version moved past ``version``; False when ``timeout`` ran out."""
        async with self._condition:
            try:
                async with asyncio.timeout(timeout):  # never loses a cancellation (wait_for can)
                    await self._condition.wait_for(lambda: self.version != version)
            except TimeoutError:
                return False
        return True


def checkpoint() -> None:
    """Raise CancelledError if this task was asked to stop, even where a library swallowed the
    cancel (the request stays recorded: ``Task.cancelling()``). Loops that run until cancelled
    call it each turn, so one lost cancel does not keep them running until the lifecycle's next
    one (or forever, where one cancel is all there is: a TaskGroup's, a test's)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def checkpointer() -> Callable[[], None]:
    """:func:`checkpoint` for a loop that stays in the task it started in, with that task looked
    up once (``asyncio.current_task`` is Python code in 3.11: a loop over every delivery of a
    watch paid for it on each)."""
    task = asyncio.current_task()

    def check() -> None:
        if task is not None and task.cancelling():
            raise asyncio.CancelledError

    return check


async def cancel_and_wait(future: asyncio.Future[Any]) -> None:
    """Cancel ``future`` and wait until it has finished, whatever it ends with.

    Unlike ``with suppress(BaseException): await future``, a cancellation of the *calling* task
    that arrives meanwhile is not swallowed: it still stops the caller (a stop must not be lost).
    """
    future.cancel()
    await asyncio.wait({future})
    if not future.cancelled():
        future.exception()  # retrieved: it finished another way before the cancel landed


def owned_context(owner: object) -> contextvars.Context:
    """A copy of the current context in which every task created is ``owner``'s."""
    context = contextvars.copy_context()
    context.run(_OWNER.set, owner)
    return context


class TaskOwners:
    """An event loop's task factory that also remembers which owner created each task.

    Installed once per loop (:meth:`of`), around whatever factory the loop had: a test's event
    loop may run several services, each the owner of its own tasks.
    """

    def __init__(self, previous: TaskFactory | None) -> None:
        self._previous = previous
        self._owner_of: weakref.WeakKeyDictionary[asyncio.Future[Any], object] = (
            weakref.WeakKeyDictionary()
        )

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> TaskOwners:
        """The loop's owner registry, installed as its task factory on first use."""
        factory = loop.get_task_factory()
        if isinstance(factory, cls):
            return factory
        owners = cls(factory)
        loop.set_task_factory(owners)
        return owners

    def __call__(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
        **kwargs: Any,
    ) -> asyncio.Future[Any]:
        if self._previous is not None:
            task: asyncio.Future[Any] = self._previous(loop, coro, **kwargs)
        else:
            task = asyncio.Task(coro, loop=loop, **kwargs)
        owner = _OWNER.get()
        if owner is not None:
            self._owner_of[task] = owner
        return task

    def lost_cancels(self, owner: object) -> list[asyncio.Task[Any]]:
        """``owner``'s tasks that were asked to cancel and still run: each lost its cancel."""
        return [
            task
            for task, owned_by in list(self._owner_of.items())
            if owned_by is owner
            and isinstance(task, asyncio.Task)
            and not task.done()
            and task.cancelling()
        ]


async def finish(cleanup: Coroutine[Any, Any, T]) -> T:
    """Run ``cleanup`` to its end even when the caller is cancelled meanwhile (any number of
    times), then raise that cancellation; the cleanup's own result or error otherwise.

    Unlike ``asyncio.shield``, the caller does not return before the cleanup is done (a client
    closed after this call is no longer in use), and the cleanup's tasks belong to no service, so
    a stop does not cancel them again. The cleanup must bound itself (``asyncio.timeout``).
    """
    context = contextvars.copy_context()
    context.run(_OWNER.set, None)
    task = asyncio.get_running_loop().create_task(cleanup, context=context)
    interrupted = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error  # a failed cleanup is a bug: say so rather than hide it in the cancel
        raise asyncio.CancelledError
    return task.result()
