"""A model version's requests waiting for a worker: each a ``Job`` (its answer to come, or its streamed
answer's parts), in one bounded ``JobQueue`` in arrival order, from which a worker takes its next batch
(a stateful model's wait in their sequences instead: sequences.py)."""

import asyncio
import collections
import time
from typing import Any, Callable, Deque, List, Optional

from ..worker.ts_wire import RequestInput, Response
from .streams import Parts


class Job:
    """One request in a model's queue: ``done`` resolves with its answer, or with the first part of a
    streamed answer, whose ``rest`` (``parts``) brings the others (streams.py)."""

    __slots__ = ("request", "done", "arrived", "parts", "sequence")

    def __init__(self, request: RequestInput, done: asyncio.Future):
        self.request, self.done, self.arrived = request, done, time.perf_counter()
        self.parts: Optional[Parts] = None
        self.sequence: Any = None  # a stateful model's: the sequence it belongs to

    def part(self, response: Response, on_end: Callable[[], None]):
        """A part of a streamed answer that more parts follow (on the event loop, as the worker sends it)."""
        if self.parts is None:
            if self.done.done():
                return  # the client left before the first part: the rest is dropped
            self.parts = Parts(on_end)
            response.rest = self.parts
            if response.error:  # a first part above max_response_size: the answer ends with it
                self.parts.end()
            self.done.set_result(response)
        else:
            self.parts.put(response)

    def answer(self, response: Response):
        """The request's answer, or the last part of its streamed answer."""
        if self.parts is not None:
            self.parts.put(response, last=True)
        elif not self.done.done():
            self.done.set_result(response)


async def wait_within(changed: asyncio.Condition, ready: Callable[[], bool], seconds: float) -> bool:
    """``changed.wait_for(ready)`` (its lock held) for at most ``seconds``: whether ``ready()`` then. Not
    ``asyncio.wait_for``: before Python 3.12 it returns the inner wait's result when a cancellation meets
    it done (a request came in the same turn as the worker died or was scaled away), so a batch gathered
    for a worker that had gone was returned to no one, its requests never answered and a stateful model's
    sequences held busy for ever."""
    over = False

    def wake():
        nonlocal over
        over = True
        asyncio.ensure_future(notify_all(changed))

    timer = asyncio.get_running_loop().call_later(max(0.0, seconds), wake)
    try:
        await changed.wait_for(lambda: over or ready())
    finally:
        timer.cancel()
    return ready()


async def notify_all(changed: asyncio.Condition):
    async with changed:
        changed.notify_all()


class JobQueue:
    """Requests waiting for a worker, in arrival order; ``batch`` gathers the next batch. A request whose
    client left (its future done) is not counted, and makes room for the next."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self.items: Deque[Job] = collections.deque()
        self.changed = asyncio.Condition()

    def __len__(self):
        return sum(1 for job in self.items if not job.done.done())

    async def put(self, job: Job) -> bool:
        if len(self.items) >= self.limit:  # the clients that left first make room
            waiting = [queued for queued in self.items if not queued.done.done()]
            self.items.clear()
            self.items.extend(waiting)
        if len(self.items) >= self.limit:
            return False
        self.items.append(job)
        async with self.changed:
            self.changed.notify()
        return True

    async def put_back(self, jobs: List[Job]):
        self.items.extendleft(reversed(jobs))
        async with self.changed:
            self.changed.notify(len(jobs))

    def take_now(self, count: int) -> List[Job]:
        """Up to ``count`` jobs waiting now, without waiting (a continuous batch's newcomers)."""
        taken: List[Job] = []
        while self.items and len(taken) < count:
            job = self.items.popleft()
            if not job.done.done():
                taken.append(job)
        return taken

    async def batch(self, size: int, delay: float) -> List[Job]:
        """Up to ``size`` jobs: the first to come, and those arriving within ``delay`` s of it."""
        taken: List[Job] = []
        try:
            async with self.changed:
                await self.changed.wait_for(lambda: self.items)
                taken.append(self.items.popleft())
                deadline = asyncio.get_running_loop().time() + delay
                while len(taken) < size:
                    if self.items:
                        taken.append(self.items.popleft())
                        continue
                    wait = deadline - asyncio.get_running_loop().time()
                    if wait <= 0 or not await wait_within(self.changed, lambda: bool(self.items), wait):
                        break
        except asyncio.CancelledError:
            self.items.extendleft(reversed(taken))  # nothing taken is lost
            raise
        return [job for job in taken if not job.done.done()]  # clients that gave up are skipped
