"""Sequence batching: a stateful model's requests, grouped by sequence, each sequence on one worker.

TorchServe 0.12 does it for a model whose model-config.yaml says ``sequenceBatching: true`` (frontend:
``wlm/SequenceBatching`` the aggregator, ``job/JobGroup`` a sequence's queue, ``wlm/Model.addJobInGroup``
the admission; ``InferenceRequestHandler`` and ``grpcimpl/InferenceImpl`` the sequence ids). The engine
does the same, in these few rules:

- **Ids.** A request names its sequence in the ``ts_request_sequence_id`` header (gRPC
  ``StreamPredictions2``: the message's ``sequence_id``). A request without one starts a sequence of its
  own: ``ts-seq-`` and a UUID, with ``ts_request_sequence_start: true`` (the handler reads both with
  ``context.get_sequence_id``/``get_request_header``, by those names however the client spelled them). An
  open sequence is kept by a 16-byte digest of its id (``key_of``), so long ids cost no more than short.
- **Bounds.** At most ``maxNumSequence`` sequences open (default 1; the engine also at most
  ``MAX_SEQUENCES``), each with at most
  ``maxSequenceJobQueueSize`` requests waiting; past either, TorchServe's 503 (``no_worker_message``).
- **One worker.** A new sequence goes to the model's worker holding the fewest (of those up: not a
  restarting one); it stays there (its handler keeps its state), through that worker's restarts. A sequence
  whose worker was scaled away is taken by the next worker free. A worker's batch takes the next request of
  each of its sequences, at most one a sequence (its requests run in order, one batch after the other), up
  to ``batchSize`` within ``maxBatchDelay``.
- **Expiry.** A sequence with nothing waiting expires ``sequenceMaxIdleMSec`` after its last answer, and
  at ``sequenceTimeoutMSec`` after it opened (0: never); a request naming it afterwards opens it again.
- **End.** ``ts_request_sequence_end: true`` closes it once that request is answered (TorchServe 0.12's
  SequenceBatching passes the header to the handler and keeps the sequence until it expires; its
  SequenceContinuousBatching closes it so: the engine frees the slot at once, docs/engines.md). An end
  request whose client left before a worker took it is not run, and so ends nothing: the sequence expires.
- **An always-busy sequence.** ``sequenceTimeoutMSec`` ends a sequence only when nothing of it waits: one
  whose clients keep a request queued goes on, as on TorchServe (``SequenceBatching``'s poll of a group
  past its expiry still takes a job already there).
"""

import asyncio
import collections
import hashlib
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional

from .job_queue import Job, notify_all, wait_within

Worker = Any  # workers' (which imports this module)

# TorchServe's header names (ConfigManager.DEFAULT_REQUEST_SEQUENCE_*)
SEQUENCE_ID, SEQUENCE_START, SEQUENCE_END = (
    "ts_request_sequence_id",
    "ts_request_sequence_start",
    "ts_request_sequence_end",
)
MAX_SEQUENCES = 65_536  # open sequences of one model version, whatever maxNumSequence says (docs/limits.md)


class SequenceConfigError(ValueError):
    """sequenceBatching asked with settings TorchServe cannot serve."""


@dataclass(frozen=True)
class SequenceSettings:
    """A model's sequence batching, as TorchServe's Model reads it from model-config.yaml."""

    max_idle_ms: int  # sequenceMaxIdleMSec
    timeout_ms: int  # sequenceTimeoutMSec (0: none)
    max_sequences: int  # maxNumSequence in force
    queue_size: int  # maxSequenceJobQueueSize

    @classmethod
    def of(cls, config: dict, where: str) -> Optional["SequenceSettings"]:
        """The settings in force, or None when the model does not ask for sequence batching. TorchServe's
        defaults and lower bounds (ModelConfig's setters); its Model takes the greater of ``maxNumSequence``
        and batchSize x maxWorkers, but reads those two before they are set, as 0: ``maxNumSequence`` as
        written, 1 when absent. TorchServe 0.12 with ``sequenceBatching: true`` and no
        ``sequenceMaxIdleMSec`` answers every request 503 (it never makes the sequences' table): refused
        here, naming the key."""
        if config.get("sequenceBatching") is not True:
            return None
        idle = config.get("sequenceMaxIdleMSec") or 0
        if idle <= 0:
            raise SequenceConfigError(
                f"{where}: sequenceBatching is true but sequenceMaxIdleMSec is {idle}: TorchServe 0.12 then "
                "answers every request 503; give sequenceMaxIdleMSec, the milliseconds a sequence may stay idle"
            )
        return cls(
            max_idle_ms=idle,
            timeout_ms=max(0, config.get("sequenceTimeoutMSec") or 0),
            max_sequences=min(MAX_SEQUENCES, max(1, config.get("maxNumSequence") or 1)),
            queue_size=max(1, config.get("maxSequenceJobQueueSize") or 1),
        )

    def described(self) -> dict:
        """Describe's fields for them (ApiUtils.createModelResponse)."""
        return {
            "stateful": True,
            "sequenceMaxIdleMSec": self.max_idle_ms,
            "sequenceTimeoutMSec": self.timeout_ms,
            "maxNumSequence": self.max_sequences,
            "maxSequenceJobQueueSize": self.queue_size,
        }


def refuse_stateful(config: dict, where: str, server: str):
    """A server that has no sequence ids to give (MLServer's V2 requests, a Seldon unit's) refuses a stateful
    archive at load, in one line naming the key and the fix."""
    if config.get("sequenceBatching") is True:
        raise SequenceConfigError(
            f"{where}: sequenceBatching is true: {server} gives its requests no sequence id, so a stateful "
            "handler's state would mix clients; serve it on TorchServe or the tsctl engine (tsctl serve), or "
            "set sequenceBatching: false"
        )


def sequence_headers(headers: Dict[str, str]) -> str:
    """The request's sequence id (a header of any case); without one a new id, with the start header set,
    as TorchServe's frontend sets them (``headers`` changed in place). The id and the end header, however
    the client spelled them, reach the handler under TorchServe's names too: its context reads them by
    those exact names (ts/context.py ``get_sequence_id``), so ``TS_REQUEST_SEQUENCE_ID`` made every such
    sequence ``None`` to the handler, their states one (TorchServe 0.12's Netty finds the header in any
    case and passes it as spelled: the same mix there)."""
    sequence_id = next((value for name, value in headers.items() if name.lower() == SEQUENCE_ID and value), "")
    if not sequence_id:
        sequence_id = f"ts-seq-{uuid.uuid4()}"
        headers[SEQUENCE_START] = "true"
    headers[SEQUENCE_ID] = sequence_id
    if ends(headers):
        headers[SEQUENCE_END] = "true"
    return sequence_id


def key_of(sequence_id: str) -> bytes:
    """An open sequence's key: 16 bytes however long its id (an HTTP head may be 64 KiB, a gRPC message
    more), so that open sequences hold memory by their count alone (MAX_SEQUENCES of 60 KiB ids: 3.8 GiB)."""
    return hashlib.blake2b(sequence_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def ends(headers: Dict[str, str]) -> bool:
    return any(name.lower() == SEQUENCE_END and str(value).strip().lower() == "true" for name, value in headers.items())


class Sequence:
    """One open sequence: its waiting requests, its worker, whether one of its requests is in a batch."""

    __slots__ = ("id", "jobs", "worker", "busy", "last", "deadline", "ending")

    def __init__(self, key: bytes, worker: Optional[Worker], timeout_ms: int):
        self.id, self.worker, self.busy, self.ending = key, worker, False, False
        self.jobs: Deque[Job] = collections.deque()
        self.last = time.monotonic()
        self.deadline = self.last + timeout_ms / 1000 if timeout_ms else None

    def waiting(self) -> bool:
        while self.jobs and self.jobs[0].done.done():  # clients that left
            self.jobs.popleft()
        return bool(self.jobs)


class Sequences:
    """A model version's open sequences (``admit``), and each worker's next batch of them (``batch``)."""

    def __init__(self, settings: SequenceSettings, workers: Callable[[], List[Worker]]):
        self.settings, self.workers = settings, workers
        self.open: Dict[bytes, Sequence] = {}  # by key_of(the sequence id)
        self.changed = asyncio.Condition()

    def __len__(self):
        return len(self.open)

    async def admit(self, job: Job) -> bool:
        """Queue ``job`` on its sequence (opened when new); False past the bounds."""
        self.expire()
        key = key_of(sequence_headers(job.request.headers))
        sequence = self.open.get(key)
        if sequence is None:
            if len(self.open) >= self.settings.max_sequences:
                return False
            sequence = self.open[key] = Sequence(key, self.least_held(), self.settings.timeout_ms)
        sequence.waiting()
        if len(sequence.jobs) >= self.settings.queue_size:
            return False
        sequence.jobs.append(job)
        job.sequence = sequence
        await self.notify()
        return True

    def least_held(self) -> Optional[Worker]:
        """The worker a new sequence goes to: of those up (a restarting one only when all are), the one
        holding the fewest sequences (TorchServe: the worker that polls for it, so never a restarting one)."""
        workers = self.workers()
        if not workers:
            return None
        held = collections.Counter(s.worker for s in self.open.values())
        return min(workers, key=lambda w: (w.status == "STARTING", held[w], w.index))

    def expire(self):
        """Close the sequences idle past sequenceMaxIdleMSec, or past sequenceTimeoutMSec, with nothing waiting."""
        now, idle = time.monotonic(), self.settings.max_idle_ms / 1000
        for sequence in list(self.open.values()):
            if sequence.busy or sequence.waiting():
                continue
            if now - sequence.last >= idle or (sequence.deadline is not None and now >= sequence.deadline):
                del self.open[sequence.id]

    def _takes(self, worker: Worker, sequence: Sequence) -> bool:
        if sequence.busy or not sequence.waiting():
            return False
        return sequence.worker is worker or sequence.worker not in self.workers()  # its own, or one left behind

    def _ready(self, worker: Worker) -> bool:
        return any(self._takes(worker, s) for s in self.open.values())

    def _take(self, worker: Worker, count: int) -> List[Job]:
        taken = []
        for sequence in self.open.values():
            if len(taken) >= count:
                break
            if self._takes(worker, sequence):
                sequence.worker, sequence.busy = worker, True
                taken.append(sequence.jobs.popleft())
        return taken

    async def batch(self, worker: Worker, size: int, delay: float) -> List[Job]:
        """Up to ``size`` requests for ``worker``, one a sequence: the first to come, and those arriving
        within ``delay`` s of it."""
        loop = asyncio.get_running_loop()
        taken: List[Job] = []
        try:
            async with self.changed:
                await self.changed.wait_for(lambda: self._ready(worker))
                taken = self._take(worker, size)
                deadline = loop.time() + delay
                while len(taken) < size:
                    more = self._take(worker, size - len(taken))
                    if more:
                        taken.extend(more)
                        continue
                    wait = deadline - loop.time()
                    if wait <= 0 or not await wait_within(self.changed, lambda: self._ready(worker), wait):
                        break
        except asyncio.CancelledError:
            self.restore(taken)  # nothing taken is lost
            asyncio.ensure_future(self.notify())
            raise
        return taken

    def restore(self, jobs: List[Job]):
        for job in reversed(jobs):
            job.sequence.jobs.appendleft(job)
            job.sequence.busy = False

    async def notify(self):
        await notify_all(self.changed)

    async def put_back(self, jobs: List[Job]):
        """Jobs taken but never sent (their worker stopped): first in their sequences again."""
        self.restore(jobs)
        await self.notify()

    async def answered(self, jobs: List[Job]):
        """A batch answered: its sequences take their next request; an ended one is closed."""
        now = time.monotonic()
        for job in jobs:
            sequence = job.sequence
            sequence.busy, sequence.last = False, now
            sequence.ending = sequence.ending or ends(job.request.headers)
            if sequence.ending and not sequence.waiting() and self.open.get(sequence.id) is sequence:
                del self.open[sequence.id]
        await self.notify()

    def drop_all(self) -> List[Job]:
        """Every waiting request (the model is stopping), the sequences closed."""
        jobs = [job for sequence in self.open.values() for job in sequence.jobs]
        self.open.clear()
        return jobs
