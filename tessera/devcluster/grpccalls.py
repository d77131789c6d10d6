"""A simulated kubelet's gRPC calls to its plugins, failing as the kubelet's Go client fails.

grpc.aio cancels the calls in flight on a channel that is closed, and the caller's ``await``
raises :class:`asyncio.CancelledError`. The kubelet closes a plugin's channel when the plugin
deregisters or registers again (a restarted plugin), which can happen while a pod worker waits
on an Allocate or a NodePrepareResources to it. That is the call's failure, not the worker's
cancellation: Go's client answers it as ``code = Canceled desc = grpc: the client connection is
closing``, and the kubelet tries the pod again. Left as a CancelledError it would end the node's
pod worker, and no pod on the node would start again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Final, TypeVar

import grpc

T = TypeVar("T")

CLOSING: Final = "grpc: the client connection is closing"


async def answer(call: Awaitable[T]) -> T:
    """The answer to ``call``; :class:`grpc.aio.AioRpcError` ``CANCELLED`` when its channel was
    closed under it. The awaiting task's own cancellation still propagates."""
    try:
        return await call
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.CANCELLED,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details=CLOSING,
        ) from None
