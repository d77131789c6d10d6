"""Judgements ready before kube-scheduler asks: the extender's background judging (issue 23).

The extender answers ``filter`` and ``prioritize`` with :func:`~.decider.verdicts`, which judges
the request on every distinct node shape among the candidates and keeps each judgement in the
profile's memo, by the shape it was made on. What this module adds is *when* that judging runs:

- **Known requests.** Every request the extender was asked about (its placement key, so a job's
  replicas are one request), the :data:`KNOWN_REQUESTS` most recently asked. kube-scheduler
  sends a job's replicas one after the other and the same workloads again and again, so these
  are the requests the next cycles ask about.
- **Re-judging what changed only.** A placement, a release or new telemetry changes a node's
  shape; its judgements stay with the old shape. In the background, after every change of the
  view's shapes (``ClusterIndex.changes``, polled every :data:`POLL_S`), each known request is
  judged on the shapes it was not judged on yet, and on nothing else (a request already judged on
  the view as it is costs an integer compare).
- **A new request** is judged on every shape the same way, in slices of :data:`SLICE_SHAPES`
  shapes (:data:`BATCH_SLICE_SHAPES` for a profile that judges many at once) that yield to the
  loop between them, so decisions, KV watches and other extender calls run meanwhile. When
  kube-scheduler's call cannot wait for the background (the first cycle of a request never
  seen), the call judges what it needs itself, in slices :data:`REQUEST_SLICES` times larger.

Whatever was judged when, the answer is always ``decider.verdicts`` on the view as it is when the
call answers: the background only fills the memo ``verdicts`` reads, and a judgement is found
there only for the very shape it was made on. The judging itself is the decider's
(:func:`~.decider.unjudged`, :func:`~.decider.judge_shapes`: pure, over the view); this is the
shell that decides when.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Final

import msgspec

from services.placer.core.framework import Profile
from services.placer.core.model import PodRequest
from services.placer.metrics import PlacerMetrics
from services.placer.rules import decider
from services.placer.rules.state import ClusterView

log = logging.getLogger(__name__)

KNOWN_REQUESTS: Final = 64
"""Requests kept ready, the most recently asked about. The background's work is this many
judgements per changed shape (about 100 us each for the ``tessera`` profile on 8 GPUs), so under
heavy shape churn it bounds the CPU the background may want."""
SLICE_SHAPES: Final = 16
"""Shapes judged one at a time between two yields to the loop (about 1.5 ms for FGD's score on
8-GPU shapes)."""
BATCH_SLICE_SHAPES: Final = 256
"""Shapes judged between two yields for a profile that judges many at once
(``core/batch.py``; about 1.5 ms for the ``tessera`` profile on 8-GPU shapes)."""
REQUEST_SLICES: Final = 4
"""A call judges this many slices' shapes between two yields (it waits for them: fewer yields;
a batch of every shape a call needs costs least)."""
POLL_S: Final = 0.05
"""How often the background looks whether the view's shapes changed (an integer compare)."""

Source = Callable[[], tuple[ClusterView, Profile | None]]
"""The view and profile to judge on, as they are now (both change under the service)."""


def request_key(request: PodRequest) -> PodRequest:
    """What identifies a request for judging: the pod without its identity (its namespace stays,
    a tenancy may resolve the tenant from it)."""
    return msgspec.structs.replace(request, uid="", name="")


class ReadyJudgements:
    """The known requests and the background task that keeps them judged (module docstring)."""

    def __init__(
        self,
        source: Source,
        metrics: PlacerMetrics,
        *,
        known: int = KNOWN_REQUESTS,
        slice_shapes: int = SLICE_SHAPES,
        batch_slice_shapes: int = BATCH_SLICE_SHAPES,
        poll_s: float = POLL_S,
    ) -> None:
        self._source = source
        self._metrics = metrics
        self._limit = known
        self._slices = (slice_shapes, batch_slice_shapes)
        self._poll_s = poll_s
        self._known: OrderedDict[PodRequest, _Judged | None] = OrderedDict()
        """Known requests (keys), the most recently asked about last, each with the view it was
        last found judged on every shape of (None: not yet)."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _slice(self, profile: Profile) -> int:
        """Shapes to judge between two yields to the loop with ``profile``."""
        return self._slices[profile.batch is not None]

    @property
    def known(self) -> list[PodRequest]:
        """The known requests, the most recently asked about first."""
        return list(reversed(self._known))

    # --- the request path ----------------------------------------------------------------------

    def note(self, request: PodRequest) -> None:
        """``request`` was asked about: keep it judged from now on."""
        key = request_key(request)
        if key in self._known:
            self._known.move_to_end(key)
            return
        self._known[key] = None
        while len(self._known) > self._limit:
            self._known.popitem(last=False)
        self._wake.set()

    async def ready(self, request: PodRequest, nodes: list[str], *, verb: str) -> None:
        """Make sure ``request`` is judged on the shapes of ``nodes``: counted ``ready`` when it
        already was, else judged here (``judged``) in slices that yield to the loop."""
        self.note(request)
        view, profile = self._source()
        assert profile is not None  # the extender answers only once the cluster is loaded
        missing = decider.unjudged(view, profile, request, nodes)
        self._metrics.extender_judgements.labels(
            verb=verb, source="judged" if missing else "ready"
        ).inc()
        step = REQUEST_SLICES * self._slice(profile)
        for start in range(0, len(missing), step):
            if start:
                await asyncio.sleep(0)
                view, profile = self._source()
                assert profile is not None
            decider.judge_shapes(view, profile, request, missing[start : start + step])

    # --- the background ------------------------------------------------------------------------

    async def catch_up(self) -> int:
        """Judge every known request on every shape it was not judged on yet, in slices that yield
        to the loop (and between requests); how many (request, shape) judgements that took. A
        request already judged on the view as it is now costs an integer compare."""
        judged = 0
        again = True
        while again:  # until a pass over the known requests finds nothing to judge
            again = False
            for key in self.known:
                view, profile = self._source()
                if profile is None or not view.loaded:
                    return judged
                state = _Judged.of(view, profile)
                if key not in self._known or state.same(self._known[key]):
                    continue
                missing = decider.unjudged(view, profile, key)
                step = self._slice(profile)
                for start in range(0, len(missing), step):
                    view, profile = self._source()
                    if profile is None:
                        return judged
                    done = decider.judge_shapes(view, profile, key, missing[start : start + step])
                    judged += done
                    self._metrics.extender_background_judgements.inc(done)
                    await asyncio.sleep(0)
                if key in self._known:
                    self._known[key] = state  # the view as it was before judging began
                again = again or bool(missing)
                await asyncio.sleep(0)
        return judged

    async def run(self) -> None:
        """Catch up after every change of the view's shapes or of the known requests."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.catch_up()
            except Exception:  # a bug here must not stop the extender: it judges on request
                log.exception("background judging failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="extender-ready-judgements")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _Judged:
    """The view a request was last found judged on every shape of: the same index with the same
    change count and the same memo of the same profile have the same shapes and judgements."""

    __slots__ = ("changes", "index", "memos", "profile")

    def __init__(self, index: object, changes: int, profile: object, memos: object) -> None:
        self.index = index
        self.changes = changes
        self.profile = profile
        self.memos = memos

    @classmethod
    def of(cls, view: ClusterView, profile: Profile) -> _Judged:
        index = view.everywhere()
        return cls(index, index.changes, profile, index.memos.get(profile))

    def same(self, other: _Judged | None) -> bool:
        return (
            other is not None
            and self.index is other.index
            and self.changes == other.changes
            and self.profile is other.profile
            and self.memos is other.memos
        )
